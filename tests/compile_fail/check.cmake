# Runs one compile-failure case (cmake -P; one ctest test per tests/compile_fail/*.cpp, see CMakeLists.txt).
#   COMPILER   the C++ compiler of the build
#   SOURCE     the case: its line "// expect: <regex>" is what the compiler must say
#   INCLUDES   ;-list of include directories (ours, Eigen's)
#   CONTROLS   ON: SOURCE is the generated file of every case's corrected program, which must compile warning-free
# The case, as written, must fail to compile with the message.
foreach(var COMPILER SOURCE INCLUDES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check.cmake: -D${var}=... is required")
  endif()
endforeach()

set(flags -std=c++17 -fsyntax-only -Wall -Wextra -Wpedantic -Werror)
foreach(dir IN LISTS INCLUDES)
  list(APPEND flags "-isystem" "${dir}")  # Eigen's warnings are not ours; ours are checked by the other tests
endforeach()
list(GET INCLUDES 0 ours)
list(PREPEND flags "-I${ours}")
# The kernels are declared instantiated elsewhere, so that the corrected programs do not instantiate them (7 -> 2 CPU
# seconds a compile); the static_asserts under test sit in the thin public templates, which every case still compiles.
list(APPEND flags -include selfattn/extern_templates.hpp)

if(CONTROLS)
  execute_process(COMMAND "${COMPILER}" ${flags} "${SOURCE}" RESULT_VARIABLE result OUTPUT_VARIABLE output
                  ERROR_VARIABLE output)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "a corrected program (SELFATTN_COMPILE_FAIL_CONTROL) does not compile:\n${output}")
  endif()
  message(STATUS "every corrected program compiles (${SOURCE})")
  return()
endif()

file(STRINGS "${SOURCE}" expect_line REGEX "^// expect: ")
if(NOT expect_line)
  message(FATAL_ERROR "${SOURCE}: no '// expect: <regex>' line")
endif()
string(REGEX REPLACE "^// expect: " "" expect "${expect_line}")

execute_process(COMMAND "${COMPILER}" ${flags} "${SOURCE}"
                RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
if(result EQUAL 0)
  message(FATAL_ERROR "compiled, but must fail with: ${expect}")
endif()
if(NOT output MATCHES "${expect}")
  message(FATAL_ERROR "failed to compile, but without the expected message '${expect}':\n${output}")
endif()
string(REGEX MATCH "[^\n]*${expect}[^\n]*" said "${output}")
message(STATUS "refused as expected: ${said}")
