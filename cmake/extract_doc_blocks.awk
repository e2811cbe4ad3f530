# Turns the ```cpp blocks of one Markdown page into C++ that the compiler can check (tests/docs).
#
#   awk -v page=docs/api.md -f extract_doc_blocks.awk <root>/docs/api.md          -> one translation unit
#   awk -v page=docs/api.md -v program=N -f extract_doc_blocks.awk <file>          -> block N as a program
#
# page is the path printed in the compiler's messages: every block's lines come with #line, so an error in a
# block points at its line of the page. Optional: -v have_json=0 / -v have_mpi=0 leave out the blocks that
# include <selfattn/io/safetensors.hpp> (nlohmann/json) or <selfattn/distributed.hpp> (MPI), counted as skipped.
#
# Every block implicitly starts with `#include <selfattn/selfattn.hpp>` and `using namespace selfattn;` (what the
# pages assume). A block is compiled as the body of a function, unless it contains `int main(`: then it is a whole
# program. The line right before the fence may be a marker, an HTML comment that Markdown viewers and the Doxygen
# site do not show:
#   <!-- doc-test: function -->      the default: inside a function body
#   <!-- doc-test: namespace -->     at namespace scope (declarations, definitions)
#   <!-- doc-test: run -->           inside main(): also built as a program and run, which must exit 0
#   <!-- compiled: NAME -->          a whole file that another test extracts by NAME and compiles (tests/consumer,
#                                    tests/CMakeLists.txt): not compiled again here (the kernels' instantiation
#                                    block alone takes 40 s here), counted as compiled elsewhere
# and a marker may carry a hidden preamble, the lines a fragment needs that the page does not show, ended by a
# line `-->` (no "--" inside: HTML comments must not contain it):
#   <!-- doc-test: function
#   Tensor<float, 4> q({1, 8, 1, 64});
#   -->
# A marker that no ```cpp block follows, an unknown kind or an unclosed block is an error (exit code 1).
#
# The translation unit puts each block in a namespace of its own (docs_<page>_block_<n>, so that the units of
# several pages can be concatenated into one), with its #include lines moved
# to the top of the file, and ends with a line for the driver:
#   // doc-blocks: blocks=<n> run=<list of block numbers> skipped=<n> elsewhere=<n> programs=<n>
# (programs: the whole programs, left out of the unit: the build compiles them as docs_run_*)

function fail(message) {
  printf "%s:%d: %s\n", page, FNR, message > "/dev/stderr"
  failed = 1
  exit 1
}

function is_include(text) {
  return text ~ /^[ \t]*#[ \t]*include[ \t]/
}

# The dependency a line of code needs beyond selfattn and Eigen: "json", "mpi" or "".
function needs_of(text) {
  if (text ~ /#[ \t]*include[ \t]*<selfattn\/io\/safetensors\.hpp>/) return "json"
  if (text ~ /#[ \t]*include[ \t]*<selfattn\/distributed\.hpp>/) return "mpi"
  return ""
}

BEGIN {
  if (page == "") page = ARGV[1]
  stem = page                        # the page as a C++ identifier: docs/api.md -> api
  sub(/^.*\//, "", stem)
  sub(/\.md$/, "", stem)
  gsub(/[^A-Za-z0-9_]/, "_", stem)
  if (have_json == "") have_json = 1
  if (have_mpi == "") have_mpi = 1
  blocks = 0
  fence = ""          # the fence of a non-C++ code block we are in
  in_block = 0        # inside a ```cpp block
  in_marker = 0       # inside a multi-line doc-test marker
  marker_end = -1     # line of the last marker's end, to attach it to the fence on the next line
}

in_marker {
  if ($0 ~ /^[ \t]*-->[ \t]*$/) {
    in_marker = 0
    marker_end = FNR
    next
  }
  if (index($0, "--")) fail("a hidden preamble line must not contain \"--\" (HTML comments must not)")
  preamble[++preamble_lines] = $0
  next
}

in_block {
  if ($0 ~ /^[ \t]*```[ \t]*$/) {
    in_block = 0
    next
  }
  code[blocks, ++code_lines[blocks]] = $0
  if (needs_of($0) != "") needs[blocks] = needs_of($0)
  if ($0 ~ /int[ \t]+main[ \t]*\(/ && kind[blocks] != "elsewhere") kind[blocks] = "program"
  next
}

fence != "" {
  if ($0 ~ "^[ \t]*" fence "[ \t]*$") fence = ""
  next
}

/^[ \t]*<!-- (doc-test|compiled):/ {
  if (marker_end == FNR - 1 && marker_line) fail("two markers before one block")
  marker_line = FNR
  preamble_lines = 0
  text = $0
  sub(/^[ \t]*<!-- /, "", text)
  closed = sub(/[ \t]*-->[ \t]*$/, "", text)
  marker_kind_compiled = text ~ /^compiled:/
  if (marker_kind_compiled) {
    marker_kind = "elsewhere"
  } else {
    sub(/^doc-test:[ \t]*/, "", text)
    if (text !~ /^(function|namespace|run)$/) fail("unknown doc-test kind '" text "' (function, namespace or run)")
    marker_kind = text
  }
  if (closed) marker_end = FNR
  else in_marker = 1
  next
}

/^[ \t]*```[ \t]*cpp[ \t]*$/ {
  blocks++
  in_block = 1
  first_line[blocks] = FNR + 1
  kind[blocks] = "function"
  needs[blocks] = ""
  code_lines[blocks] = 0
  pre_lines[blocks] = 0
  if (marker_end == FNR - 1 && marker_line) {
    kind[blocks] = marker_kind
    pre_first[blocks] = marker_line + 1
    for (i = 1; i <= preamble_lines; i++) {
      pre[blocks, i] = preamble[i]
      if (needs_of(preamble[i]) != "") needs[blocks] = needs_of(preamble[i])
    }
    pre_lines[blocks] = preamble_lines
    marker_line = 0
  }
  next
}

/^[ \t]*(```|~~~)/ {
  if (marker_line && marker_kind_compiled) marker_line = 0   # a compiled: marker of a CMake block (tests/consumer)
  if (marker_line) fail("the marker of line " marker_line " is not followed by a ```cpp fence")
  match($0, /(```|~~~)/)
  fence = substr($0, RSTART, 3)
  next
}

{
  if (marker_line) fail("the marker of line " marker_line " is not followed by a ```cpp fence")
}

function skipped_block(b) {
  return (needs[b] == "json" && !have_json) || (needs[b] == "mpi" && !have_mpi)
}

function print_line(text, hoist, indent) {
  if (hoist && is_include(text)) print ""
  else print indent text
}

# Lines of block b (its preamble first) with #line directives; #include lines become blank lines when hoist is set
# (they are printed at the top of the file instead), so that the numbering stays right.
function print_lines(b, hoist, indent,    i) {
  if (pre_lines[b] > 0) {
    printf "#line %d \"%s\"\n", pre_first[b], page
    for (i = 1; i <= pre_lines[b]; i++) print_line(pre[b, i], hoist, indent)
  }
  printf "#line %d \"%s\"\n", first_line[b], page
  for (i = 1; i <= code_lines[b]; i++) print_line(code[b, i], hoist, indent)
}

function print_includes(b,    i) {
  for (i = 1; i <= pre_lines[b]; i++)
    if (is_include(pre[b, i])) printf "#line %d \"%s\"\n%s\n", pre_first[b] + i - 1, page, pre[b, i]
  for (i = 1; i <= code_lines[b]; i++)
    if (is_include(code[b, i])) printf "#line %d \"%s\"\n%s\n", first_line[b] + i - 1, page, code[b, i]
}

function print_program(b) {
  printf "// Generated from %s (its C++ block %d) by cmake/extract_doc_blocks.awk: edit the page.\n", page, b
  if (kind[b] == "program") {
    print_lines(b, 0, "")
    return
  }
  print "#include <selfattn/selfattn.hpp>"
  print_includes(b)
  print "using namespace selfattn;"
  print "int main() {"
  print_lines(b, 1, "  ")
  print "}"
}

function print_unit(    b, run, skipped) {
  printf "// Generated from %s by cmake/extract_doc_blocks.awk: edit the page, not this file.\n", page
  print "#include <selfattn/selfattn.hpp>"
  for (b = 1; b <= blocks; b++)
    if (!skipped_block(b) && kind[b] != "program" && kind[b] != "elsewhere") print_includes(b)
  run = ""
  skipped = 0
  elsewhere = 0
  programs = 0
  for (b = 1; b <= blocks; b++) {
    if (skipped_block(b)) {
      skipped++
      continue
    }
    if (kind[b] == "elsewhere") {
      elsewhere++
      continue
    }
    if (kind[b] == "run" || kind[b] == "program") run = run (run == "" ? "" : ",") b
    if (kind[b] == "program") {   # its own translation unit: built and run as a program
      programs++
      continue
    }
    printf "\nnamespace docs_%s_block_%d {  // %s:%d\nusing namespace selfattn;\n", stem, b, page, first_line[b]
    if (kind[b] == "namespace") {
      print_lines(b, 1, "")
    } else {
      print "void block() {"
      print_lines(b, 1, "  ")
      print "}"
    }
    printf "}  // namespace docs_%s_block_%d\n", stem, b
  }
  printf "// doc-blocks: blocks=%d run=%s skipped=%d elsewhere=%d programs=%d\n",
         blocks, run, skipped, elsewhere, programs
}

END {
  if (failed) exit 1
  if (in_marker) fail("the marker of line " marker_line " is not closed by a line -->")
  if (in_block) fail("the ```cpp block of line " first_line[blocks] - 1 " is not closed")
  if (marker_line) fail("the marker of line " marker_line " is not followed by a ```cpp fence")
  if (program != "") {
    if (program < 1 || program > blocks) fail("no C++ block " program)
    print_program(program)
  } else {
    print_unit()
  }
}
