# Installs tlm from the build tree into a scratch prefix, then configures, builds
# and runs the consumer project against it with find_package(tlm CONFIG).
set(prefix ${BINARY}/consumer-install)
set(build ${BINARY}/consumer-build)
file(REMOVE_RECURSE ${prefix} ${build})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${BINARY} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${SOURCE}/tests/consumer -B ${build} -G ${GENERATOR} -DCMAKE_CXX_COMPILER=${CXX}
    -DCMAKE_PREFIX_PATH=${prefix})
run(${CMAKE_COMMAND} --build ${build})
run(${build}/consumer)
