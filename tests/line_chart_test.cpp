// Line charts (selfattn/plot/line_chart.hpp): the SVG is well-formed XML with one polyline per series, escaped
// labels and colours, points inside their plotting area at the right places on linear and log axes, ticks chosen
// or given (10^k labels on log axes of powers of ten), one legend entry per label; bad input is rejected with
// std::invalid_argument naming the argument; and rsvg-convert (Debian librsvg2-bin) rasterises what we write.
#include <gtest/gtest.h>

#include "support/expect_error.hpp"
#include "support/scratch_directory.hpp"
#include "support/svg_check.hpp"

#include <selfattn/plot/line_chart.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <regex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using namespace selfattn;
namespace fs = std::filesystem;

using test::count;
using test::expect_error;
using test::svg_attribute;
using test::xml_error;

struct Rect {
  double x = 0, y = 0, width = 0, height = 0;
};

std::vector<Rect> plot_areas(const std::string& svg) {
  std::vector<Rect> rects;
  const std::regex rect(
      "<rect class=\"plot\" x=\"([0-9.]+)\" y=\"([0-9.]+)\" width=\"([0-9.]+)\" height=\"([0-9.]+)\"");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), rect); it != std::sregex_iterator(); ++it)
    rects.push_back({std::stod((*it)[1]), std::stod((*it)[2]), std::stod((*it)[3]), std::stod((*it)[4])});
  return rects;
}

// The points of every polyline, in document order.
std::vector<std::vector<std::pair<double, double>>> polylines(const std::string& svg) {
  std::vector<std::vector<std::pair<double, double>>> lines;
  const std::regex polyline("<polyline class=\"series\" points=\"([^\"]*)\"");
  const std::regex point("(-?[0-9.]+),(-?[0-9.]+)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), polyline); it != std::sregex_iterator(); ++it) {
    const std::string points = (*it)[1];
    lines.emplace_back();
    for (auto p = std::sregex_iterator(points.begin(), points.end(), point); p != std::sregex_iterator(); ++p)
      lines.back().emplace_back(std::stod((*p)[1]), std::stod((*p)[2]));
  }
  return lines;
}

// The tick labels of one axis ("x" or "y"), as written (markup included), in document order.
std::vector<std::string> tick_labels(const std::string& svg, const std::string& axis) {
  std::vector<std::string> labels;
  const std::regex tick("class=\"tick " + axis + "\"[^>]*>(.*?)</text>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tick); it != std::sregex_iterator(); ++it)
    labels.push_back((*it)[1]);
  return labels;
}

LineSeries series(const std::string& label, std::vector<double> x, std::vector<double> y) {
  LineSeries s;
  s.label = label;
  s.x = std::move(x);
  s.y = std::move(y);
  return s;
}

LineChart simple_chart() {
  LineChart c;
  c.title = "a chart";
  c.x.label = "x axis";
  c.y.label = "y axis";
  c.series.push_back(series("rising", {0, 1, 2, 3}, {0, 1, 4, 9}));
  c.series.push_back(series("falling", {0, 1, 2, 3}, {9, 4, 1, 0}));
  return c;
}


// ---- SVG structure -------------------------------------------------------------------------------------

TEST(LineChartSvg, WellFormedWithOnePolylinePerSeries) {
  LineChart a = simple_chart(), b = simple_chart();
  b.title = "second chart";
  b.series[0].markers = true;
  b.series[1].dashed = true;
  b.references.push_back({5, "a bound"});
  LineChartOptions opts;
  opts.title = "the picture";
  const std::string svg = line_charts_svg({a, b}, opts);
  EXPECT_EQ(xml_error(svg), "");
  EXPECT_EQ(count(svg, "<svg "), 1u);
  EXPECT_EQ(count(svg, "<polyline class=\"series\""), 4u);
  EXPECT_EQ(count(svg, "<circle class=\"marker\""), 4u) << "one marker per point of the one series with markers";
  EXPECT_EQ(count(svg, "stroke-dasharray=\"6 4\""), 1u) << "the dashed series (its legend entry is the solid one's)";
  EXPECT_EQ(count(svg, "class=\"reference\""), 1u);
  EXPECT_EQ(plot_areas(svg).size(), 2u);
  for (const char* text : {">the picture</text>", ">a chart</text>", ">second chart</text>", ">x axis</text>",
                           ">y axis</text>", ">a bound</text>", "<title>the picture</title>"})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  EXPECT_EQ(count(svg, "class=\"legend\""), 2u) << "each label once, though it appears in both charts";
  opts.legend = false;
  EXPECT_EQ(count(line_charts_svg({a, b}, opts), "class=\"legend\""), 0u);
}

TEST(LineChartSvg, SeriesWithoutColourTakeThePalette) {
  LineChart c = simple_chart();
  c.series.push_back(series("", {0, 3}, {5, 5}));
  c.series[1].colour = "#123456";
  const std::string svg = line_charts_svg({c});
  EXPECT_NE(svg.find("stroke=\"" + std::string(line_chart_palette()[0]) + "\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#123456\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"" + std::string(line_chart_palette()[1]) + "\""), std::string::npos)
      << "the third series takes the palette's second colour: the second had its own";
  EXPECT_EQ(count(svg, "class=\"legend\""), 2u) << "the unlabelled series is not in the legend";
}

TEST(LineChartSvg, LabelsAndColoursAreEscaped) {
  LineChart c = simple_chart();
  c.title = "<b>bold</b> & \"quoted\"";
  c.x.label = "caf\xC3\xA9 d\xFF";  // valid UTF-8, then an invalid byte
  c.series[0].label = "q<k>";
  c.series[0].colour = "red\" onload=\"x";
  c.references.push_back({4, "a&b"});
  LineChartOptions opts;
  opts.title = "t<i>";
  const std::string svg = line_charts_svg({c}, opts);
  EXPECT_EQ(xml_error(svg), "");
  for (const char* text : {"&lt;b&gt;bold&lt;/b&gt; &amp; &quot;quoted&quot;", "caf\xC3\xA9 d\xEF\xBF\xBD",
                           ">q&lt;k&gt;</text>", ">a&amp;b</text>", "<title>t&lt;i&gt;</title>",
                           "stroke=\"red&quot; onload=&quot;x\""})
    EXPECT_NE(svg.find(text), std::string::npos) << text;
  EXPECT_EQ(svg.find("onload=\"x"), std::string::npos);
}

// ---- Axes ------------------------------------------------------------------------------------------------

TEST(LineChartAxes, PointsLandWhereTheRangeSays) {
  LineChart c;
  c.x.min = 0;
  c.x.max = 10;
  c.y.min = -1;
  c.y.max = 1;
  c.series.push_back(series("s", {0, 5, 10, 20}, {-1, 0, 1, 3}));  // the last point is outside: clamped
  const std::string svg = line_charts_svg({c});
  const Rect r = plot_areas(svg).at(0);
  const auto points = polylines(svg).at(0);
  ASSERT_EQ(points.size(), 4u);
  EXPECT_NEAR(points[0].first, r.x, 0.01);
  EXPECT_NEAR(points[0].second, r.y + r.height, 0.01) << "y = min at the bottom";
  EXPECT_NEAR(points[1].first, r.x + r.width / 2, 0.01);
  EXPECT_NEAR(points[1].second, r.y + r.height / 2, 0.01);
  EXPECT_NEAR(points[2].first, r.x + r.width, 0.01);
  EXPECT_NEAR(points[2].second, r.y, 0.01) << "y = max at the top";
  EXPECT_NEAR(points[3].first, r.x + r.width, 0.01) << "clamped to the border";
  EXPECT_NEAR(points[3].second, r.y, 0.01);
  EXPECT_LE(r.x + r.width, svg_attribute(svg, "width"));
  EXPECT_LE(r.y + r.height, svg_attribute(svg, "height"));
}

TEST(LineChartAxes, RangesFromTheDataEndOnTicks) {
  LineChart c;
  c.series.push_back(series("s", {0.3, 9.7}, {-0.42, 0.37}));
  const std::string svg = line_charts_svg({c});
  EXPECT_EQ(tick_labels(svg, "x"), (std::vector<std::string>{"0", "2", "4", "6", "8", "10"}));
  EXPECT_EQ(tick_labels(svg, "y"),
            (std::vector<std::string>{"\u22120.6", "\u22120.4", "\u22120.2", "0", "0.2", "0.4"}))
      << "steps of 1, 2 or 5 times a power of ten; minus signs as U+2212";
  const Rect r = plot_areas(svg).at(0);
  const auto points = polylines(svg).at(0);
  EXPECT_NEAR(points[0].first, r.x + r.width * 0.03, 0.01) << "0.3 on an axis from 0 to 10";
  EXPECT_NEAR(points[1].second, r.y + r.height * (1 - (0.37 + 0.6) / 1.0), 0.01) << "0.37 from -0.6 to 0.4";
  // All values equal: a range around them, not an error.
  LineChart flat;
  flat.series.push_back(series("s", {1, 2}, {3, 3}));
  EXPECT_EQ(xml_error(line_charts_svg({flat})), "");
}

TEST(LineChartAxes, LogTicksArePowersOfTenWithExponents) {
  LineChart c;
  c.y.scale = AxisScale::log;
  c.series.push_back(series("s", {0, 1, 2}, {3e-7, 1e-3, 0.5}));
  const std::string svg = line_charts_svg({c});
  const std::vector<std::string> y = tick_labels(svg, "y");
  ASSERT_EQ(y.size(), 8u) << "10^-7 to 10^0, from the data out to powers of ten";
  EXPECT_EQ(y.front(), "10<tspan dy=\"-6\" font-size=\"9\">\u22127</tspan>");
  EXPECT_EQ(y[4], "10<tspan dy=\"-6\" font-size=\"9\">\u22123</tspan>");
  EXPECT_EQ(y.back(), "1");
  const Rect r = plot_areas(svg).at(0);
  const auto points = polylines(svg).at(0);
  EXPECT_NEAR(points[1].second, r.y + r.height * (1 - 4.0 / 7.0), 0.01) << "1e-3 is 4 of 7 decades up";
}

TEST(LineChartAxes, LogAxisWithGivenTicksIsEvenlySpacedInRatio) {
  LineChart c;
  c.x.scale = AxisScale::log;
  c.x.ticks = {16, 32, 64, 128, 256, 512, 1024, 4096};  // 4096 is outside the data's range: not drawn
  c.x.min = 16;
  c.x.max = 1024;
  const std::vector<double> d{16, 32, 64, 128, 256, 512, 1024};
  c.series.push_back(series("s", d, {1, 2, 3, 4, 5, 6, 7}));
  const std::string svg = line_charts_svg({c});
  EXPECT_EQ(tick_labels(svg, "x"), (std::vector<std::string>{"16", "32", "64", "128", "256", "512", "1024"}))
      << "ticks that are not all powers of ten are written plainly";
  const auto points = polylines(svg).at(0);
  const double step = points[1].first - points[0].first;
  EXPECT_GT(step, 10);
  for (std::size_t i = 1; i < points.size(); ++i) EXPECT_NEAR(points[i].first - points[i - 1].first, step, 0.02);
  // Less than a decade of data without ticks: powers of two.
  LineChart narrow;
  narrow.x.scale = AxisScale::log;
  narrow.x.min = 3;
  narrow.x.max = 20;
  narrow.series.push_back(series("s", {3, 20}, {0, 1}));
  EXPECT_EQ(tick_labels(line_charts_svg({narrow}), "x"), (std::vector<std::string>{"4", "8", "16"}));
}

TEST(LineChartAxes, ChartsShareRowsAndAlignTheirPlottingAreas) {
  LineChart a = simple_chart(), b = simple_chart();
  b.y.min = 0;
  b.y.max = 2e6;  // wider tick labels than a's
  LineChartOptions opts;
  opts.charts_per_row = 1;
  opts.plot_width = 200;
  opts.plot_height = 100;
  const std::string svg = line_charts_svg({a, b, a}, opts);
  const std::vector<Rect> r = plot_areas(svg);
  ASSERT_EQ(r.size(), 3u);
  for (const Rect& area : r) {
    EXPECT_DOUBLE_EQ(area.x, r[0].x) << "one column: the plotting areas line up";
    EXPECT_DOUBLE_EQ(area.width, 200);
    EXPECT_DOUBLE_EQ(area.height, 100);
  }
  EXPECT_LT(r[0].y + r[0].height, r[1].y);
  EXPECT_LT(r[1].y + r[1].height, r[2].y);
  EXPECT_LE(r[2].y + r[2].height, svg_attribute(svg, "height"));
}

// ---- Errors ----------------------------------------------------------------------------------------------

TEST(LineChartErrors, BadInputNamesTheArgument) {
  using E = std::invalid_argument;
  expect_error<E>([] { line_charts_svg({}); }, {"[line_charts_svg]", "charts:", "at least one chart"});
  LineChart none;
  expect_error<E>([&] { line_charts_svg({simple_chart(), none}); }, {"charts[1].series:"});
  LineChart empty = simple_chart();
  empty.series[1].x.clear();
  empty.series[1].y.clear();
  expect_error<E>([&] { line_charts_svg({empty}); }, {"charts[0].series[1].x:"});
  LineChart mismatched = simple_chart();
  mismatched.series[1].y.pop_back();
  expect_error<E>([&] { line_charts_svg({mismatched}); }, {"charts[0].series[1].y:", "expected 4", "got 3"});
  LineChart nan = simple_chart();
  nan.series[0].x[2] = std::numeric_limits<double>::quiet_NaN();
  expect_error<E>([&] { line_charts_svg({nan}); }, {"charts[0].series[0].x:", "finite", "index 2"});
  LineChart infinite = simple_chart();
  infinite.series[0].y[0] = std::numeric_limits<double>::infinity();
  expect_error<E>([&] { line_charts_svg({infinite}); }, {"charts[0].series[0].y:", "inf"});
  LineChart log_min = simple_chart();
  log_min.y.scale = AxisScale::log;
  log_min.y.min = 0;
  expect_error<E>([&] { line_charts_svg({log_min}); }, {"charts[0].y.min:", "> 0"});
  LineChart log_data;
  log_data.x.scale = AxisScale::log;
  log_data.series.push_back(series("s", {-1, 0}, {1, 2}));
  expect_error<E>([&] { line_charts_svg({log_data}); }, {"charts[0].x:", "value > 0"});
  LineChart reversed = simple_chart();
  reversed.x.min = 5;
  reversed.x.max = 1;
  expect_error<E>([&] { line_charts_svg({reversed}); }, {"charts[0].x.min:", "min < max"});
  LineChartOptions opts;
  opts.plot_width = 10;
  expect_error<E>([&] { line_charts_svg({simple_chart()}, opts); }, {"options.plot_width"});
  opts = {};
  opts.charts_per_row = -1;
  expect_error<E>([&] { line_charts_svg({simple_chart()}, opts); }, {"options.charts_per_row"});
  expect_error<E>([] { write_line_charts_svg("unused.svg", {}); }, {"[write_line_charts_svg]", "charts"});
}

// ---- Files and rasterisation -----------------------------------------------------------------------------

class LineChartFiles : public test::ScratchDirectoryTest {
};

TEST_F(LineChartFiles, WriterWritesWhatTheFunctionReturns) {
  write_line_charts_svg(path("chart.svg"), {simple_chart()});
  EXPECT_EQ(read(path("chart.svg")), line_charts_svg({simple_chart()}));
  const std::string missing = path("no/such/dir/chart.svg");
  expect_error<std::runtime_error>([&] { write_line_charts_svg(missing, {simple_chart()}); },
                                   {"[write_line_charts_svg]", missing});
}

// SELFATTN_RSVG_CONVERT: the path CMake's find_program found at configure time (tests/CMakeLists.txt).
#ifdef SELFATTN_RSVG_CONVERT
constexpr const char* kRsvgConvert = SELFATTN_RSVG_CONVERT;
#else
constexpr const char* kRsvgConvert = "";
#endif

TEST_F(LineChartFiles, RsvgConvertRasterisesItAndRefusesABrokenCopy) {
  if (std::string(kRsvgConvert).empty())
    GTEST_SKIP() << "rsvg-convert was not found when CMake configured (Debian: apt-get install librsvg2-bin)";
  const auto rasterise = [&](const std::string& svg, const std::string& stem) {
    std::ofstream(path(stem + ".svg"), std::ios::binary) << svg;
    const std::string command = std::string("'") + kRsvgConvert + "' -o '" + path(stem + ".png") + "' '" +
                                path(stem + ".svg") + "' 2>'" + path("rsvg.log") + "'";
    return std::system(command.c_str());
  };
  LineChart log_chart = simple_chart();
  log_chart.title = "escaped <title> & \"labels\"";
  log_chart.x.scale = AxisScale::log;
  log_chart.x.min = 0.5;
  log_chart.y.scale = AxisScale::log;
  log_chart.y.min = 1e-3;
  log_chart.series[0].markers = true;
  log_chart.series[1].dashed = true;
  log_chart.references.push_back({2, "a <reference>"});
  LineChartOptions opts;
  opts.title = "two charts";
  const std::string good = line_charts_svg({simple_chart(), log_chart}, opts);
  ASSERT_EQ(rasterise(good, "good"), 0) << read(path("rsvg.log"));
  EXPECT_GT(fs::file_size(path("good.png")), 2000u) << "a chart with text is not a few bytes";
  std::string raw = good;  // a label written unescaped: what forgetting xml_escape would produce
  const std::size_t at = raw.find("&lt;reference&gt;");
  ASSERT_NE(at, std::string::npos);
  raw.replace(at, 17, "<reference>");
  EXPECT_NE(xml_error(raw), "");
  EXPECT_NE(rasterise(raw, "raw"), 0);
  EXPECT_NE(rasterise(good.substr(0, good.size() / 2), "cut"), 0);
}

}  // namespace
