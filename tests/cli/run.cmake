# Runs one command-line check and judges all of its outcome, not only its text
# (CTest's PASS_REGULAR_EXPRESSION alone would ignore the exit status):
#   cmake "-DCOMMAND=prog|arg|..." -DEXIT=N [-DSTDOUT=REGEX] [-DSTDERR=REGEX]
#         [-DSTDOUT_EMPTY=ON] [-DSTDERR_EMPTY=ON] -P run.cmake
# EXIT is the exact exit status wanted. An error path must exit non-zero, say what
# was wrong on stderr (STDERR), and print nothing on stdout (STDOUT_EMPTY); a
# success must exit 0 with its output on stdout.
string(REPLACE "|" ";" command "${COMMAND}")
foreach(stream STDOUT STDERR)
  if(DEFINED ${stream})
    string(REPLACE "@SEMICOLON@" ";" ${stream} "${${stream}}")
  endif()
endforeach()
execute_process(COMMAND ${command} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(shown "exit status: ${rc}\n--- stdout:\n${out}\n--- stderr:\n${err}")
set(problems "")
if(NOT rc STREQUAL "${EXIT}")
  string(APPEND problems "  exit status ${rc}, wanted ${EXIT}\n")
endif()
if(DEFINED STDOUT AND NOT out MATCHES "${STDOUT}")
  string(APPEND problems "  stdout does not match '${STDOUT}'\n")
endif()
if(DEFINED STDERR AND NOT err MATCHES "${STDERR}")
  string(APPEND problems "  stderr does not match '${STDERR}'\n")
endif()
if(STDOUT_EMPTY AND NOT out STREQUAL "")
  string(APPEND problems "  stdout should be empty on this error path\n")
endif()
if(STDERR_EMPTY AND NOT err STREQUAL "")
  string(APPEND problems "  stderr should be empty\n")
endif()
if(NOT problems STREQUAL "")
  message(FATAL_ERROR "cli check failed:\n${problems}${shown}")
endif()
message(STATUS "cli check passed (exit ${rc})")
