// A tiny plotting backend so training curves can be drawn without Python: an RGB canvas with lines and a
// 5×7 bitmap font, a stacked-panel line plot with "nice" ticks, and a PNG encoder (zlib deflate).
// Used by apps/pi0_plot (pi0-plot --metrics run/metrics.jsonl --out loss.png).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pi0::train {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
};

/// 8-bit RGB image, row-major, origin top-left.
class Canvas {
 public:
  Canvas(int width, int height, Rgb background = {255, 255, 255});
  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& rgb() const { return rgb_; }
  Rgb pixel(int x, int y) const;
  void set(int x, int y, Rgb c);  ///< ignores points outside the canvas
  void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
  void rect(int x0, int y0, int x1, int y1, Rgb c);  ///< outline
  /// Text in the 5×7 font (digits, '.', '-', '+', '(', ')', '_', '/', space and the letters a-z, upper case drawn as
  /// lower; other characters draw as a box), top-left at (x, y), each font pixel drawn as scale×scale.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 2);
  static int text_width(const std::string& s, int scale = 2);

 private:
  int width_, height_;
  std::vector<uint8_t> rgb_;
};

/// A further line in a panel, on the panel's axes: the validation loss over the training loss, which only reads as
/// over- or underfitting on the same axis.
struct PlotLine {
  std::string label;  ///< drawn after the panel's title in the line's colour, e.g. "val_loss"
  std::vector<double> x, y;
  Rgb color;
};

/// One panel of a stacked plot: a y-series against x (non-finite points break the line).
struct PlotSeries {
  std::string title;  ///< drawn above the panel's frame, left-aligned, e.g. "loss"
  std::vector<double> x, y;
  Rgb color;
  /// Logarithmic y axis (a loss falling by 10x keeps its shape after the first steps); used only when every
  /// finite y is > 0 (the overlays' included), else the axis stays linear.
  bool log_y = false;
  /// Lines drawn over the series with a dot at every point (validation runs every few hundred steps: a handful of
  /// points, a single one after the first pass); their values count in the panel's ranges.
  std::vector<PlotLine> overlays = {};
};

/// Panels stacked vertically, each with its title (and its overlays' labels) above a frame, y ticks with labels, x
/// ticks with labels and its polylines; `x_label` under the last panel. Both axes end on ticks (fit_axis). An empty
/// series draws an empty frame.
Canvas plot_panels(const std::vector<PlotSeries>& panels, int width, int height, const std::string& x_label);

/// Tick positions covering [lo, hi] with a 1/2/2.5/5×10^k spacing, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

/// An axis range and its ticks. The range is widened to the ticks just outside the data, so the first and last
/// ticks sit on the frame and every value, the smallest and largest included, lies between two labelled ticks.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;           ///< positions are log10(value)
  std::vector<double> ticks;  ///< ascending; ticks.front() == lo and ticks.back() == hi
};
/// The axis for data in [lo, hi] (finite, lo <= hi): linear with about `target` nice_ticks, or with `log` (and
/// lo > 0) at 1, 2, 5 × 10^k (only 10^k over more than 4 decades).
Axis fit_axis(double lo, double hi, bool log, int target = 5);

/// PNG bytes (8-bit RGB, no interlace, filter 0, zlib-compressed IDAT).
std::vector<uint8_t> encode_png(const Canvas& canvas);
/// Writes encode_png(canvas) to `path`; UserError if the file cannot be written.
void write_png(const std::string& path, const Canvas& canvas);

}  // namespace pi0::train
