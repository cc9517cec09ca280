// SVG rendering for zaya::PlotSpec. The output is plain SVG 1.1 text with no scripts or external
// fonts, so it opens in any browser and diffs reasonably. Tick placement: "nice" 1/2/5 steps on
// linear axes, powers of 10 (or of 2 for byte axes) on log axes, thinned to at most ~10 labels.
#include "core/plot.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace zaya {

namespace {

// Matplotlib's tab10: distinct and readable on white; cycles after ten series.
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string xml_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

struct Axis {
  bool log = false;
  bool bytes = false;
  double lo = 0, hi = 1;  // data-space range shown
  std::vector<double> ticks;
  std::function<std::string(double)> fmt;

  double t(double v) const { return log ? std::log10(v) : v; }
  // Maps v to [0,1] along the axis.
  double frac(double v) const {
    const double a = t(lo), b = t(hi);
    return b > a ? (t(v) - a) / (b - a) : 0.5;
  }
  std::string label(double v) const {
    if (fmt) return fmt(v);
    return bytes ? format_tick_bytes(v) : format_tick_number(v);
  }
};

double nice_step(double span, int target) {
  const double raw = span / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag * (1 + 1e-9)) return m * mag;
  return 10 * mag;
}

void setup_axis(Axis& ax, double dmin, double dmax, bool include_zero) {
  if (!(dmin <= dmax)) {  // no finite data: a placeholder range
    dmin = ax.log ? 1 : 0;
    dmax = ax.log ? 10 : 1;
  }
  if (ax.log) {
    const double base = ax.bytes ? 2.0 : 10.0;
    const double lb = std::log(base);
    double e0 = std::floor(std::log(dmin) / lb + 1e-9), e1 = std::ceil(std::log(dmax) / lb - 1e-9);
    if (e1 <= e0) e1 = e0 + 1;
    ax.lo = std::pow(base, e0);
    ax.hi = std::pow(base, e1);
    // Thin so at most ~10 ticks; a byte axis steps by whole exponents so labels stay round.
    const int n = int(e1 - e0);
    const int step = std::max(1, (n + 9) / 10);
    for (double e = e0; e <= e1 + 1e-9; e += step) ax.ticks.push_back(std::pow(base, e));
    // Under one decade on a base-10 axis there would be only two ticks: add 2x and 5x marks.
    if (!ax.bytes && n == 1) {
      ax.ticks = {ax.lo, 2 * ax.lo, 5 * ax.lo, ax.hi};
    }
    return;
  }
  if (include_zero) {
    dmin = std::min(dmin, 0.0);
    dmax = std::max(dmax, 0.0);
  }
  if (dmax == dmin) {
    const double pad = dmin == 0 ? 1 : std::fabs(dmin) * 0.1;
    dmin -= pad;
    dmax += pad;
  }
  const double step = nice_step(dmax - dmin, 6);
  ax.lo = std::floor(dmin / step + 1e-9) * step;
  ax.hi = std::ceil(dmax / step - 1e-9) * step;
  for (double v = ax.lo; v <= ax.hi + step * 1e-6; v += step)
    ax.ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
}

bool usable(double v, bool log) {
  return std::isfinite(v) && (!log || v > 0);
}

}  // namespace

std::string format_tick_number(double v) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e6 || a < 1e-3) return fmt::format("{:.3g}", v);
  // %g with enough digits but trimmed: 0.25, 1.5, 200, 12500.
  return fmt::format("{:.6g}", v);
}

std::string format_tick_bytes(double v) {
  static const char* units[] = {"B", "K", "M", "G", "T", "P"};
  double a = v;
  int u = 0;
  while (std::fabs(a) >= 1024 && u < 5) {
    a /= 1024;
    ++u;
  }
  if (a == std::floor(a)) return fmt::format("{}{}", int64_t(a), units[u]);
  return fmt::format("{:.3g}{}", a, units[u]);
}

std::string render_svg(const PlotSpec& spec) {
  Axis ax, ay;
  ax.log = spec.logx;
  ay.log = spec.logy;
  ax.bytes = spec.xbytes;
  ay.bytes = spec.ybytes;
  ax.fmt = spec.xformat;
  ay.fmt = spec.yformat;
  const double inf = std::numeric_limits<double>::infinity();
  double xmin = inf, xmax = -inf, ymin = inf, ymax = -inf;
  for (const auto& s : spec.series) {
    ZAYA_CHECK(s.x.size() == s.y.size(), "plot '{}': series '{}' has {} x values but {} y values",
               spec.title, s.label, s.x.size(), s.y.size());
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s.x[i], ax.log) || !usable(s.y[i], ay.log)) continue;
      xmin = std::min(xmin, s.x[i]);
      xmax = std::max(xmax, s.x[i]);
      ymin = std::min(ymin, s.y[i]);
      ymax = std::max(ymax, s.y[i]);
    }
  }
  setup_axis(ax, xmin, xmax, false);
  setup_axis(ay, ymin, ymax, ymin >= 0);

  const int W = std::max(300, spec.width), H = std::max(200, spec.height);
  const bool legend = !spec.series.empty();
  const double L = 80, R = legend ? 190 : 30, T = 40, B = 60;
  const double pw = W - L - R, ph = H - T - B;
  auto px = [&](double v) { return L + ax.frac(v) * pw; };
  auto py = [&](double v) { return T + (1 - ay.frac(v)) * ph; };

  std::string o;
  o += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n",
      W, H, W, H);
  o += fmt::format("<rect width=\"{}\" height=\"{}\" fill=\"white\"/>\n", W, H);
  o +=
      fmt::format("<text x=\"{:.1f}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n",
                  L + pw / 2, xml_escape(spec.title));
  // Grid and ticks.
  for (double v : ax.ticks) {
    const double x = px(v);
    o += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#e0e0e0\"/>\n",
        x, T, T + ph);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", x,
                     T + ph + 16, xml_escape(ax.label(v)));
  }
  for (double v : ay.ticks) {
    const double y = py(v);
    o += fmt::format(
        "<line x1=\"{1:.1f}\" y1=\"{0:.1f}\" x2=\"{2:.1f}\" y2=\"{0:.1f}\" stroke=\"#e0e0e0\"/>\n",
        y, L, L + pw);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", L - 6,
                     y + 4, xml_escape(ay.label(v)));
  }
  o += fmt::format(
      "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"none\" "
      "stroke=\"black\"/>\n",
      L, T, pw, ph);
  o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n", L + pw / 2,
                   H - 16.0, xml_escape(spec.xlabel));
  o += fmt::format(
      "<text x=\"18\" y=\"{0:.1f}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0:.1f})\">{1}"
      "</text>\n",
      T + ph / 2, xml_escape(spec.ylabel));

  // Series, clipped to the plot area.
  o += fmt::format(
      "<clipPath id=\"plotarea\"><rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{:.1f}\"/>"
      "</clipPath>\n<g clip-path=\"url(#plotarea)\">\n",
      L, T, pw, ph);
  for (size_t si = 0; si < spec.series.size(); ++si) {
    const auto& s = spec.series[si];
    const char* c = kColors[si % std::size(kColors)];
    std::string pts;
    std::string marks;
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s.x[i], ax.log) || !usable(s.y[i], ay.log)) continue;
      const double x = px(s.x[i]), y = py(s.y[i]);
      pts += fmt::format("{:.1f},{:.1f} ", x, y);
      marks += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"{}\" fill=\"{}\"/>\n", x, y,
                           s.line ? 2 : 3, c);
    }
    if (s.line && !pts.empty()) {
      pts.pop_back();
      o += fmt::format(
          "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"1.8\"/>\n", pts, c);
    }
    o += marks;
  }
  o += "</g>\n";
  // Legend, to the right of the plot area.
  for (size_t si = 0; si < spec.series.size(); ++si) {
    const char* c = kColors[si % std::size(kColors)];
    const double y = T + 10 + 18.0 * si;
    const double x = L + pw + 14;
    if (spec.series[si].line)
      o += fmt::format(
          "<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"{}\" "
          "stroke-width=\"2\"/>\n",
          x, y, x + 20, y, c);
    else
      o += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x + 10, y, c);
    o += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n", x + 26, y + 4,
                     xml_escape(spec.series[si].label));
  }
  o += "</svg>\n";
  return o;
}

void write_text_file_atomic(const std::string& path, const std::string& content) {
  ZAYA_CHECK(!path.empty(), "output path is empty");
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    ZAYA_CHECK(f.good(), "cannot write '{}' (cannot create '{}')", path, tmp);
    f.write(content.data(), std::streamsize(content.size()));
    f.flush();
    if (!f.good()) {
      std::remove(tmp.c_str());
      fail("cannot write '{}': write to '{}' failed", path, tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    fail("cannot write '{}': {}", path, ec.message());
  }
}

void write_svg(const std::string& path, const PlotSpec& spec) {
  write_text_file_atomic(path, render_svg(spec));
}

}  // namespace zaya
