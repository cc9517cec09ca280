// Tests of the SVG plotter: tick labels, log/linear axis layout, escaping, scatter vs line series,
// input validation and the atomic file write.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/plot.h"

namespace zaya {
namespace {

int count(const std::string& s, const std::string& needle) {
  int n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

TEST(Plot, ByteTickLabels) {
  EXPECT_EQ(format_tick_bytes(8), "8B");
  EXPECT_EQ(format_tick_bytes(1024), "1K");
  EXPECT_EQ(format_tick_bytes(3 << 20), "3M");
  EXPECT_EQ(format_tick_bytes(1ull << 30), "1G");
  EXPECT_EQ(format_tick_bytes(1536), "1.5K");
  EXPECT_EQ(format_tick_number(0), "0");
  EXPECT_EQ(format_tick_number(200), "200");
  EXPECT_EQ(format_tick_number(0.25), "0.25");
}

TEST(Plot, LogByteAxisTicksArePowersOfTwo) {
  PlotSpec p;
  p.title = "bw";
  p.logx = true;
  p.xbytes = true;
  p.series.push_back({"2 ranks", {8, 64, 1024, 1 << 20}, {0.1, 1, 10, 100}});
  const std::string svg = render_svg(p);
  // 8B..1M is 2^3..2^20: 17 exponents, thinned to a step of 2 -> labels 8B, 32B, 128B, ...
  EXPECT_NE(svg.find(">8B<"), std::string::npos);
  EXPECT_NE(svg.find(">32B<"), std::string::npos);
  EXPECT_NE(svg.find(">2K<"), std::string::npos);
  EXPECT_EQ(svg.find(">16B<"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 1);
  EXPECT_EQ(count(svg, "<circle"), 4);
  // Linear y axis of non-negative data starts at zero.
  EXPECT_NE(svg.find(">0<"), std::string::npos);
}

TEST(Plot, ScatterSeriesAndEscaping) {
  PlotSpec p;
  p.title = "a<b & c";
  p.series.push_back({"pts \"x\"", {1, 2, 3}, {3, 1, 2}, false});
  p.series.push_back({"line", {1, 3}, {0, 4}});
  const std::string svg = render_svg(p);
  EXPECT_NE(svg.find("a&lt;b &amp; c"), std::string::npos);
  EXPECT_NE(svg.find("pts &quot;x&quot;"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 1);  // only the line series
  EXPECT_NE(svg.find("#1f77b4"), std::string::npos);
  EXPECT_NE(svg.find("#ff7f0e"), std::string::npos);  // distinct colour for the second series
}

TEST(Plot, SkipsNonPositiveOnLogAxisAndRejectsRaggedSeries) {
  PlotSpec p;
  p.logy = true;
  p.series.push_back({"s", {1, 2, 3}, {0, -1, 10}});
  const std::string svg = render_svg(p);
  EXPECT_EQ(count(svg, "<circle"), 1);
  p.series.push_back({"bad", {1, 2}, {1}});
  EXPECT_THROW(render_svg(p), Error);
}

TEST(Plot, WriteSvgIsAtomicAndReportsBadPath) {
  const auto dir = std::filesystem::temp_directory_path() / "zaya_plot_test";
  std::filesystem::create_directories(dir);
  const auto path = (dir / "p.svg").string();
  PlotSpec p;
  p.series.push_back({"s", {1, 2}, {1, 2}});
  write_svg(path, p);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_EQ(ss.str(), render_svg(p));
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "p.svg");  // no temp files left behind
  EXPECT_THROW(write_svg((dir / "no/such/dir/p.svg").string(), p), Error);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace zaya
