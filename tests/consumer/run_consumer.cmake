# Builds and runs one consumer project (cmake -P script, run by the ctest tests
# consumer_find_package and consumer_add_subdirectory; see tests/CMakeLists.txt).
#   MODE          find_package | add_subdirectory
#   SOURCE_DIR    root of the selfattn repository
#   CONSUMER_DIR  the consumer project (tests/consumer/<MODE>)
#   WORK_DIR      scratch directory, wiped first
#   GENERATOR, CXX_COMPILER, Eigen3_DIR   taken from the parent build
foreach(var MODE SOURCE_DIR CONSUMER_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

# Run a command; stop with its output on failure.
function(run)
  string(JOIN " " shown ${ARGN})
  message(STATUS "> ${shown}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${shown}")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(common -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
           -DCMAKE_BUILD_TYPE=Release "-DEigen3_DIR=${Eigen3_DIR}"
           -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)  # find only what we installed
set(consumer_args "")

if(MODE STREQUAL "find_package")
  # A real install of a fresh top-level build (nothing but the library) into a scratch prefix.
  set(prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/selfattn" ${common}
      -DSELFATTN_BUILD_TESTS=OFF -DSELFATTN_BUILD_EXAMPLES=OFF
      -DSELFATTN_BUILD_BENCHMARKS=OFF -DSELFATTN_INSTALL=ON)
  run("${CMAKE_COMMAND}" --build "${WORK_DIR}/selfattn" --config Release)
  run("${CMAKE_COMMAND}" --install "${WORK_DIR}/selfattn" --prefix "${prefix}" --config Release)
  list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${prefix}")
elseif(MODE STREQUAL "add_subdirectory")
  list(APPEND consumer_args "-DSELFATTN_SOURCE_DIR=${SOURCE_DIR}")
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

set(build "${WORK_DIR}/consumer")
run("${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${build}" ${common} ${consumer_args})

# The package must come from our prefix, not from some selfattn already on the machine.
if(MODE STREQUAL "find_package")
  file(STRINGS "${build}/CMakeCache.txt" found REGEX "^selfattn_DIR:")
  string(FIND "${found}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "selfattn was not found in ${prefix}: ${found}")
  endif()
endif()

# As a subproject, selfattn must not have built its tests, examples or benchmarks.
if(MODE STREQUAL "add_subdirectory" AND EXISTS "${build}/selfattn_build/tests")
  message(FATAL_ERROR "selfattn configured its tests although it is not the top-level project")
endif()

run("${CMAKE_COMMAND}" --build "${build}" --config Release)
set(program "${build}/consumer")
if(EXISTS "${build}/Release/consumer")  # multi-config generators add a directory
  set(program "${build}/Release/consumer")
endif()
run("${program}")
message(STATUS "consumer_${MODE}: ok")
