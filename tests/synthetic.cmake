# Writes a random-weight GGUF of CONFIG's shape (once), then binds it to that
# config type and generates a few tokens with it.
if(NOT EXISTS ${OUT})
  execute_process(COMMAND ${SYNTH} --config ${CONFIG} --out ${OUT} --tokenizer-from ${TOKENIZER} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "synth_model failed for ${CONFIG}")
  endif()
endif()
execute_process(COMMAND ${GENERATE} --model ${OUT} --config ${CONFIG} --token-ids 504,3575,282 -n 4 --show-config --timing
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "generate failed on the synthetic ${CONFIG} file (exit status ${rc})")
endif()
# Judged here, with the exit status (a PASS_REGULAR_EXPRESSION on the test would ignore it).
if(NOT "${out}${err}" MATCHES "${EXPECT}")
  message(FATAL_ERROR "generate's output on the synthetic ${CONFIG} file does not match '${EXPECT}'")
endif()
