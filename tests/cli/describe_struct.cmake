# examples/describe FILE prints a config struct that compiles and binds the file. For a
# synthetic tiny_traits file (every trait at once: qwen2, q/k/v biases, llama3 RoPE
# scaling, an untied output) and the real SmolLM2-135M file, the printed headers are
# built into tests/describe_probe.cpp, which binds each file to its struct and checks the
# struct against the config the file was made from.
#   cmake -DSYNTH=synth_model -DDESCRIBE=describe -DPROBE=describe_probe -DBUILD=dir -DMODEL=smollm2.gguf
#         -DDIR=BUILD/describe-test -P describe_struct.cmake
file(MAKE_DIRECTORY ${DIR})
set(traits_file ${DIR}/tiny_traits.gguf)
if(NOT EXISTS ${traits_file})
  execute_process(COMMAND ${SYNTH} --config tiny_traits --out ${traits_file} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "synth_model failed for tiny_traits (exit status ${rc})")
  endif()
endif()
foreach(pair "described_traits|${traits_file}" "described_smollm2|${MODEL}")
  string(REPLACE "|" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 model)
  execute_process(COMMAND ${DESCRIBE} --name ${name} ${model} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message("--- describe --name ${name} ${model} (exit ${rc})\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "describe failed on ${model}")
  endif()
  # Rewritten only when changed, so the probe is rebuilt only then.
  file(WRITE ${DIR}/${name}.hpp.new "${out}")
  file(COPY_FILE ${DIR}/${name}.hpp.new ${DIR}/${name}.hpp ONLY_IF_DIFFERENT)
endforeach()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD} --target describe_probe RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the printed structs do not compile into describe_probe:\n${out}")
endif()
execute_process(COMMAND ${PROBE} ${traits_file} ${MODEL} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "describe_probe failed (exit status ${rc})")
endif()
if(NOT out MATCHES "described_traits binds .*equals tiny_traits in every field and trait\n.*described_smollm2 binds .*equals smollm2_135m in every field and trait\n")
  message(FATAL_ERROR "describe_probe's output does not say both structs bind and equal their configs")
endif()
