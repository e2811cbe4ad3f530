# Extracts a code block of a Markdown file so that the build can prove it compiles and runs as written.
#
#   cmake -DREADME=<path/to/README.md> -DOUTPUT=<path/to/example.cpp> -P extract_readme_example.cmake
#
# Writes the body of the first ```cpp fenced block that follows a Markdown heading containing
# "Usage" (e.g. "## Usage") to OUTPUT, behind a one-line "generated from" comment. Lines starting
# with '#' inside fenced blocks (shell comments) are not headings. OUTPUT is rewritten only when its
# content changes, so a re-configure does not force a rebuild. Fails (fatal error, non-zero exit)
# when README is missing, has no such heading, or no complete, non-empty ```cpp block follows it.
#
#   cmake -DREADME=<file.md> -DMARKER=<name> -DOUTPUT=<file> -P extract_readme_example.cmake
#
# With MARKER: the fenced block (any language) on the line right after the line `<!-- compiled: <name> -->`,
# an HTML comment that Markdown viewers do not show. The marker must occur exactly once; the comment line
# written first is `# ...` for a ```cmake block and `// ...` otherwise. Used by tests/consumer for the CMake and
# C++ snippets of README.md and docs/using_in_projects.md, and by tests/extern_templates.
#
# The file is handled as one string, never as a CMake list, so the semicolons and brackets of C++
# code pass through untouched.
cmake_minimum_required(VERSION 3.20)  # policies for this script (quoted if() arguments are strings)

foreach(var IN ITEMS README OUTPUT)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "extract_readme_example.cmake: -D${var}=... is required")
  endif()
endforeach()
if(NOT EXISTS "${README}")
  message(FATAL_ERROR "extract_readme_example.cmake: ${README} does not exist")
endif()

file(READ "${README}" text)
string(REPLACE "\r\n" "\n" text "${text}")
set(text "\n${text}")  # every line, the first one too, now starts after a "\n"

# Writes `content` to OUTPUT unless OUTPUT already holds exactly that (keeps the timestamp).
function(write_if_changed content)
  if(EXISTS "${OUTPUT}")
    file(READ "${OUTPUT}" previous)
    if("${previous}" STREQUAL "${content}")
      return()
    endif()
  endif()
  file(WRITE "${OUTPUT}" "${content}")
endfunction()

if(DEFINED MARKER AND NOT "${MARKER}" STREQUAL "")
  set(marker "\n<!-- compiled: ${MARKER} -->\n")
  string(FIND "${text}" "${marker}" at)
  string(FIND "${text}" "${marker}" last REVERSE)
  if(at EQUAL -1)
    message(FATAL_ERROR "extract_readme_example.cmake: no line '<!-- compiled: ${MARKER} -->' in ${README}")
  endif()
  if(NOT at EQUAL last)
    message(FATAL_ERROR "extract_readme_example.cmake: '<!-- compiled: ${MARKER} -->' occurs twice in ${README}")
  endif()
  string(LENGTH "${marker}" length)
  math(EXPR at "${at} + ${length}")
  string(SUBSTRING "${text}" ${at} -1 text)
  if(NOT text MATCHES "^```([A-Za-z0-9+]*)\n")
    message(FATAL_ERROR "extract_readme_example.cmake: the line after '<!-- compiled: ${MARKER} -->' in ${README} "
                        "does not open a fenced block (```lang)")
  endif()
  set(language "${CMAKE_MATCH_1}")
  string(LENGTH "${CMAKE_MATCH_0}" length)
  string(SUBSTRING "${text}" ${length} -1 text)
  set(text "\n${text}")
  string(FIND "${text}" "\n```" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "extract_readme_example.cmake: the block after '<!-- compiled: ${MARKER} -->' in ${README} "
                        "is not closed")
  endif()
  string(SUBSTRING "${text}" 1 ${at} code)
  string(STRIP "${code}" stripped)
  if("${stripped}" STREQUAL "")
    message(FATAL_ERROR "extract_readme_example.cmake: the block after '<!-- compiled: ${MARKER} -->' in ${README} "
                        "is empty")
  endif()
  set(comment "//")
  if(language STREQUAL "cmake")
    set(comment "#")
  endif()
  write_if_changed("${comment} Generated from ${README} (${MARKER}) by cmake/extract_readme_example.cmake: edit \
that file, not this one.\n${code}")
  return()
endif()

# The first heading line (one or more '#', then a space) that mentions "Usage" and is not inside a
# fenced block, i.e. has an even number of fence lines before it.
set(heading "")
set(searched 0)  # length of the prefix of `text` already searched
while(TRUE)
  string(SUBSTRING "${text}" ${searched} -1 rest)
  string(REGEX MATCH "\n#+ [^\n]*Usage[^\n]*\n" candidate "${rest}")
  if("${candidate}" STREQUAL "")
    break()
  endif()
  string(FIND "${rest}" "${candidate}" at)
  math(EXPR at "${searched} + ${at}")
  string(SUBSTRING "${text}" 0 ${at} before)
  string(REGEX MATCHALL "\n```" fences "${before}")
  list(LENGTH fences fence_count)
  string(LENGTH "${candidate}" length)
  math(EXPR searched "${at} + ${length} - 1")  # continue at the candidate's closing newline
  math(EXPR inside "${fence_count} % 2")
  if(inside EQUAL 0)
    set(heading "${candidate}")
    break()
  endif()
endwhile()
if("${heading}" STREQUAL "")
  message(FATAL_ERROR "extract_readme_example.cmake: no Markdown heading containing \"Usage\" in ${README}")
endif()
string(STRIP "${heading}" heading)
string(SUBSTRING "${text}" ${searched} -1 text)  # from the heading's closing newline on

# The first ```cpp fence after it, then the closing ``` fence.
set(open "\n```cpp\n")
string(FIND "${text}" "${open}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "extract_readme_example.cmake: no ```cpp block after the heading '${heading}' in ${README}")
endif()
string(LENGTH "${open}" length)
math(EXPR at "${at} + ${length}")
string(SUBSTRING "${text}" ${at} -1 text)
set(text "\n${text}")  # so that the closing fence is found even as the block's first line
string(FIND "${text}" "\n```" at)
if(at EQUAL -1)
  message(FATAL_ERROR "extract_readme_example.cmake: the ```cpp block after '${heading}' in ${README} is not closed")
endif()
string(SUBSTRING "${text}" 1 ${at} code)  # the block's lines, each with its newline
string(STRIP "${code}" stripped)
if("${stripped}" STREQUAL "")
  message(FATAL_ERROR "extract_readme_example.cmake: the ```cpp block after '${heading}' in ${README} is empty")
endif()

write_if_changed("// Generated from ${README} by cmake/extract_readme_example.cmake: edit the README, not this file.\n${code}")
