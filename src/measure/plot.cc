#include "measure/plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace dsinfer::measure {
namespace {

// 5x7 glyphs (the classic character-LCD shapes): one byte per row, top to bottom, bit 4 is the
// leftmost column. Lower case is drawn as upper case; anything else missing as a box.
struct Glyph {
  char c;
  uint8_t rows[7];
};
constexpr Glyph kFont[] = {
    {' ', {0, 0, 0, 0, 0, 0, 0}},
    {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}},
    {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}},
    {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
    {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}},
    {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
    {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}},
    {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
    {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}},
    {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
    {'A', {0x0E, 0x11, 0x11, 0x11, 0x1F, 0x11, 0x11}},
    {'B', {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E}},
    {'C', {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E}},
    {'D', {0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C}},
    {'E', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F}},
    {'F', {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10}},
    {'G', {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F}},
    {'H', {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11}},
    {'I', {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
    {'J', {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C}},
    {'K', {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11}},
    {'L', {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F}},
    {'M', {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11}},
    {'N', {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11}},
    {'O', {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'P', {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10}},
    {'Q', {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D}},
    {'R', {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11}},
    {'S', {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E}},
    {'T', {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04}},
    {'U', {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E}},
    {'V', {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04}},
    {'W', {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A}},
    {'X', {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11}},
    {'Y', {0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04}},
    {'Z', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F}},
    {'.', {0, 0, 0, 0, 0, 0x0C, 0x0C}},
    {',', {0, 0, 0, 0, 0x0C, 0x04, 0x08}},
    {'-', {0, 0, 0, 0x1F, 0, 0, 0}},
    {'+', {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0}},
    {'=', {0, 0, 0x1F, 0, 0x1F, 0, 0}},
    {'/', {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0}},
    {':', {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0}},
    {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}},
    {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
    {'%', {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03}},
    {'_', {0, 0, 0, 0, 0, 0, 0x1F}},
};
constexpr uint8_t kMissingGlyph[7] = {0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F};

const uint8_t* GlyphRows(char c) {
  const char upper = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Glyph& g : kFont)
    if (g.c == upper) return g.rows;
  return kMissingGlyph;
}

// Draws into an IndexedImage; every write is clipped to the image.
class Canvas {
 public:
  Canvas(int width, int height) {
    image_.width = width;
    image_.height = height;
    image_.pixels.assign(static_cast<size_t>(width) * static_cast<size_t>(height), kPlotBackground);
    image_.palette = {{255, 255, 255}, {40, 40, 40},    {222, 222, 222},
                      {31, 119, 180},  {255, 127, 14},  {44, 160, 44},
                      {214, 39, 40},   {148, 103, 189}, {140, 86, 75}};
  }
  IndexedImage Take() { return std::move(image_); }

  void Set(int x, int y, uint8_t color) {
    if (x < 0 || y < 0 || x >= image_.width || y >= image_.height) return;
    image_.pixels[static_cast<size_t>(y) * static_cast<size_t>(image_.width) +
                  static_cast<size_t>(x)] = color;
  }
  void FillRect(int x0, int y0, int x1, int y1, uint8_t color) {  // inclusive corners
    for (int y = std::min(y0, y1); y <= std::max(y0, y1); ++y)
      for (int x = std::min(x0, x1); x <= std::max(x0, x1); ++x) Set(x, y, color);
  }
  // Bresenham's line with a square brush `thickness` pixels wide.
  void Line(int x0, int y0, int x1, int y1, uint8_t color, int thickness) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    const int lo = -(thickness - 1) / 2, hi = thickness / 2;
    int err = dx + dy;
    for (;;) {
      FillRect(x0 + lo, y0 + lo, x0 + hi, y0 + hi, color);
      if (x0 == x1 && y0 == y1) return;
      const int e2 = 2 * err;
      if (e2 >= dy) {
        err += dy;
        x0 += sx;
      }
      if (e2 <= dx) {
        err += dx;
        y0 += sy;
      }
    }
  }
  static int TextWidth(const std::string& text, int scale) {
    return text.empty() ? 0 : static_cast<int>(text.size()) * 6 * scale - scale;
  }
  // Top-left corner at (x, y); glyphs are 5x7 cells with one column of spacing.
  void Text(int x, int y, const std::string& text, uint8_t color, int scale) {
    for (char c : text) {
      const uint8_t* rows = GlyphRows(c);
      for (int r = 0; r < 7; ++r)
        for (int col = 0; col < 5; ++col)
          if (rows[r] & (0x10 >> col))
            FillRect(x + col * scale, y + r * scale, x + (col + 1) * scale - 1,
                     y + (r + 1) * scale - 1, color);
      x += 6 * scale;
    }
  }

 private:
  IndexedImage image_;
};

// The smallest 1, 2 or 5 x 10^k at or above v (v > 0).
double NiceCeil(double v) {
  const double p = std::pow(10.0, std::floor(std::log10(v)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p >= v * (1 - 1e-12)) return m * p;
  return 10 * p;
}

std::string FormatTick(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

}  // namespace

IndexedImage RenderLinePlot(const LinePlot& plot, int width, int height) {
  DSINFER_CHECK(width >= 200 && height >= 150);
  DSINFER_CHECK(static_cast<int>(plot.series.size()) <= kPlotMaxSeries);
  Canvas canvas(width, height);
  const int left = 80, right = width - 20, top = 50, bottom = height - 50;
  double y_max = 0;
  for (const PlotSeries& s : plot.series)
    for (double v : s.y)
      if (std::isfinite(v)) y_max = std::max(y_max, v);
  y_max = y_max > 0 ? NiceCeil(y_max) : 1;
  auto y_pixel = [&](double v) {
    return bottom - static_cast<int>(std::lround(v / y_max * (bottom - top)));
  };
  const int n = static_cast<int>(plot.x_labels.size());
  const int pad = 30;
  auto x_pixel = [&](int i) {
    if (n <= 1) return (left + right) / 2;
    return left + pad + i * (right - left - 2 * pad) / (n - 1);
  };

  canvas.Text((width - Canvas::TextWidth(plot.title, 2)) / 2, 12, plot.title, kPlotInk, 2);
  canvas.Text(left - 60, top - 18, plot.y_title, kPlotInk, 1);
  canvas.Text((left + right - Canvas::TextWidth(plot.x_title, 1)) / 2, bottom + 30, plot.x_title,
              kPlotInk, 1);
  constexpr int kDivisions = 5;
  for (int i = 0; i <= kDivisions; ++i) {
    const double v = y_max * i / kDivisions;
    const int y = y_pixel(v);
    if (i > 0) canvas.Line(left + 1, y, right, y, kPlotGrid, 1);
    const std::string label = FormatTick(v);
    canvas.Text(left - 8 - Canvas::TextWidth(label, 1), y - 3, label, kPlotInk, 1);
  }
  for (int i = 0; i < n; ++i) {
    const int x = x_pixel(i);
    canvas.Line(x, bottom, x, bottom + 4, kPlotInk, 1);
    canvas.Text(x - Canvas::TextWidth(plot.x_labels[static_cast<size_t>(i)], 1) / 2, bottom + 10,
                plot.x_labels[static_cast<size_t>(i)], kPlotInk, 1);
  }
  canvas.Line(left, top, left, bottom, kPlotInk, 1);
  canvas.Line(left, bottom, right, bottom, kPlotInk, 1);

  for (size_t k = 0; k < plot.series.size(); ++k) {
    const uint8_t color = static_cast<uint8_t>(kPlotFirstSeries + k);
    const std::vector<double>& ys = plot.series[k].y;
    int prev_x = 0, prev_y = 0;
    bool has_prev = false;
    for (int i = 0; i < std::min(n, static_cast<int>(ys.size())); ++i) {
      if (!std::isfinite(ys[static_cast<size_t>(i)])) {
        has_prev = false;
        continue;
      }
      const int x = x_pixel(i), y = y_pixel(ys[static_cast<size_t>(i)]);
      if (has_prev) canvas.Line(prev_x, prev_y, x, y, color, 2);
      canvas.FillRect(x - 3, y - 3, x + 3, y + 3, color);
      prev_x = x;
      prev_y = y;
      has_prev = true;
    }
    // Legend, top-left inside the axes.
    const int ly = top + 8 + static_cast<int>(k) * 14;
    canvas.FillRect(left + 10, ly, left + 19, ly + 7, color);
    canvas.Text(left + 26, ly, plot.series[k].label, kPlotInk, 1);
  }
  return canvas.Take();
}

Result<std::vector<std::string>> WriteServePlots(const std::string& dir,
                                                 const std::vector<LevelFigures>& levels) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return IoError("--plot-dir " + dir + ": " + ec.message());
  std::vector<std::string> x_labels;
  for (const LevelFigures& f : levels) {
    char buf[48];
    if (f.concurrency > 0) {
      std::snprintf(buf, sizeof(buf), "%d", f.concurrency);
    } else {
      std::snprintf(buf, sizeof(buf), "RATE %g/S", f.request_rate);
    }
    x_labels.emplace_back(buf);
  }
  const std::string x_title = "CONCURRENCY";
  struct Latency {
    const char* file;
    const char* title;
    const LatencyStats LevelFigures::*stats;
  };
  const Latency latencies[] = {{"ttft.png", "TTFT", &LevelFigures::ttft_ms},
                               {"tpot.png", "TPOT", &LevelFigures::tpot_ms},
                               {"itl.png", "ITL", &LevelFigures::itl_ms},
                               {"e2e.png", "E2E LATENCY", &LevelFigures::e2e_ms}};
  std::vector<std::pair<std::string, LinePlot>> plots;
  for (const Latency& m : latencies) {
    LinePlot p{std::string(m.title) + " VS CONCURRENCY", x_title, "MS", x_labels, {}};
    PlotSeries median{"MEDIAN", {}}, p90{"P90", {}}, p99{"P99", {}};
    for (const LevelFigures& f : levels) {
      const LatencyStats& s = f.*m.stats;
      const double missing = std::nan("");  // a level with no samples draws no point
      median.y.push_back(s.count ? s.median : missing);
      p90.y.push_back(s.count ? s.p90 : missing);
      p99.y.push_back(s.count ? s.p99 : missing);
    }
    p.series = {median, p90, p99};
    plots.emplace_back(m.file, std::move(p));
  }
  LinePlot throughput{"THROUGHPUT VS CONCURRENCY", x_title, "TOKENS/S", x_labels, {}};
  PlotSeries output{"OUTPUT TOKENS/S", {}}, total{"TOTAL TOKENS/S", {}};
  for (const LevelFigures& f : levels) {
    output.y.push_back(f.output_token_throughput);
    total.y.push_back(f.total_token_throughput);
  }
  throughput.series = {output, total};
  plots.emplace_back("throughput.png", std::move(throughput));

  std::vector<std::string> written;
  for (const auto& [file, plot] : plots) {
    const std::string path = (std::filesystem::path(dir) / file).string();
    const std::string png = EncodePng(RenderLinePlot(plot));
    std::ofstream out(path, std::ios::binary);
    out.write(png.data(), static_cast<std::streamsize>(png.size()));
    if (!out) return IoError("writing " + path);
    written.push_back(path);
  }
  return written;
}

}  // namespace dsinfer::measure
