# Doxygen input filter for the markdown pages (FILTER_PATTERNS in Doxyfile.in): makes GitHub-style
# links work in the HTML site without changing how the pages read on GitHub.
#   awk -v root=<repository root> -f md-filter.awk <page.md>
# Doxygen 1.9.4 names a heading's anchor autotoc_mdN, so a link to `#numerical-policy` or to
# `masks.md#causal-masks` would not resolve. This filter, line for line (warnings keep their line numbers):
#   - gives every heading of level >= 2 outside code fences an explicit id {#<page>-<GitHub slug>},
#     <page> being the file's path from the root with / and . as _ (docs_masks_md); level 1 is left
#     alone because Doxygen takes the page's own name from it;
#   - rewrites links `](#slug)` and `](path.md#slug)` to `](#<page of path>-slug)` (Doxygen labels are global);
#   - turns links to public headers (`../include/selfattn/attention.hpp`) into \ref to their file pages,
#     and links to other files that are not pages (`examples/`, `LICENSE`, detail/ headers) into their
#     plain text, since those are not part of the site. Images, absolute URLs and plain `.md` links are kept;
#   - writes < and > inside `code spans` as &lt; and &gt;: Doxygen 1.9.4 sometimes reads them as HTML tags
#     there (`<memory>`, `'<f4'` in tables), where GitHub shows them as text.

function normalize(path,    parts, n, i, out, depth, stack) {
  n = split(path, parts, "/")
  depth = 0
  for (i = 1; i <= n; i++) {
    if (parts[i] == "" || parts[i] == ".") continue
    if (parts[i] == "..") { if (depth > 0) depth--; continue }
    stack[++depth] = parts[i]
  }
  out = ""
  for (i = 1; i <= depth; i++) out = out (i > 1 ? "/" : "") stack[i]
  return out
}

function page_key(relpath,    key) {
  key = relpath
  gsub(/[\/.]/, "_", key)
  return key
}

# GitHub's heading slug: lower case, drop everything but letters, digits, spaces, - and _, spaces to -.
function slug(text,    s) {
  s = tolower(text)
  gsub(/[^a-z0-9 _-]/, "", s)
  gsub(/ /, "-", s)
  return s
}

# A line with < and > escaped inside its code spans.
function escape_code_spans(row,    out, i, c, in_code) {
  out = ""
  in_code = 0
  for (i = 1; i <= length(row); i++) {
    c = substr(row, i, 1)
    if (c == "`") in_code = !in_code
    else if (in_code && c == "<") c = "&lt;"
    else if (in_code && c == ">") c = "&gt;"
    out = out c
  }
  return out
}

# The replacement of one link [text](target).
function rewrite_link(text, target,    hash, path, anchor, resolved, plain) {
  if (target ~ /^[a-z]+:/) return "[" text "](" target ")"     # http:, https:, mailto:
  hash = index(target, "#")
  path = hash ? substr(target, 1, hash - 1) : target
  anchor = hash ? substr(target, hash + 1) : ""
  if (path == "") return "[" text "](#" self "-" anchor ")"     # same page
  resolved = normalize(dir "/" path)
  if (resolved ~ /\.md$/)
    return "[" text "](" (anchor == "" ? target : "#" page_key(resolved) "-" anchor) ")"
  plain = text
  gsub(/`/, "", plain)
  if (resolved ~ /^include\/selfattn\/[^\/]+\.hpp$/ && plain !~ /"/) {   # a public header: its file page
    sub(/^include\/selfattn\//, "", resolved)
    return "\\ref " resolved " \"" plain "\""
  }
  return text                                                   # not a page of the site: plain text
}

BEGIN {
  file = ARGV[1]
  rel = substr(file, length(root) + 2)                          # path from the repository root
  dir = rel                                                     # the page's directory, "" at the root
  if (dir ~ /\//) sub(/\/[^\/]*$/, "", dir); else dir = ""
  self = page_key(rel)
  fence = ""
}

{
  line = $0
  if (fence != "") {                                            # inside a code fence: verbatim
    if (line ~ "^[ ]*" fence) fence = ""
    print line
    next
  }
  if (match(line, /^[ ]*(```|~~~)/)) {
    fence = substr(line, RSTART + RLENGTH - 3, 3)
    print line
    next
  }
  if (line ~ /^##+ / && line !~ /\{#[^}]*\}[ ]*$/) {
    text = line
    sub(/^#+ +/, "", text)
    sub(/[ #]*$/, "", text)
    line = line " {#" self "-" slug(text) "}"
  }
  line = escape_code_spans(line)
  # Links: [text](target), not images ![alt](src).
  out = ""
  while (match(line, /!?\[[^\]]*\]\([^)]*\)/)) {
    link = substr(line, RSTART, RLENGTH)
    out = out substr(line, 1, RSTART - 1)
    line = substr(line, RSTART + RLENGTH)
    if (substr(link, 1, 1) == "!") { out = out link; continue }
    split_at = index(link, "](")
    out = out rewrite_link(substr(link, 2, split_at - 2), substr(link, split_at + 2, length(link) - split_at - 2))
  }
  print out line
}
