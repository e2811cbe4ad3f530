// Pictures of attention (selfattn/plot/heatmap.hpp): the SVG is well-formed XML with one cell per weight, escaped
// labels, a colour scale, masked and NaN cells marked; the CSV reads back exactly; wrong label counts and
// options are rejected; and rsvg-convert (Debian librsvg2-bin) rasterises what we write but refuses a broken
// file, so the rasterisation check can fail.
#include <gtest/gtest.h>

#include "support/scratch_directory.hpp"
#include "support/svg_check.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <regex>
#include <selfattn/plot/heatmap.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace selfattn;
namespace fs = std::filesystem;

using test::count;
using test::svg_attribute;
using test::xml_error;

Tensor<float, 2> ramp(Index rows, Index columns) {  // distinct values in (0, 1)
  Tensor<float, 2> w({rows, columns});
  for (Index n = 0; n < w.size(); ++n) w.data()[n] = static_cast<float>(n + 1) / static_cast<float>(w.size() + 1);
  return w;
}

std::vector<std::string> numbered(const std::string& stem, Index n) {
  std::vector<std::string> labels;
  for (Index k = 0; k < n; ++k) labels.push_back(stem + std::to_string(k));
  return labels;
}

// ---- SVG structure -------------------------------------------------------------------------------------

TEST(HeatmapSvg, WellFormedWithOneRectPerCell) {
  const Tensor<float, 2> w = ramp(3, 5);
  HeatmapOptions opts;
  opts.title = "a title";
  const std::string svg = attention_heatmap_svg(w, numbered("q", 3), numbered("k", 5), opts);
  int elements = 0;
  EXPECT_EQ(xml_error(svg, &elements), "");
  EXPECT_GT(elements, 15);
  EXPECT_EQ(count(svg, "<rect class=\"cell"), 15u);
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_NE(svg.find(">a title</text>"), std::string::npos);
  for (const char* label : {"q0", "q2", "k0", "k4"})
    EXPECT_NE(svg.find(">" + std::string(label) + "</text>"), std::string::npos) << label;
  // Values are printed with two decimals by default: 1/16 -> 0.06, 15/16 -> 0.94.
  EXPECT_NE(svg.find(">0.06</text>"), std::string::npos);
  EXPECT_NE(svg.find(">0.94</text>"), std::string::npos);
  opts.show_values = false;
  EXPECT_EQ(count(attention_heatmap_svg(w, {}, {}, opts), "class=\"value\""), 0u);
}

TEST(HeatmapSvg, CellsLieInsideTheCanvas) {
  Tensor<double, 2> w({4, 7});
  const std::vector<std::string> keys{"a", "rather long key label", "b", "c", "another long one", "d", "e"};
  const std::string svg = attention_heatmap_svg(w, numbered("query ", 4), keys);
  ASSERT_EQ(xml_error(svg), "");
  const double width = svg_attribute(svg, "width"), height = svg_attribute(svg, "height");
  ASSERT_GT(width, 0);
  const std::regex cell(
      "<rect class=\"cell[^\"]*\" x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" height=\"([0-9.]+)\"");
  std::size_t cells = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), cell); it != std::sregex_iterator(); ++it, ++cells) {
    EXPECT_LE(std::stod((*it)[1]) + std::stod((*it)[3]), width);
    EXPECT_LE(std::stod((*it)[2]) + std::stod((*it)[4]), height);
  }
  EXPECT_EQ(cells, 28u);
  EXPECT_NE(svg.find("rotate(-45"), std::string::npos) << "long key labels that collide are rotated";
  EXPECT_EQ(attention_heatmap_svg(w, {}, {}).find("rotate(-45"), std::string::npos) << "short ones are not";
}

TEST(HeatmapSvg, OneHeadOfAWeightsTensor) {
  Tensor<float, 4> w({2, 3, 2, 4});
  w(1, 2, 0, 0) = 0.123f;  // only in batch 1, head 2
  w(0, 0, 0, 0) = 0.987f;
  const std::string svg = attention_heatmap_svg(w, 1, 2, numbered("q", 2), numbered("k", 4));
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(count(svg, "<rect class=\"cell"), 8u);
  EXPECT_NE(svg.find(">0.12</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">0.99</text>"), std::string::npos);
}

TEST(HeatmapSvg, GridOfHeadsTitledByHead) {
  Tensor<float, 4> w({2, 3, 4, 5});
  for (Index h = 0; h < 3; ++h) w(1, h, 0, 0) = 0.1f * static_cast<float>(h + 1);  // 0.10, 0.20, 0.30 in batch 1
  w(0, 0, 0, 0) = 0.77f;
  HeatmapOptions opts;
  opts.title = "every head";
  const std::string svg = attention_heads_svg(w, 1, numbered("q", 4), numbered("k", 5), opts);
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(count(svg, "<rect class=\"cell"), 3u * 4u * 5u);
  for (int h = 0; h < 3; ++h) EXPECT_EQ(count(svg, ">head " + std::to_string(h) + "</text>"), 1u) << h;
  EXPECT_EQ(count(svg, ">head 3</text>"), 0u);
  for (const char* v : {">0.10<", ">0.20<", ">0.30<"}) EXPECT_NE(svg.find(v), std::string::npos) << v;
  EXPECT_EQ(svg.find(">0.77<"), std::string::npos) << "batch 0 must not be drawn";
  EXPECT_EQ(count(svg, "class=\"scale\""), 1u) << "one colour scale for the whole grid";
}

TEST(HeatmapSvg, LabelsAndTitleAreEscaped) {
  const Tensor<float, 2> w = ramp(4, 4);
  const std::vector<std::string> labels{"<eos>", "a&b", "\"quoted\"", "it's"};
  HeatmapOptions opts;
  opts.title = "<b>bold</b> & more";
  opts.legend_label = "p(<k>)";
  const std::string svg = attention_heatmap_svg(w, labels, labels, opts);
  EXPECT_EQ(xml_error(svg), "");
  for (const std::string escaped : {"&lt;eos&gt;", "a&amp;b", "&quot;quoted&quot;", "it&apos;s"})
    EXPECT_EQ(count(svg, ">" + escaped + "</text>"), 2u) << escaped;  // once per axis
  EXPECT_EQ(svg.find("<eos>"), std::string::npos);
  EXPECT_EQ(svg.find("a&b"), std::string::npos);
  EXPECT_NE(svg.find("&lt;b&gt;bold&lt;/b&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("p(&lt;k&gt;)"), std::string::npos);
}

TEST(HeatmapSvg, BytesXmlCannotHoldBecomeReplacementCharacters) {
  // A control character, a lone continuation byte, a truncated sequence, a UTF-16 surrogate: all U+FFFD.
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(detail::xml_escape(std::string("a\x01z")), "a" + fffd + "z");
  EXPECT_EQ(detail::xml_escape("x\x80y"), "x" + fffd + "y");
  EXPECT_EQ(detail::xml_escape("caf\xC3"), "caf" + fffd);
  EXPECT_EQ(detail::xml_escape("\xED\xA0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(detail::xml_escape("caf\xC3\xA9 \xE6\x97\xA5"), "caf\xC3\xA9 \xE6\x97\xA5") << "valid UTF-8 is kept";
  EXPECT_EQ(detail::xml_escape("tab\tnew\nline"), "tab\tnew\nline");
}

TEST(HeatmapSvg, ColourScaleWithTicks) {
  const Tensor<float, 2> w = ramp(2, 2);
  std::string svg = attention_heatmap_svg(w, {}, {});
  EXPECT_EQ(count(svg, "<linearGradient"), 1u);
  EXPECT_EQ(count(svg, "class=\"scale\""), 1u);
  EXPECT_EQ(count(svg, "class=\"tick\""), 5u);
  for (const char* tick : {">0<", ">0.25<", ">0.5<", ">0.75<", ">1<"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
  EXPECT_NE(svg.find(">weight</text>"), std::string::npos);

  HeatmapOptions opts;
  opts.colour_min = -2;
  opts.colour_max = 2;
  svg = attention_heatmap_svg(w, {}, {}, opts);
  for (const char* tick : {">-2<", ">-1<", ">0<", ">1<", ">2<"}) EXPECT_NE(svg.find(tick), std::string::npos) << tick;

  opts.auto_range = true;  // ramp(2, 2) holds 0.2, 0.4, 0.6, 0.8
  svg = attention_heatmap_svg(w, {}, {}, opts);
  for (const char* tick : {">0.2<", ">0.35<", ">0.5<", ">0.65<", ">0.8<"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick;
}

TEST(HeatmapSvg, ColoursFollowTheMapAndClampToTheRange) {
  Tensor<float, 2> w({1, 3});
  w(0, 0) = 0.0f;
  w(0, 1) = 1.0f;
  w(0, 2) = 5.0f;  // beyond colour_max: clamped to the last colour
  const auto fills = [](const std::string& svg) {
    std::vector<std::string> out;
    const std::regex cell("<rect class=\"cell\"[^>]* fill=\"(#[0-9a-f]{6})\"");
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), cell); it != std::sregex_iterator(); ++it)
      out.push_back((*it)[1]);
    return out;
  };
  HeatmapOptions opts;
  for (ColourMap map : {ColourMap::blues, ColourMap::viridis}) {
    opts.colour_map = map;
    const std::vector<std::string> f = fills(attention_heatmap_svg(w, {}, {}, opts));
    ASSERT_EQ(f.size(), 3u);
    EXPECT_EQ(f[0], detail::hex_colour(detail::colour_at(map, 0.0)));
    EXPECT_EQ(f[1], detail::hex_colour(detail::colour_at(map, 1.0)));
    EXPECT_EQ(f[2], f[1]);
    EXPECT_NE(f[0], f[1]);
  }
  // Sequential: darker (blues) or lighter (viridis) all the way, sample by sample.
  const auto light = [](const detail::Rgb& c) { return 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b; };
  for (int k = 1; k <= 20; ++k) {
    EXPECT_LT(light(detail::colour_at(ColourMap::blues, k / 20.0)),
              light(detail::colour_at(ColourMap::blues, (k - 1) / 20.0)));
    EXPECT_GT(light(detail::colour_at(ColourMap::viridis, k / 20.0)),
              light(detail::colour_at(ColourMap::viridis, (k - 1) / 20.0)));
  }
}

// ---- Masked and NaN cells -------------------------------------------------------------------------------

TEST(HeatmapSvg, ExactZerosDrawnMaskedOnRequest) {
  Tensor<float, 2> w({3, 3});  // lower triangle: a causal pattern
  for (Index i = 0; i < 3; ++i)
    for (Index j = 0; j <= i; ++j) w(i, j) = 1.0f / static_cast<float>(i + 1);
  std::string svg = attention_heatmap_svg(w, {}, {});
  EXPECT_EQ(count(svg, "class=\"cell masked\""), 0u);
  EXPECT_EQ(svg.find(">masked</text>"), std::string::npos) << "no swatch without masked cells";
  HeatmapOptions opts;
  opts.zero_is_masked = true;
  svg = attention_heatmap_svg(w, {}, {}, opts);
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(count(svg, "class=\"cell masked\""), 3u);
  EXPECT_EQ(count(svg, "<rect class=\"cell"), 9u);
  EXPECT_NE(svg.find(">masked</text>"), std::string::npos);
  EXPECT_EQ(count(svg, ">0.00</text>"), 0u) << "a masked cell's 0 is not printed";
}

TEST(HeatmapSvg, MaskFromAllowedTensorWithBroadcast) {
  Tensor<float, 4> w({2, 2, 3, 4});
  w.fill(0.25f);
  Tensor<bool, 4> allowed({1, 1, 1, 4});  // broadcast over batch, heads and queries: key 1 and 3 masked
  allowed(0, 0, 0, 0) = true;
  allowed(0, 0, 0, 2) = true;
  HeatmapOptions opts;
  opts.allowed = allowed;
  const std::string one = attention_heatmap_svg(w, 1, 1, {}, {}, opts);
  EXPECT_EQ(xml_error(one), "");
  EXPECT_EQ(count(one, "class=\"cell masked\""), 6u);
  EXPECT_EQ(count(attention_heads_svg(w, 0, {}, {}, opts), "class=\"cell masked\""), 12u);
  Tensor<bool, 4> per_head({1, 2, 3, 4});  // head 0 all allowed, head 1 none
  for (Index n = 0; n < 12; ++n) per_head.data()[n] = true;
  opts.allowed = per_head;
  EXPECT_EQ(count(attention_heatmap_svg(w, 0, 0, {}, {}, opts), "class=\"cell masked\""), 0u);
  EXPECT_EQ(count(attention_heatmap_svg(w, 0, 1, {}, {}, opts), "class=\"cell masked\""), 12u);
  Tensor<bool, 4> matrix_mask({1, 1, 3, 4});  // for a (Lq, Lk) matrix
  matrix_mask(0, 0, 2, 3) = true;
  opts.allowed = matrix_mask;
  Tensor<float, 2> m({3, 4});
  EXPECT_EQ(count(attention_heatmap_svg(m, {}, {}, opts), "class=\"cell masked\""), 11u);
}

TEST(HeatmapSvg, NanAndInfinityAreMarkedNeverFatal) {
  Tensor<float, 2> w = ramp(3, 3);
  w(1, 1) = std::numeric_limits<float>::quiet_NaN();
  w(2, 2) = std::numeric_limits<float>::infinity();
  w(0, 2) = -std::numeric_limits<float>::infinity();
  for (bool auto_range : {false, true}) {
    HeatmapOptions opts;
    opts.auto_range = auto_range;
    const std::string svg = attention_heatmap_svg(w, {}, {}, opts);
    EXPECT_EQ(xml_error(svg), "");
    EXPECT_EQ(count(svg, "class=\"cell nan\""), 1u);
    EXPECT_EQ(count(svg, "<rect class=\"cell"), 9u);
    EXPECT_NE(svg.find(">NaN</text>"), std::string::npos);
    EXPECT_EQ(count(svg, ">NaN</text>"), 2u) << "the cell and its legend swatch";
    EXPECT_NE(svg.find(">inf</text>"), std::string::npos);
    EXPECT_NE(svg.find(">-inf</text>"), std::string::npos);
    for (const char* number : {"=\"nan", "=\"-nan", "=\"inf", "=\"-inf", "=\"NaN"})
      EXPECT_EQ(svg.find(number), std::string::npos) << "no " << number << " in a coordinate or colour";
  }
  HeatmapOptions opts;  // no finite value at all: auto_range falls back to [0, 1]
  opts.auto_range = true;
  Tensor<double, 2> all_nan({2, 2});
  all_nan.fill(std::numeric_limits<double>::quiet_NaN());
  const std::string svg = attention_heatmap_svg(all_nan, {}, {}, opts);
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(count(svg, "class=\"cell nan\""), 4u);
}

TEST(HeatmapSvg, EmptyLabelsAreNumberedAndEmptyMatricesDraw) {
  const std::string svg = attention_heatmap_svg(ramp(2, 3), {}, {});
  for (const char* label : {">0</text>", ">1</text>", ">2</text>"}) EXPECT_NE(svg.find(label), std::string::npos);
  Tensor<float, 2> empty({0, 3});
  const std::string none = attention_heatmap_svg(empty, {}, {"a", "b", "c"});
  EXPECT_EQ(xml_error(none), "");
  EXPECT_EQ(count(none, "<rect class=\"cell"), 0u);
}

TEST(HeatmapSvg, PanelsShareOneScaleAndKeepTheirEmphasis) {
  HeatmapPanel top = make_heatmap_panel(ramp(2, 4), {"head 0", "head 1"}, numbered("w", 4), "rows");
  top.bold_column_labels = {1};
  HeatmapPanel full = make_heatmap_panel(ramp(4, 4), numbered("w", 4), numbered("w", 4), "full");
  full.outlined_rows = {2};
  full.outlined_columns = {0, 3};
  full.masked.assign(16, false);
  full.masked[5] = true;
  HeatmapOptions opts;
  opts.grid_columns = 1;
  const std::string svg = heatmap_panels_svg({top, full}, opts);
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(count(svg, "<rect class=\"cell"), 8u + 16u);
  EXPECT_EQ(count(svg, "class=\"cell masked\""), 1u);
  EXPECT_EQ(count(svg, "class=\"outline\""), 3u);
  EXPECT_EQ(count(svg, "font-weight=\"bold\">w1</text>"), 1u);
  EXPECT_EQ(count(svg, "class=\"scale\""), 1u);
  // One column of panels: both grids start at the same x.
  const std::regex first("<rect class=\"cell\" x=\"([0-9.]+)\" y=\"([0-9.]+)\"");
  std::set<std::string> xs;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), first); it != std::sregex_iterator(); ++it)
    xs.insert((*it)[1]);
  EXPECT_EQ(xs.size(), 4u) << "four distinct column positions shared by both panels";
}

// ---- Errors ---------------------------------------------------------------------------------------------

template <typename Error, typename F>
void expect_error(F&& f, const std::vector<std::string>& fragments) {
  try {
    f();
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    for (const std::string& fragment : fragments)
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what() << " lacks " << fragment;
  }
}

TEST(HeatmapErrors, WrongLabelCountsNameTheArgument) {
  const Tensor<float, 2> w = ramp(3, 4);
  expect_error<ShapeError>([&] { attention_heatmap_svg(w, numbered("q", 2), numbered("k", 4)); },
                           {"[attention_heatmap_svg]", "query_labels", "expected 3", "got 2"});
  expect_error<ShapeError>([&] { attention_heatmap_svg(w, numbered("q", 3), numbered("k", 5)); },
                           {"key_labels", "expected 4", "got 5"});
  Tensor<float, 4> w4({1, 2, 3, 4});
  expect_error<ShapeError>([&] { attention_heads_svg(w4, 0, numbered("q", 4), {}); },
                           {"[attention_heads_svg]", "query_labels"});
  expect_error<ShapeError>([&] { attention_heatmap_svg(w4, 0, 1, {}, numbered("k", 3)); },
                           {"key_labels", "expected 4"});
  expect_error<ShapeError>([&] { attention_csv(w, numbered("q", 1), {}); }, {"[attention_csv]", "query_labels"});
  expect_error<ShapeError>([&] { attention_csv(w4, 0, 0, {}, numbered("k", 9)); }, {"key_labels", "got 9"});
  expect_error<ShapeError>([&] { make_heatmap_panel(w, numbered("q", 4)); }, {"[make_heatmap_panel]", "row_labels"});
}

TEST(HeatmapErrors, IndicesShapesAndOptions) {
  Tensor<float, 4> w4({2, 3, 4, 4});
  expect_error<std::invalid_argument>([&] { attention_heatmap_svg(w4, 2, 0, {}, {}); }, {"batch", "[0, 2)", "got 2"});
  expect_error<std::invalid_argument>([&] { attention_heatmap_svg(w4, 0, -1, {}, {}); }, {"head", "[0, 3)"});
  expect_error<std::invalid_argument>([&] { attention_heads_svg(w4, 5, {}, {}); }, {"batch"});
  expect_error<std::invalid_argument>([&] { attention_csv(w4, 0, 3); }, {"head"});

  Tensor<bool, 4> wrong({1, 1, 4, 3});
  HeatmapOptions opts;
  opts.allowed = wrong;
  expect_error<ShapeError>([&] { attention_heatmap_svg(w4, 0, 0, {}, {}, opts); }, {"options.allowed", "(1, 1, 4, 3)"});
  expect_error<std::invalid_argument>([&] { heatmap_panels_svg({}, opts); }, {"options.allowed"});

  const Tensor<float, 2> w = ramp(2, 2);
  const auto bad = [&](auto change, const std::string& name) {
    HeatmapOptions o;
    change(o);
    expect_error<std::invalid_argument>([&] { attention_heatmap_svg(w, {}, {}, o); }, {name});
  };
  bad([](HeatmapOptions& o) { o.cell_size = 0; }, "options.cell_size");
  bad([](HeatmapOptions& o) { o.cell_size = std::numeric_limits<double>::quiet_NaN(); }, "options.cell_size");
  bad([](HeatmapOptions& o) { o.decimals = 9; }, "options.decimals");
  bad([](HeatmapOptions& o) { o.colour_min = 1; }, "options.colour_min");
  bad([](HeatmapOptions& o) { o.colour_max = std::numeric_limits<double>::infinity(); }, "options.colour_min");
  bad([](HeatmapOptions& o) { o.grid_columns = -1; }, "options.grid_columns");

  HeatmapPanel p = make_heatmap_panel(w);
  p.values.pop_back();
  expect_error<ShapeError>([&] { heatmap_panels_svg({p}); }, {"panels[0].values", "expected 4", "got 3"});
  p = make_heatmap_panel(w);
  p.outlined_rows = {2};
  expect_error<std::invalid_argument>([&] { heatmap_panels_svg({p}); }, {"panels[0].outlined_rows", "index 2"});
  p = make_heatmap_panel(w);
  p.masked = {true};
  expect_error<ShapeError>([&] { heatmap_panels_svg({p}); }, {"panels[0].masked"});
}

// ---- CSV ------------------------------------------------------------------------------------------------

// RFC 4180 reader: fields separated by commas, records by CRLF; a quoted field may hold commas, CR, LF and
// doubled quotes. Fails the test on a malformed quote.
std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> records(1);
  std::string field;
  bool quoted = false, was_quoted = false;
  for (std::size_t at = 0; at < text.size(); ++at) {
    const char c = text[at];
    if (quoted) {
      if (c == '"' && at + 1 < text.size() && text[at + 1] == '"')
        field += '"', ++at;
      else if (c == '"')
        quoted = false;
      else
        field += c;
    } else if (c == '"') {
      EXPECT_TRUE(field.empty() && !was_quoted) << "quote inside an unquoted field at byte " << at;
      quoted = was_quoted = true;
    } else if (c == ',') {
      records.back().push_back(field);
      field.clear();
      was_quoted = false;
    } else if (c == '\r' && at + 1 < text.size() && text[at + 1] == '\n') {
      records.back().push_back(field);
      field.clear();
      was_quoted = false;
      records.emplace_back();
      ++at;
    } else {
      EXPECT_NE(c, '\n') << "bare LF outside quotes at byte " << at;
      field += c;
    }
  }
  EXPECT_FALSE(quoted) << "unterminated quoted field";
  EXPECT_TRUE(records.back().empty() && field.empty()) << "the last record must end in CRLF";
  records.pop_back();
  return records;
}

TEST(HeatmapCsv, RoundTripWithQuotedLabels) {
  Tensor<float, 2> w({3, 4});
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (Index n = 0; n < w.size(); ++n) w.data()[n] = u(rng) / 3.0f;
  w(0, 0) = 1e-30f;  // tiny and exact values must come back bit for bit
  w(2, 3) = 0.0f;
  const std::vector<std::string> queries{"plain", "comma, inside", "quote \" inside"};
  const std::vector<std::string> keys{"line\nbreak", "cr\rhere", "<eos>", "\"all quoted\""};
  const std::string csv = attention_csv(w, queries, keys);
  const auto records = parse_csv(csv);
  ASSERT_EQ(records.size(), 4u);
  ASSERT_EQ(records[0].size(), 5u);
  EXPECT_EQ(records[0][0], "");
  for (std::size_t j = 0; j < keys.size(); ++j) EXPECT_EQ(records[0][j + 1], keys[j]);
  for (std::size_t i = 0; i < queries.size(); ++i) {
    ASSERT_EQ(records[i + 1].size(), 5u);
    EXPECT_EQ(records[i + 1][0], queries[i]);
    for (std::size_t j = 0; j < keys.size(); ++j) {
      const float back = std::strtof(records[i + 1][j + 1].c_str(), nullptr);
      EXPECT_EQ(back, w(static_cast<Index>(i), static_cast<Index>(j))) << records[i + 1][j + 1];
    }
  }
  EXPECT_NE(csv.find("\"comma, inside\""), std::string::npos);
  EXPECT_NE(csv.find("\"quote \"\" inside\""), std::string::npos);
  EXPECT_NE(csv.find(",<eos>,"), std::string::npos) << "no quotes where none are needed";
}

TEST(HeatmapCsv, OneHeadOfATensorInDoubleAndNonFinite) {
  Tensor<double, 4> w({2, 2, 2, 3});
  for (Index n = 0; n < w.size(); ++n) w.data()[n] = 1.0 / static_cast<double>(n + 3);
  w(1, 0, 1, 2) = std::numeric_limits<double>::quiet_NaN();
  w(1, 0, 0, 1) = -std::numeric_limits<double>::infinity();
  const auto records = parse_csv(attention_csv(w, 1, 0, {"a", "b"}, {"x", "y", "z"}));
  ASSERT_EQ(records.size(), 3u);
  for (Index i = 0; i < 2; ++i)
    for (Index j = 0; j < 3; ++j) {
      const std::string& text = records[static_cast<std::size_t>(i + 1)][static_cast<std::size_t>(j + 1)];
      const double back = std::strtod(text.c_str(), nullptr);
      if (std::isnan(w(1, 0, i, j)))
        EXPECT_TRUE(std::isnan(back)) << text;
      else
        EXPECT_EQ(back, w(1, 0, i, j)) << text;
    }
  EXPECT_EQ(records[1][2], "-inf");
  EXPECT_EQ(records[2][3], "nan");
}

// ---- Files ----------------------------------------------------------------------------------------------

class HeatmapFiles : public test::ScratchDirectoryTest {
 protected:
  static void write(const std::string& file, const std::string& text) { std::ofstream(file, std::ios::binary) << text; }
};

TEST_F(HeatmapFiles, WritersWriteWhatTheFunctionsReturn) {
  Tensor<float, 4> w({1, 2, 3, 3});
  for (Index n = 0; n < w.size(); ++n) w.data()[n] = static_cast<float>(n % 5) / 5.0f;
  const std::vector<std::string> words{"a", "b", "c"};
  write_attention_heatmap_svg(path("one.svg"), w, 0, 1, words, words);
  EXPECT_EQ(read(path("one.svg")), attention_heatmap_svg(w, 0, 1, words, words));
  write_attention_heads_svg(path("all.svg"), w, 0, words, words);
  EXPECT_EQ(read(path("all.svg")), attention_heads_svg(w, 0, words, words));
  write_attention_csv(path("one.csv"), w, 0, 1, words, words);
  EXPECT_EQ(read(path("one.csv")), attention_csv(w, 0, 1, words, words));
  const Tensor<float, 2> m = ramp(3, 3);
  write_attention_heatmap_svg(path("m.svg"), m, words, words);
  EXPECT_EQ(read(path("m.svg")), attention_heatmap_svg(m, words, words));
  write_attention_csv(path("m.csv"), m);
  EXPECT_EQ(read(path("m.csv")), attention_csv(m));
  write_heatmap_panels_svg(path("p.svg"), {make_heatmap_panel(m)});
  EXPECT_EQ(read(path("p.svg")), heatmap_panels_svg({make_heatmap_panel(m)}));
}

TEST_F(HeatmapFiles, UnwritablePathThrowsAndBadInputWritesNothing) {
  const Tensor<float, 2> m = ramp(2, 2);
  const std::string missing = path("no/such/dir/out.svg");
  expect_error<std::runtime_error>([&] { write_attention_heatmap_svg(missing, m, {}, {}); },
                                   {"[write_attention_heatmap_svg]", missing});
  expect_error<std::runtime_error>([&] { write_attention_csv(path("no/such/dir/out.csv"), m); },
                                   {"write_attention_csv"});
  expect_error<ShapeError>([&] { write_attention_csv(path("bad.csv"), m, {"only one"}); }, {"query_labels"});
  EXPECT_FALSE(fs::exists(path("bad.csv")));
}

// ---- Rasterisation with rsvg-convert ----------------------------------------------------------------------
// SELFATTN_RSVG_CONVERT is the path CMake's find_program found at configure time (tests/CMakeLists.txt).

#ifdef SELFATTN_RSVG_CONVERT
constexpr const char* kRsvgConvert = SELFATTN_RSVG_CONVERT;
#else
constexpr const char* kRsvgConvert = "";
#endif

struct Png {
  bool signature = false;
  std::uintmax_t bytes = 0;
  std::uint32_t width = 0, height = 0;  // from the IHDR chunk
};

Png inspect_png(const std::string& file) {
  Png png;
  std::ifstream in(file, std::ios::binary);
  unsigned char head[24] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  if (in.gcount() != static_cast<std::streamsize>(sizeof head)) return png;
  static const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  png.signature = std::equal(signature, signature + 8, head) && std::equal(head + 12, head + 16, "IHDR");
  const auto be32 = [&](int at) {
    return std::uint32_t{head[at]} << 24 | std::uint32_t{head[at + 1]} << 16 | std::uint32_t{head[at + 2]} << 8 |
           std::uint32_t{head[at + 3]};
  };
  png.width = be32(16);
  png.height = be32(20);
  png.bytes = fs::file_size(file);
  return png;
}

class HeatmapRaster : public HeatmapFiles {
 protected:
  void SetUp() override {
    if (std::string(kRsvgConvert).empty())
      GTEST_SKIP() << "rsvg-convert was not found when CMake configured (Debian: apt-get install librsvg2-bin); "
                      "re-run cmake after installing it";
    HeatmapFiles::SetUp();
  }
  // Exit status of `rsvg-convert -o png svg`, its messages in a log beside the files.
  int rasterise(const std::string& svg, const std::string& png) const {
    const std::string command =
        std::string("'") + kRsvgConvert + "' -o '" + png + "' '" + svg + "' 2>'" + path("rsvg.log") + "'";
    return std::system(command.c_str());
  }
  // Writes `svg` to a file, rasterises it, and checks the PNG: signature, size, and pixel dimensions.
  void expect_rasterises(const std::string& svg, const std::string& stem) {
    write(path(stem + ".svg"), svg);
    ASSERT_EQ(rasterise(path(stem + ".svg"), path(stem + ".png")), 0) << read(path("rsvg.log"));
    ASSERT_TRUE(fs::exists(path(stem + ".png")));
    const Png png = inspect_png(path(stem + ".png"));
    EXPECT_TRUE(png.signature);
    EXPECT_GT(png.bytes, 2000u) << "a heatmap with text is not a few bytes";
    EXPECT_EQ(png.width, static_cast<std::uint32_t>(svg_attribute(svg, "width")));
    EXPECT_EQ(png.height, static_cast<std::uint32_t>(svg_attribute(svg, "height")));
  }
};

TEST_F(HeatmapRaster, RendersEveryKindOfPicture) {
  Tensor<float, 4> w({1, 4, 5, 5});
  for (Index h = 0; h < 4; ++h)
    for (Index i = 0; i < 5; ++i)
      for (Index j = 0; j <= i; ++j) w(0, h, i, j) = 1.0f / static_cast<float>(i + 1);
  w(0, 3, 4, 0) = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::string> words{"<bos>", "a&b", "caf\xC3\xA9", "\"it\"", "a much longer token label"};
  HeatmapOptions opts;
  opts.title = "escaped <title> & labels";
  opts.zero_is_masked = true;
  expect_rasterises(attention_heatmap_svg(w, 0, 1, words, words, opts), "one");
  opts.colour_map = ColourMap::viridis;
  opts.show_values = false;
  opts.cell_size = 24;
  expect_rasterises(attention_heads_svg(w, 0, words, words, opts), "grid");
  HeatmapPanel p = make_heatmap_panel(ramp(2, 5), {"head 0", "head 1"}, words, "panel");
  p.outlined_rows = {1};
  expect_rasterises(heatmap_panels_svg({p, make_heatmap_panel(ramp(5, 5), words, words)}), "panels");
}

TEST_F(HeatmapRaster, BrokenSvgFails) {
  // The check can fail: the same picture with one label written raw (what an unescaped "<eos>" produces),
  // or cut in half, is refused.
  const std::string good = attention_heatmap_svg(ramp(2, 2), {"<eos>", "b"}, {"c", "d"});
  expect_rasterises(good, "good");
  std::string raw = good;
  const std::size_t at = raw.find("&lt;eos&gt;");
  ASSERT_NE(at, std::string::npos);
  raw.replace(at, 11, "<eos>");
  EXPECT_NE(xml_error(raw), "") << "our checker sees it too";
  write(path("raw.svg"), raw);
  EXPECT_NE(rasterise(path("raw.svg"), path("raw.png")), 0);
  write(path("cut.svg"), good.substr(0, good.size() / 2));
  EXPECT_NE(xml_error(good.substr(0, good.size() / 2)), "");
  EXPECT_NE(rasterise(path("cut.svg"), path("cut.png")), 0);
}

}  // namespace
