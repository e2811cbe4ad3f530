# The test docs_blocks (cmake -P; see CMakeLists.txt beside it): compiles every ```cpp block of docs/*.md.
#   COMPILER   the C++ compiler of the build
#   AWK        awk, which runs cmake/extract_doc_blocks.awk
#   ROOT       the repository root; the pages are ROOT/docs/*.md, globbed here, so a new page is checked as soon as
#              it exists (no re-configure)
#   OUTPUT     directory for the generated translation unit, docs_blocks.cpp
#   INCLUDES   ;-list of include directories: ours first, then Eigen's and those of the optional dependencies
#   HAVE_JSON, HAVE_MPI   1 or 0: without them, the blocks that include <selfattn/io/safetensors.hpp> or
#              <selfattn/distributed.hpp> are skipped (and counted as skipped)
#   RUN_TESTS  how many blocks the build turned into programs run by the tests docs_run_* (from configure time)
# Each page becomes C++ (cmake/extract_doc_blocks.awk: each block in a namespace of its own), and all pages are
# checked as one translation unit with -fsyntax-only: the code is parsed and every template it uses instantiated,
# but nothing is generated, which keeps the test short. #line directives make the compiler's messages name the page
# and line of the block. A page's #include lines reach the pages after it: a block that forgets a header outside
# the umbrella (io/safetensors.hpp, distributed.hpp) can pass here; a hidden preamble should include it.
foreach(var COMPILER AWK ROOT OUTPUT INCLUDES HAVE_JSON HAVE_MPI RUN_TESTS)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_doc_blocks.cmake: -D${var}=... is required")
  endif()
endforeach()

# The blocks are fragments: a variable that the page declares for the reader and never uses is not a defect.
set(flags -std=c++17 -fsyntax-only -Wall -Wextra -Wpedantic -Werror -Wno-unused-variable -Wno-unused-parameter
          -Wno-unused-but-set-variable -Wno-unused-local-typedefs)
list(GET INCLUDES 0 ours)
list(APPEND flags "-I${ours}")
list(SUBLIST INCLUDES 1 -1 others)
foreach(dir IN LISTS others)
  list(APPEND flags "-isystem" "${dir}")
endforeach()
# The kernels are declared instantiated elsewhere (as in tests/compile_fail): the blocks instantiate the public
# templates, not every kernel again.
list(APPEND flags -include selfattn/extern_templates.hpp)

file(GLOB pages RELATIVE "${ROOT}" "${ROOT}/docs/*.md")
list(SORT pages)
file(MAKE_DIRECTORY "${OUTPUT}")
set(all_pages "")
set(total 0)
set(runnable 0)
set(skipped 0)
set(elsewhere 0)
set(programs 0)
set(pages_with_code 0)
set(failures "")
string(CONCAT summary_line "// doc-blocks: blocks=([0-9]+) run=([0-9,]*) skipped=([0-9]+) elsewhere=([0-9]+) "
                           "programs=([0-9]+)\n$")  # the extractor's last line
foreach(page IN LISTS pages)
  execute_process(COMMAND "${AWK}" -v "page=${page}" -v "have_json=${HAVE_JSON}" -v "have_mpi=${HAVE_MPI}"
                          -f "${ROOT}/cmake/extract_doc_blocks.awk" "${ROOT}/${page}"
                  RESULT_VARIABLE result OUTPUT_VARIABLE unit ERROR_VARIABLE error)
  if(NOT result EQUAL 0)
    string(APPEND failures "${page}: the extractor failed: ${error}\n")
    continue()
  endif()
  if(NOT unit MATCHES "${summary_line}")
    message(FATAL_ERROR "${page}: the extractor's output has no summary line")
  endif()
  set(blocks ${CMAKE_MATCH_1})
  string(REPLACE "," ";" run "${CMAKE_MATCH_2}")
  list(LENGTH run run_count)
  math(EXPR total "${total} + ${blocks}")
  math(EXPR runnable "${runnable} + ${run_count}")
  set(page_skipped ${CMAKE_MATCH_3})
  math(EXPR skipped "${skipped} + ${page_skipped}")
  set(page_elsewhere ${CMAKE_MATCH_4})
  math(EXPR elsewhere "${elsewhere} + ${page_elsewhere}")
  set(page_programs ${CMAKE_MATCH_5})
  math(EXPR programs "${programs} + ${page_programs}")
  if(blocks EQUAL 0)
    continue()
  endif()
  math(EXPR pages_with_code "${pages_with_code} + 1")
  math(EXPR page_here "${blocks} - ${page_skipped} - ${page_elsewhere} - ${page_programs}")
  if(page_here EQUAL 0)
    message(STATUS "${page}: ${blocks} C++ block(s), none to compile here (compiled elsewhere or skipped)")
    continue()
  endif()
  message(STATUS "${page}: ${page_here} C++ block(s) to compile")
  string(APPEND all_pages "${unit}\n")
endforeach()

# All pages in one translation unit: the library is parsed once, not once per page (measured with g++ under a
# heavy load: 11 CPU seconds instead of 44). From the repository root, so that the #line paths (docs/<page>.md)
# are paths an editor opens.
if(NOT all_pages STREQUAL "")
  set(source "${OUTPUT}/docs_blocks.cpp")
  file(WRITE "${source}" "${all_pages}")
  string(TIMESTAMP started "%s")
  execute_process(COMMAND "${COMPILER}" ${flags} "${source}" WORKING_DIRECTORY "${ROOT}"
                  RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE output)
  string(TIMESTAMP finished "%s")
  math(EXPR seconds "${finished} - ${started}")
  if(result EQUAL 0)
    message(STATUS "compiled in ${seconds} s: ${source}")
  else()
    string(APPEND failures "${output}\n(generated source: ${source})\n")
  endif()
endif()

list(LENGTH pages page_count)
math(EXPR here "${total} - ${skipped} - ${elsewhere} - ${programs}")
string(CONCAT summary "docs: ${total} C++ blocks in ${pages_with_code} of ${page_count} pages: ${here} compiled here, "
                      "${elsewhere} by the tests that extract them (<!-- compiled: NAME -->)")
if(programs GREATER 0)
  string(APPEND summary ", ${programs} whole programs by the build (docs_run_*)")
endif()
if(skipped GREATER 0)
  string(APPEND summary ", ${skipped} skipped (their dependency, nlohmann/json or MPI, was not found)")
endif()
string(APPEND summary "; ${runnable} marked to run")
if(NOT runnable EQUAL RUN_TESTS)
  string(APPEND failures "${runnable} blocks are marked to run, but the build made ${RUN_TESTS} docs_run_* tests: "
                         "re-configure (cmake -S . -B <build>) so that the build picks up the pages' changes\n")
else()
  string(APPEND summary ", built and run by the tests docs_run_*")
endif()
if(NOT failures STREQUAL "")
  message(FATAL_ERROR "${summary}, with errors:\n${failures}")
endif()
message(STATUS "${summary}")
