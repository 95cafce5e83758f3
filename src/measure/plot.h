// Line plots for `bench serve --plot-dir`: a minimal rasterizer (axes, grid, 5x7 bitmap text,
// thick polylines with point markers, a legend) into an IndexedImage, and the bench's own set of
// plots (latency percentiles and throughput against the concurrency levels), written as PNG.
// X positions are categories (one per level, evenly spaced) since levels are usually 1,4,16,...
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "measure/load.h"
#include "measure/png.h"

namespace dsinfer::measure {

struct PlotSeries {
  std::string label;
  std::vector<double> y;  // one value per x label
};

struct LinePlot {
  std::string title;
  std::string x_title, y_title;
  std::vector<std::string> x_labels;
  std::vector<PlotSeries> series;  // at most 6 (the palette's series colours)
};

// Palette indices of the rendered image.
inline constexpr uint8_t kPlotBackground = 0, kPlotInk = 1, kPlotGrid = 2, kPlotFirstSeries = 3;
inline constexpr int kPlotMaxSeries = 6;

// The y axis runs from 0 to a 1/2/5 x 10^k bound at or above the largest value. Non-finite values
// are not drawn. Needs width >= 200 and height >= 150.
IndexedImage RenderLinePlot(const LinePlot& plot, int width = 720, int height = 450);

// Writes ttft.png, tpot.png, itl.png, e2e.png (median, p90, p99 in ms) and throughput.png
// (output and total tokens/s) into `dir` (created if missing). Returns the paths written.
Result<std::vector<std::string>> WriteServePlots(const std::string& dir,
                                                 const std::vector<LevelFigures>& levels);

}  // namespace dsinfer::measure
