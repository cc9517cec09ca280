// A small, dependency-free SVG line/scatter plotter for benchmark and training reports: one x-y
// panel with linear or log axes, ticks, a legend and distinct colours per series. It deliberately
// does not do subplots, error bars, or text layout beyond simple label placement: anything fancier
// belongs in a notebook reading the JSON the same command writes.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace zaya {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
  bool line = true;  // false: a scatter series (points only)
};

struct PlotSpec {
  std::string title, xlabel, ylabel;
  bool logx = false, logy = false;
  std::vector<PlotSeries> series;
  // Byte axes: tick labels like 8B, 1K, 1M, 1G, and on a log axis ticks at powers of 2.
  bool xbytes = false, ybytes = false;
  // Optional tick label formatters, overriding the above (empty: format_tick_number).
  std::function<std::string(double)> xformat, yformat;
  int width = 800, height = 500;
};

// "1.5", "200", "1e+06", "0.001": short, for tick labels.
std::string format_tick_number(double v);
// Binary-prefixed byte counts: 8 -> "8B", 1024 -> "1K", 3<<20 -> "3M", 1<<30 -> "1G".
std::string format_tick_bytes(double v);

// Renders the plot. Non-finite points, and non-positive ones on a log axis, are skipped (a series
// left with no points still appears in the legend). Throws zaya::Error when a series' x and y
// differ in length.
std::string render_svg(const PlotSpec& spec);
// Writes render_svg(spec) to `path` atomically (a temporary file in the same folder, then rename),
// so a reader never sees half a plot. Throws zaya::Error naming the path on failure.
void write_svg(const std::string& path, const PlotSpec& spec);

// Writes `content` to `path` via temp+rename; shared by the report writers (JSON, CSV, SVG).
void write_text_file_atomic(const std::string& path, const std::string& content);

}  // namespace zaya
