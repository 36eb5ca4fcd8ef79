# ctest script: installs this build into a scratch prefix, then configures, builds and runs a
# consumer project that finds it with find_package(rdzv) alone; with GLOO_EXAMPLE_DIR (set when
# Gloo is installed), also builds the Gloo example on its own against the installed rdzv, which
# needs the installed rdzv/gloo.hpp.
# Inputs: BUILD_DIR, CONSUMER_DIR, WORK_DIR, CXX, optional GLOO_EXAMPLE_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
run("${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${WORK_DIR}/build"
    "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX}")
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/rdzv_consumer")
if(NOT last_output MATCHES "consumer ok")
  message(FATAL_ERROR "unexpected consumer output: ${last_output}")
endif()
message(STATUS "${last_output}")

if(GLOO_EXAMPLE_DIR)
  run("${CMAKE_COMMAND}" -S "${GLOO_EXAMPLE_DIR}" -B "${WORK_DIR}/gloo"
      "-DCMAKE_PREFIX_PATH=${prefix}" "-DCMAKE_CXX_COMPILER=${CXX}")
  run("${CMAKE_COMMAND}" --build "${WORK_DIR}/gloo" --target rdzv_gloo_allreduce)
  message(STATUS "the Gloo example builds against the installed rdzv")
endif()
