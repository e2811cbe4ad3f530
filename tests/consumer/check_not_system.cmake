# ctest own_headers_not_system (tests/consumer/CMakeLists.txt): fails when the selfattn target of the top-level
# build marks an include directory SYSTEM, which would hide our headers' warnings from our own -Werror builds.
#   cmake -DSYSTEM_DIRS=<INTERFACE_SYSTEM_INCLUDE_DIRECTORIES of selfattn> -P check_not_system.cmake
if(NOT "${SYSTEM_DIRS}" STREQUAL "")
  message(FATAL_ERROR "the top-level selfattn target has SYSTEM include directories (${SYSTEM_DIRS}): our own "
                      "tests would no longer see the warnings of our headers")
endif()
message(STATUS "the top-level selfattn target has no SYSTEM include directory: ok")
