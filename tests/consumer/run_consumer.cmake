# Builds and runs one consumer project (cmake -P script, run by the ctest tests consumer_<MODE>; see
# tests/consumer/CMakeLists.txt). Each project is copied to WORK_DIR/src, where the snippets it includes are
# written, extracted from README.md and docs/using_in_projects.md (cmake/extract_readme_example.cmake), so that
# what the documentation shows is what gets built.
#   MODE          find_package | add_subdirectory | fetch_content | install_export: a consumer project
#                 pkg_config | version_compatibility: checks of the package that consumer_find_package installed
#   SOURCE_DIR    root of the selfattn repository
#   CONSUMER_DIR  the consumer project (tests/consumer/<MODE>)
#   WORK_DIR      scratch directory, wiped first
#   PREFIX        (pkg_config, version_compatibility) the prefix consumer_find_package installed into
#   PKG_CONFIG    (pkg_config) the pkg-config program; empty: the test reports itself skipped
#   GENERATOR, CXX_COMPILER, Eigen3_DIR   taken from the parent build
cmake_minimum_required(VERSION 3.20)
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

# The version, from the header CMakeLists.txt reads it from.
file(STRINGS "${SOURCE_DIR}/include/selfattn/version.hpp" version_lines
     REGEX "^#define SELFATTN_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+$")
foreach(line IN LISTS version_lines)
  if(line MATCHES "^#define SELFATTN_VERSION_(MAJOR|MINOR|PATCH) +([0-9]+)$")
    set(version_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endif()
endforeach()
set(version "${version_MAJOR}.${version_MINOR}.${version_PATCH}")

file(REMOVE_RECURSE "${WORK_DIR}")
set(src "${WORK_DIR}/src")
file(COPY "${CONSUMER_DIR}/" DESTINATION "${src}")

# extract(<file under SOURCE_DIR> <marker> <destination under src>)
function(extract markdown marker destination)
  run("${CMAKE_COMMAND}" "-DREADME=${SOURCE_DIR}/${markdown}" "-DMARKER=${marker}" "-DOUTPUT=${src}/${destination}"
      -P "${SOURCE_DIR}/cmake/extract_readme_example.cmake")
endfunction()

# The consumer project links the repository in as third_party/selfattn, where the snippets look for it.
function(vendor_selfattn)
  file(MAKE_DIRECTORY "${src}/third_party")
  file(CREATE_LINK "${SOURCE_DIR}" "${src}/third_party/selfattn" SYMBOLIC RESULT result)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "cannot link ${src}/third_party/selfattn to ${SOURCE_DIR}: ${result}")
  endif()
endfunction()

# The compile command of main.cpp must pass our include directory as -isystem, never as -I (SYSTEM for subprojects).
function(check_system_include build)
  file(READ "${build}/compile_commands.json" commands)
  string(REGEX MATCH "\"command\": \"[^\"]*main\\.cpp[^\"]*\"" command "${commands}")
  if(command STREQUAL "")
    message(FATAL_ERROR "no compile command of main.cpp in ${build}/compile_commands.json")
  endif()
  file(REAL_PATH "${SOURCE_DIR}/include" ours)
  set(as_system FALSE)
  string(REGEX MATCHALL "(-isystem |-I)[^ \"]+" flags "${command}")
  foreach(flag IN LISTS flags)
    string(REGEX REPLACE "^(-isystem |-I)" "" dir "${flag}")
    file(REAL_PATH "${dir}" dir)
    if(dir STREQUAL ours)
      if(flag MATCHES "^-I")
        message(FATAL_ERROR "selfattn's include directory reaches the subproject user as ${flag}, not -isystem")
      endif()
      set(as_system TRUE)
    endif()
  endforeach()
  if(NOT as_system)
    message(FATAL_ERROR "selfattn's include directory ${ours} is not in the compile command: ${command}")
  endif()
  message(STATUS "selfattn's headers reach main.cpp as -isystem")
endfunction()

# Release, as users build, but without optimisation (CMAKE_CXX_FLAGS_RELEASE holds only -DNDEBUG): these projects
# check how the package is found, included, linked and installed, and what their programs print; optimising the
# kernels they instantiate took minutes of CI for nothing they check.
set(common -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}"
           -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG "-DEigen3_DIR=${Eigen3_DIR}"
           -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)  # find only what we installed

# --- Checks of the installed package (after consumer_find_package, a ctest fixture) ---
if(MODE STREQUAL "version_compatibility")
  # While the major version is 0 the package accepts requests of its own minor version only (SameMinorVersion).
  math(EXPR next_minor "${version_MINOR} + 1")
  math(EXPR next_major "${version_MAJOR} + 1")
  set(accepted "${version_MAJOR}.${version_MINOR}" "${version}")
  set(refused "${version_MAJOR}.${next_minor}" "${next_major}.0")
  if(version_MINOR GREATER 0)
    math(EXPR previous_minor "${version_MINOR} - 1")
    if(version_MAJOR EQUAL 0)
      list(APPEND refused "0.${previous_minor}")  # what SameMajorVersion would have accepted
    else()
      list(APPEND accepted "${version_MAJOR}.${previous_minor}")
    endif()
  endif()
  foreach(request IN LISTS accepted refused)
    set(build "${WORK_DIR}/request-${request}")
    execute_process(COMMAND "${CMAKE_COMMAND}" -S "${CONSUMER_DIR}" -B "${build}" ${common}
                            "-DCMAKE_PREFIX_PATH=${PREFIX}" "-DSELFATTN_REQUESTED=${request}"
                    RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE errors)
    if(request IN_LIST accepted)
      if(NOT result EQUAL 0)
        message(FATAL_ERROR "find_package(selfattn ${request}) failed against ${version}:\n${output}${errors}")
      endif()
      message(STATUS "find_package(selfattn ${request}) accepts ${version}: ok")
    else()
      if(result EQUAL 0)
        message(FATAL_ERROR "find_package(selfattn ${request}) accepted ${version}, which it must refuse")
      endif()
      if(NOT errors MATCHES "compatible with requested version")
        message(FATAL_ERROR "find_package(selfattn ${request}) failed for another reason:\n${errors}")
      endif()
      message(STATUS "find_package(selfattn ${request}) refuses ${version}: ok")
    endif()
  endforeach()
  message(STATUS "consumer_${MODE}: ok")
  return()
endif()

if(MODE STREQUAL "pkg_config")
  if(NOT PKG_CONFIG)
    message(STATUS "consumer_pkg_config: skipped: pkg-config not found (Debian: pkgconf, scripts/install-deps)")
    return()
  endif()
  set(ENV{PKG_CONFIG_PATH} "${PREFIX}/share/pkgconfig")
  execute_process(COMMAND "${PKG_CONFIG}" --cflags selfattn RESULT_VARIABLE result OUTPUT_VARIABLE cflags
                  ERROR_VARIABLE errors OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "PKG_CONFIG_PATH=${PREFIX}/share/pkgconfig pkg-config --cflags selfattn failed: ${errors}")
  endif()
  message(STATUS "pkg-config --cflags selfattn: ${cflags}")
  execute_process(COMMAND "${PKG_CONFIG}" --modversion selfattn OUTPUT_VARIABLE pc_version
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT pc_version STREQUAL version)
    message(FATAL_ERROR "pkg-config --modversion selfattn is '${pc_version}', version.hpp says ${version}")
  endif()
  # The include directory of the prefix must be among the -I flags.
  separate_arguments(flags UNIX_COMMAND "${cflags}")
  file(REAL_PATH "${PREFIX}/include" wanted)
  set(found FALSE)
  foreach(flag IN LISTS flags)
    if(flag MATCHES "^-I(.+)$")
      file(REAL_PATH "${CMAKE_MATCH_1}" dir)
      if(dir STREQUAL wanted)
        set(found TRUE)
      endif()
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "pkg-config --cflags selfattn (${cflags}) does not give -I${wanted}")
  endif()
  run("${CXX_COMPILER}" -std=c++17 ${flags} "${CONSUMER_DIR}/main.cpp" -o "${WORK_DIR}/app")
  run("${WORK_DIR}/app")
  message(STATUS "consumer_${MODE}: ok")
  return()
endif()

# --- Consumer projects ---
set(consumer_args "")
if(MODE STREQUAL "find_package")
  # A real install of a fresh top-level build (nothing but the library) into a scratch prefix.
  set(prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/selfattn" ${common}
      -DSELFATTN_BUILD_TESTS=OFF -DSELFATTN_BUILD_EXAMPLES=OFF
      -DSELFATTN_BUILD_BENCHMARKS=OFF -DSELFATTN_INSTALL=ON)
  run("${CMAKE_COMMAND}" --build "${WORK_DIR}/selfattn" --config Release)
  run("${CMAKE_COMMAND}" --install "${WORK_DIR}/selfattn" --prefix "${prefix}" --config Release)
  foreach(file IN ITEMS include/selfattn/selfattn.hpp include/selfattn/version.hpp share/cmake/selfattn/selfattnConfig.cmake
                        share/cmake/selfattn/selfattnConfigVersion.cmake share/pkgconfig/selfattn.pc)
    if(NOT EXISTS "${prefix}/${file}")
      message(FATAL_ERROR "the install did not write ${prefix}/${file}")
    endif()
  endforeach()
  list(APPEND consumer_args "-DCMAKE_PREFIX_PATH=${prefix}")
  extract(README.md consumer_find_package readme_snippet.cmake)
  extract(docs/using_in_projects.md consumer_find_package_openmp openmp_snippet.cmake)
  extract(docs/using_in_projects.md consumer_version version_snippet.hpp)
elseif(MODE STREQUAL "add_subdirectory")
  vendor_selfattn()
  extract(README.md consumer_add_subdirectory readme_snippet.cmake)
  extract(docs/using_in_projects.md consumer_gcc12_workaround warning_snippet.cmake)
  set(selfattn_build "third_party/selfattn")
elseif(MODE STREQUAL "fetch_content")
  extract(README.md consumer_fetch_content readme_snippet.cmake)
  # The snippet pins the release of this version: keep it in step with version.hpp.
  file(READ "${src}/readme_snippet.cmake" snippet)
  if(NOT snippet MATCHES "GIT_TAG +v${version}[ \n)]")
    message(FATAL_ERROR "README.md's FetchContent snippet does not pin GIT_TAG v${version} (version.hpp)")
  endif()
  # FetchContent takes this tree instead of cloning the tag: the documented override, no network.
  list(APPEND consumer_args "-DFETCHCONTENT_SOURCE_DIR_SELFATTN=${SOURCE_DIR}" -DFETCHCONTENT_FULLY_DISCONNECTED=ON)
  set(selfattn_build "_deps/selfattn-build")
elseif(MODE STREQUAL "install_export")
  vendor_selfattn()
  extract(docs/using_in_projects.md consumer_install_export readme_snippet.cmake)
  extract(docs/using_in_projects.md consumer_install_export_config cmake/mylibConfig.cmake)
  set(selfattn_build "third_party/selfattn")
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE '${MODE}'")
endif()

set(build "${WORK_DIR}/consumer")
run("${CMAKE_COMMAND}" -S "${src}" -B "${build}" ${common} ${consumer_args})

# The package must come from our prefix, not from some selfattn already on the machine.
if(MODE STREQUAL "find_package")
  file(STRINGS "${build}/CMakeCache.txt" found REGEX "^selfattn_DIR:")
  string(FIND "${found}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "selfattn was not found in ${prefix}: ${found}")
  endif()
endif()

# As a subproject, selfattn must not have built its tests, examples or benchmarks.
if(DEFINED selfattn_build)
  if(NOT EXISTS "${build}/${selfattn_build}")
    message(FATAL_ERROR "selfattn was not configured in ${build}/${selfattn_build}")
  endif()
  if(EXISTS "${build}/${selfattn_build}/tests")
    message(FATAL_ERROR "selfattn configured its tests although it is not the top-level project")
  endif()
endif()

run("${CMAKE_COMMAND}" --build "${build}" --config Release)
if(MODE STREQUAL "add_subdirectory" OR MODE STREQUAL "fetch_content")
  check_system_include("${build}")
endif()

# Run `app` of a build directory (multi-config generators add a directory).
function(run_app dir)
  set(program "${dir}/app")
  if(EXISTS "${dir}/Release/app")
    set(program "${dir}/Release/app")
  endif()
  run("${program}")
endfunction()

if(MODE STREQUAL "install_export")
  # Install mylib, with selfattn beside it, then build a program against the installed mylib package.
  set(prefix "${WORK_DIR}/prefix")
  run("${CMAKE_COMMAND}" --install "${build}" --prefix "${prefix}" --config Release)
  foreach(file IN ITEMS include/selfattn/selfattn.hpp share/cmake/selfattn/selfattnConfig.cmake
                        lib/cmake/mylib/mylibTargets.cmake lib/cmake/mylib/mylibConfig.cmake include/mylib.hpp)
    if(NOT EXISTS "${prefix}/${file}")
      message(FATAL_ERROR "the install did not write ${prefix}/${file}")
    endif()
  endforeach()
  set(downstream "${WORK_DIR}/downstream")
  run("${CMAKE_COMMAND}" -S "${src}/downstream" -B "${downstream}" ${common} "-DCMAKE_PREFIX_PATH=${prefix}")
  file(STRINGS "${downstream}/CMakeCache.txt" found REGEX "^selfattn_DIR:")
  string(FIND "${found}" "${prefix}/" at)
  if(NOT at GREATER -1)
    message(FATAL_ERROR "the downstream build did not find selfattn in ${prefix}: ${found}")
  endif()
  run("${CMAKE_COMMAND}" --build "${downstream}" --config Release)
  run_app("${downstream}")
else()
  run_app("${build}")
endif()
message(STATUS "consumer_${MODE}: ok")
