# Judges one law. Invoked by ctest as
#   cmake -DKIND=pass|fail|selfcheck -DSOURCE=file.cpp -DCXX=compiler "-DFLAGS=a|b|c" -P run_law.cmake
# A fail-case (and a self-check) passes only when all of these hold:
#   1. it has exactly one `// law-expect: REGEX` line and exactly one
#      `#ifdef TLM_LAW_TWIN` block with one line in each branch, and no other line
#      names TLM_LAW_TWIN (so the twin differs from the case in that one line and
#      nothing else);
#   2. the case does not compile;
#   3. the compiler's own diagnostic lines (`file:line:col: error:`/`note:`,
#      `required from`/`required for`/`In instantiation of`) match REGEX: it fails for its named
#      reason. Echoed source lines are not searched, so a comment that names the
#      rule on a line that fails for another reason does not count;
#   4. the twin (-DTLM_LAW_TWIN) compiles.
# Each rejection starts with a one-word verdict in brackets ([malformed], [case-compiles],
# [wrong-reason], [twin-broken]); the self-checks name the verdict they expect.
string(REPLACE "|" ";" flags "${FLAGS}")

function(compile out_var rc_var)
  execute_process(COMMAND ${CXX} ${flags} ${ARGN} ${SOURCE}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_var} "${out}${err}" PARENT_SCOPE)
  set(${rc_var} ${rc} PARENT_SCOPE)
endfunction()

if(KIND STREQUAL "pass")
  compile(output rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "law broken: ${SOURCE} must compile, but the compiler said:\n${output}")
  endif()
  message(STATUS "law holds: ${SOURCE} compiles")
  return()
endif()

# Read the source line by line without letting CMake's list syntax (';' and
# brackets, both common in regexes and C++) split or join lines.
file(READ ${SOURCE} content)
string(REPLACE ";" "<tlm-semicolon>" content "${content}")
string(REPLACE "[" "<tlm-open>" content "${content}")
string(REPLACE "]" "<tlm-close>" content "${content}")
string(REPLACE "\n" ";" lines "${content}")
set(expect "")
set(expect_count 0)
set(state outside)
set(twin_lines 0)
set(case_lines 0)
set(blocks 0)
set(twin_mentions 0)
foreach(line IN LISTS lines)
  if(line MATCHES "TLM_LAW_TWIN")
    math(EXPR twin_mentions "${twin_mentions} + 1")
  endif()
  if(line MATCHES "^// law-expect: (.+)$")
    set(expect "${CMAKE_MATCH_1}")
    string(REPLACE "<tlm-semicolon>" ";" expect "${expect}")
    string(REPLACE "<tlm-open>" "[" expect "${expect}")
    string(REPLACE "<tlm-close>" "]" expect "${expect}")
    math(EXPR expect_count "${expect_count} + 1")
  endif()
  string(STRIP "${line}" stripped)
  if(stripped STREQUAL "#ifdef TLM_LAW_TWIN")
    set(state twin)
    math(EXPR blocks "${blocks} + 1")
  elseif(stripped STREQUAL "#else" AND state STREQUAL "twin")
    set(state case)
  elseif(stripped STREQUAL "#endif" AND state STREQUAL "case")
    set(state outside)
  elseif(state STREQUAL "twin")
    math(EXPR twin_lines "${twin_lines} + 1")
  elseif(state STREQUAL "case")
    math(EXPR case_lines "${case_lines} + 1")
  endif()
endforeach()
if(NOT expect_count EQUAL 1)
  message(FATAL_ERROR "[malformed] malformed law: ${SOURCE} needs exactly one '// law-expect: REGEX' line (found ${expect_count})")
endif()
if(NOT twin_mentions EQUAL 1)
  message(FATAL_ERROR "[malformed] malformed law: ${SOURCE} names TLM_LAW_TWIN on ${twin_mentions} lines; only its one "
                      "'#ifdef TLM_LAW_TWIN' line may (a second #ifdef/#ifndef/#if block would let the twin differ "
                      "from the case by more than one line)")
endif()
if(NOT blocks EQUAL 1 OR NOT twin_lines EQUAL 1 OR NOT case_lines EQUAL 1)
  message(FATAL_ERROR "[malformed] malformed law: ${SOURCE} needs one '#ifdef TLM_LAW_TWIN' / '#else' / '#endif' block "
                      "with exactly one line in each branch (found ${blocks} blocks, ${twin_lines} twin and "
                      "${case_lines} case lines)")
endif()

compile(output rc)
if(rc EQUAL 0)
  message(FATAL_ERROR "[case-compiles] law broken: ${SOURCE} compiled, but it must be rejected (expected a diagnostic matching '${expect}')")
endif()
# Keep only the compiler's own diagnostic lines. GCC echoes the offending source line
# ("   12 |   code  // comment") and marks it ("      |   ^~~"); those start with blanks,
# while its diagnostics start with the file name.
string(REPLACE ";" "<tlm-semicolon>" diag_text "${output}")
string(REPLACE "\n" ";" out_lines "${diag_text}")
set(diagnostics "")
foreach(line IN LISTS out_lines)
  # `file:line:col: error:`/`note:`, `file:line:col:   required from here`/`required for the
  # satisfaction of ...`/`in requirements ...`, and `file: In instantiation/substitution of ...`.
  if(line MATCHES "^[^ \t|][^|]*:[0-9]+:[0-9]+: +(fatal error: |error: |note: |required |in requirements )"
     OR line MATCHES "^[^ \t|][^|]*: In (instantiation|substitution) of ")
    string(APPEND diagnostics "${line}\n")
  endif()
endforeach()
string(REPLACE "<tlm-semicolon>" ";" diagnostics "${diagnostics}")
if(NOT diagnostics MATCHES "${expect}")
  message(FATAL_ERROR "[wrong-reason] law broken: ${SOURCE} was rejected, but not for its named reason: no error:/note:/"
                      "required-from line of the compiler matches '${expect}'. The compiler said:\n${output}")
endif()
compile(twin_output twin_rc -DTLM_LAW_TWIN)
if(NOT twin_rc EQUAL 0)
  message(FATAL_ERROR "[twin-broken] law broken: the twin of ${SOURCE} (-DTLM_LAW_TWIN) must compile, so that the case fails "
                      "only for its offending line. The compiler said:\n${twin_output}")
endif()
string(REGEX MATCH "${expect}" matched "${diagnostics}")
message(STATUS "law holds: ${SOURCE} is rejected ('${matched}') and its twin compiles")
