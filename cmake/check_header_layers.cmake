# The layer rule of docs/design.md, checked (ctest test header_layers, tests/CMakeLists.txt):
#   cmake -DDESIGN=<docs/design.md> -DINCLUDE_DIR=<include> -P check_header_layers.cmake
#
# The page's layer table is the map and the rule in one: rows `| <layer> | `<header>` | <job> |`, layer 0 at the
# bottom, the header's path relative to INCLUDE_DIR (selfattn/nn/norm.hpp). Other tables of the page do not have a
# number in their first cell and a path in code quotes in their second, so they are not read. The check:
#   - every file under INCLUDE_DIR/selfattn (*.hpp, *.h and the kernel bodies *.inc) has exactly one row;
#   - every row names a file that exists;
#   - every `#include <selfattn/...>`, and every `#include "..."` that resolves under INCLUDE_DIR/selfattn, names a
#     file of the includer's layer or a lower one.
# It prints every problem (the header, the include as written and both layers), then fails if there was one; when
# all is well it prints one line with the counts. A CMake script, so that building and testing need no Python.
cmake_minimum_required(VERSION 3.20)  # cmake_path; quoted if() arguments are strings

foreach(var IN ITEMS DESIGN INCLUDE_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_header_layers.cmake: -D${var}=... is required")
  endif()
endforeach()
# Relative paths are taken from the working directory, as a shell user means them.
get_filename_component(DESIGN "${DESIGN}" ABSOLUTE)
get_filename_component(INCLUDE_DIR "${INCLUDE_DIR}" ABSOLUTE)
if(NOT EXISTS "${DESIGN}")
  message(FATAL_ERROR "check_header_layers.cmake: ${DESIGN} does not exist")
endif()
if(NOT IS_DIRECTORY "${INCLUDE_DIR}/selfattn")
  message(FATAL_ERROR "check_header_layers.cmake: ${INCLUDE_DIR}/selfattn is not a directory")
endif()

# Every problem found, one per line; printed together at the end, so that one run shows them all.
set(problems "")
set(problem_count 0)
macro(problem text)
  string(APPEND problems "  ${text}\n")
  math(EXPR problem_count "${problem_count} + 1")
endmacro()

# --- The table. ---
# Rows are matched in the page's text as a whole rather than split into a CMake list of lines: a job may hold a
# semicolon (a list separator) or an unbalanced bracket (which stops a list from splitting), and neither may
# disturb the rows after it. Each match ends after the header cell, so the job column is never read.
# A header's layer is the variable layer_<header> (a path is a valid variable name: letters, digits, / _ . -).
file(READ "${DESIGN}" design)
string(REPLACE "\r\n" "\n" design "${design}")
string(REGEX MATCHALL "\n\\|[ \t]*[0-9]+[ \t]*\\|[ \t]*`[^`\n]+`[ \t]*\\|" rows "\n${design}")
set(table_headers "")
foreach(row IN LISTS rows)
  string(REGEX MATCH "([0-9]+)[ \t]*\\|[ \t]*`([^`]+)`" unused "${row}")
  set(layer "${CMAKE_MATCH_1}")
  set(header "${CMAKE_MATCH_2}")
  if(DEFINED layer_${header})
    problem("${header}: two rows in the table (layers ${layer_${header}} and ${layer}); a header has one layer")
    continue()
  endif()
  set(layer_${header} "${layer}")
  list(APPEND table_headers "${header}")
endforeach()
list(LENGTH table_headers row_count)
if(row_count EQUAL 0)
  message(FATAL_ERROR "check_header_layers.cmake: no layer table in ${DESIGN} (rows `| <layer> | `<header>` | ... |`)")
endif()

# --- The files on disk against the table, both ways. ---
file(GLOB_RECURSE on_disk RELATIVE "${INCLUDE_DIR}" "${INCLUDE_DIR}/selfattn/*.hpp" "${INCLUDE_DIR}/selfattn/*.h"
     "${INCLUDE_DIR}/selfattn/*.inc")
list(SORT on_disk)
foreach(header IN LISTS on_disk)
  if(NOT DEFINED layer_${header})
    problem("${header}: on disk but not in the layer table of ${DESIGN}; add its row (layer, header, job)")
  endif()
endforeach()
foreach(header IN LISTS table_headers)
  if(NOT header IN_LIST on_disk)
    problem("${header} (layer ${layer_${header}}): in the layer table but not a file under ${INCLUDE_DIR}")
  endif()
endforeach()

# --- The includes. ---
# Only directives at the start of a line count: the doc comments quote `#include <selfattn/...>` after `///`. The
# match stops at the closing > or ", so a comment after the directive is not read. A quoted include is resolved as
# the preprocessor does: beside the including file first, then from INCLUDE_DIR; one that resolves to neither
# (a user's configuration header, say) is not ours and not checked.
set(include_count 0)
foreach(header IN LISTS on_disk)
  if(NOT DEFINED layer_${header})
    continue()  # reported above; its includes have no layer to compare with
  endif()
  file(READ "${INCLUDE_DIR}/${header}" source)
  string(REPLACE "\r\n" "\n" source "${source}")
  string(REGEX MATCHALL "\n[ \t]*#[ \t]*include[ \t]*(<selfattn/[^>\n]+>|\"[^\"\n]+\")" directives "\n${source}")
  get_filename_component(directory "${header}" DIRECTORY)
  foreach(directive IN LISTS directives)
    string(STRIP "${directive}" directive)
    string(REGEX MATCH "[<\"](.+)[>\"]$" unused "${directive}")
    set(target "${CMAKE_MATCH_1}")
    if(directive MATCHES "\"$")
      cmake_path(SET beside NORMALIZE "${directory}/${target}")
      if(EXISTS "${INCLUDE_DIR}/${beside}" AND beside MATCHES "^selfattn/")
        set(target "${beside}")
      elseif(NOT target MATCHES "^selfattn/")
        continue()
      endif()
    endif()
    math(EXPR include_count "${include_count} + 1")
    if(NOT DEFINED layer_${target})
      if(NOT target IN_LIST on_disk)
        problem("${header} (layer ${layer_${header}}): ${directive} names no file under ${INCLUDE_DIR}")
      endif()
      continue()  # a file on disk without a row is reported above
    endif()
    if("${layer_${target}}" GREATER "${layer_${header}}")
      problem("${header} (layer ${layer_${header}}) includes ${target} (layer ${layer_${target}}): ${directive} runs \
up a layer; a header may include only headers of its own layer or a lower one")
    endif()
  endforeach()
endforeach()

if(problem_count GREATER 0)
  message(NOTICE "header_layers: ${problem_count} problem(s) with the layer rule of ${DESIGN}:\n${problems}")
  message(FATAL_ERROR "header_layers: FAILED (${problem_count} problem(s) above)")
endif()

# All is well: the counts, per layer, so that a log shows what was checked.
set(counts "")
set(layers "")
foreach(header IN LISTS table_headers)
  list(APPEND layers "${layer_${header}}")
endforeach()
list(REMOVE_DUPLICATES layers)
list(SORT layers COMPARE NATURAL)
foreach(layer IN LISTS layers)
  set(n 0)
  foreach(header IN LISTS table_headers)
    if("${layer_${header}}" EQUAL "${layer}")
      math(EXPR n "${n} + 1")
    endif()
  endforeach()
  string(APPEND counts " ${layer}:${n}")
endforeach()
list(LENGTH on_disk file_count)
message(STATUS "header_layers: OK, ${file_count} files in the table (per layer:${counts}), ${include_count} includes \
of ours, each to the includer's layer or a lower one")
