# The files the tests of the config chosen from a file run on (once): a synthetic
# qwen25_0_5b at its real shape with Qwen2's vocabulary (a shipped config of another
# family than SmolLM2), and a synthetic tiny_llama3, which no shipped config fits.
#   cmake -DSYNTH=synth_model -DDIR=dir -DQWEN2_VOCAB=ggml-vocab-qwen2.gguf -P autoconfig_files.cmake
file(MAKE_DIRECTORY ${DIR})
foreach(config qwen25_0_5b tiny_llama3)
  if(EXISTS ${DIR}/${config}.gguf)
    continue()
  endif()
  set(args --config ${config} --out ${DIR}/${config}.gguf)
  if(config STREQUAL "qwen25_0_5b")
    list(APPEND args --tokenizer-from ${QWEN2_VOCAB})
  endif()
  execute_process(COMMAND ${SYNTH} ${args} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "synth_model failed for ${config} (exit status ${rc})")
  endif()
endforeach()
