#include "pi0/train/plot.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>

#include "pi0/common/check.h"
#include "pi0/common/files.h"

namespace pi0::train {

namespace {

// 5×7 glyphs: 7 rows, 5 bits each (MSB = leftmost column).
const std::map<char, std::array<uint8_t, 7>>& font() {
  static const std::map<char, std::array<uint8_t, 7>> glyphs = {
      {'0', {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}}, {'1', {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'2', {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}}, {'3', {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E}},
      {'4', {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}}, {'5', {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E}},
      {'6', {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}}, {'7', {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08}},
      {'8', {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}}, {'9', {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}},
      {'.', {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C}}, {'-', {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00}},
      {'+', {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00}}, {' ', {0, 0, 0, 0, 0, 0, 0}},
      {'(', {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02}}, {')', {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08}},
      {'_', {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F}}, {'a', {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F}},
      {'b', {0x10, 0x10, 0x1E, 0x11, 0x11, 0x11, 0x1E}}, {'c', {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E}},
      {'d', {0x01, 0x01, 0x0F, 0x11, 0x11, 0x11, 0x0F}}, {'e', {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E}},
      {'f', {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08}}, {'g', {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
      {'h', {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11}}, {'i', {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E}},
      {'k', {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12}}, {'l', {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E}},
      {'m', {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11}}, {'n', {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11}},
      {'o', {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E}}, {'p', {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10}},
      {'r', {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10}}, {'s', {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E}},
      {'t', {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06}}, {'u', {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D}},
      {'v', {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04}}, {'w', {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A}},
      {'x', {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11}}, {'y', {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E}},
      // The rest of a-z and '/', for per-dataset labels ("val_loss/<asset id>").
      {'j', {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C}}, {'q', {0x00, 0x00, 0x0F, 0x11, 0x0F, 0x01, 0x01}},
      {'z', {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}}, {'/', {0x01, 0x01, 0x02, 0x04, 0x08, 0x10, 0x10}},
  };
  return glyphs;
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

void put_chunk(std::vector<uint8_t>& out, const char type[4], const std::vector<uint8_t>& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  const size_t start = out.size();
  out.insert(out.end(), type, type + 4);
  out.insert(out.end(), data.begin(), data.end());
  const uLong crc = crc32(0L, out.data() + start, static_cast<uInt>(out.size() - start));
  put_u32(out, static_cast<uint32_t>(crc));
}

std::string tick_label(double v, double spacing) {
  if (std::abs(v) < spacing * 1e-6) v = 0.0;  // avoid "-1.2e-17" at zero
  char buf[32];
  // Step counts read better as "30000" than "3e+04".
  if (v == std::floor(v) && std::abs(v) < 1e9) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

Canvas::Canvas(int width, int height, Rgb bg) : width_(width), height_(height) {
  PI0_CHECK(width > 0 && height > 0, "Canvas: size must be positive, got ", width, "x", height);
  rgb_.resize(static_cast<size_t>(width) * height * 3);
  for (size_t i = 0; i < rgb_.size(); i += 3) rgb_[i] = bg.r, rgb_[i + 1] = bg.g, rgb_[i + 2] = bg.b;
}

Rgb Canvas::pixel(int x, int y) const {
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Canvas::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  const size_t i = (static_cast<size_t>(y) * width_ + x) * 3;
  rgb_[i] = c.r, rgb_[i + 1] = c.g, rgb_[i + 2] = c.b;
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  // Bresenham; thickness by stamping a small square at every point.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  while (true) {
    for (int ox = lo; ox <= hi; ++ox)
      for (int oy = lo; oy <= hi; ++oy) set(x0 + ox, y0 + oy, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) err += dy, x0 += sx;
    if (e2 <= dx) err += dx, y0 += sy;
  }
}

void Canvas::rect(int x0, int y0, int x1, int y1, Rgb c) {
  line(x0, y0, x1, y0, c);
  line(x1, y0, x1, y1, c);
  line(x1, y1, x0, y1, c);
  line(x0, y1, x0, y0, c);
}

int Canvas::text_width(const std::string& s, int scale) { return static_cast<int>(s.size()) * 6 * scale - scale; }

void Canvas::text(int x, int y, const std::string& s, Rgb c, int scale) {
  static const std::array<uint8_t, 7> box = {0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F};
  for (size_t k = 0; k < s.size(); ++k) {
    const char ch = static_cast<char>(std::tolower(static_cast<unsigned char>(s[k])));
    auto it = font().find(ch);
    const auto& g = it == font().end() ? box : it->second;
    const int gx = x + static_cast<int>(k) * 6 * scale;
    for (int row = 0; row < 7; ++row)
      for (int col = 0; col < 5; ++col)
        if (g[row] & (0x10 >> col))
          for (int a = 0; a < scale; ++a)
            for (int b = 0; b < scale; ++b) set(gx + col * scale + a, y + row * scale + b, c);
  }
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  const double raw = (hi - lo) / std::max(1, target - 1);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double spacing = 10 * mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * mag >= raw) {
      spacing = m * mag;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / spacing - 1e-9) * spacing; t <= hi + spacing * 1e-9; t += spacing)
    ticks.push_back(t);
  return ticks;
}

Axis fit_axis(double lo, double hi, bool log, int target) {
  Axis a;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi < lo) lo = 0, hi = 1;
  if (log && lo > 0) {
    a.log = true;
    // Candidates 1, 2, 5 × 10^k around the data (only 10^k when that would give too many ticks).
    const int k0 = static_cast<int>(std::floor(std::log10(lo))) - 1, k1 = static_cast<int>(std::ceil(std::log10(hi))) + 1;
    const std::vector<double> mantissas = k1 - k0 > 6 ? std::vector<double>{1} : std::vector<double>{1, 2, 5};
    std::vector<double> candidates;
    for (int k = k0; k <= k1; ++k)
      for (double m : mantissas) candidates.push_back(m * std::pow(10.0, k));
    const double eps = 1e-9;
    a.lo = candidates.front(), a.hi = candidates.back();
    for (double c : candidates)
      if (c <= lo * (1 + eps)) a.lo = c;
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it)
      if (*it >= hi * (1 - eps) && *it > a.lo) a.hi = *it;
    for (double c : candidates)
      if (c >= a.lo && c <= a.hi) a.ticks.push_back(c);
    return a;
  }
  if (hi == lo) {
    const double pad = lo == 0 ? 1.0 : std::abs(lo) * 0.1;
    lo -= pad, hi += pad;
  }
  const auto t = nice_ticks(lo, hi, target);
  const double spacing = t.size() > 1 ? t[1] - t[0] : hi - lo;
  const int64_t first = static_cast<int64_t>(std::floor(lo / spacing + 1e-9));
  const int64_t last = static_cast<int64_t>(std::ceil(hi / spacing - 1e-9));
  for (int64_t i = first; i <= last; ++i) a.ticks.push_back(static_cast<double>(i) * spacing);
  a.lo = a.ticks.front(), a.hi = a.ticks.back();
  return a;
}

Canvas plot_panels(const std::vector<PlotSeries>& panels, int width, int height, const std::string& x_label) {
  Canvas canvas(width, height);
  const Rgb axis{40, 40, 40}, grid{225, 225, 225};
  const int scale = 2, char_h = 7 * scale;
  // Each panel's title sits in the row above its frame, never over its curve; between panels: the x tick labels of
  // the upper one, then the title of the lower one.
  const int title_h = char_h + 10;
  const int left = 12 * 6 * scale / 2 + 30, right = 20, top = 6 + title_h, bottom = 2 * char_h + 26;
  const int gap = char_h + 16 + title_h;
  const int n = std::max<int>(1, static_cast<int>(panels.size()));
  const int panel_h = (height - top - bottom - gap * (n - 1)) / n;
  PI0_CHECK(panel_h > 40 && width - left - right > 80, "plot_panels: canvas too small: ", width, "x", height);

  // A panel's lines: its series, then its overlays (with a dot at every point).
  struct Line {
    const std::vector<double>& x;
    const std::vector<double>& y;
    Rgb color;
    bool dots;
  };
  const auto lines_of = [](const PlotSeries& p) {
    std::vector<Line> lines = {{p.x, p.y, p.color, false}};
    for (const auto& o : p.overlays) lines.push_back({o.x, o.y, o.color, true});
    return lines;
  };
  // Shared x range over all panels.
  double xlo = INFINITY, xhi = -INFINITY;
  for (const auto& p : panels)
    for (const auto& l : lines_of(p))
      for (size_t i = 0; i < l.x.size() && i < l.y.size(); ++i)
        if (std::isfinite(l.x[i]) && std::isfinite(l.y[i])) xlo = std::min(xlo, l.x[i]), xhi = std::max(xhi, l.x[i]);
  if (!(xhi >= xlo)) xlo = 0, xhi = 1;
  // Steps start at 1 (or wherever a resumed log starts): the axis starts at the tick below, 0 for a whole run.
  const Axis xa = fit_axis(xlo, xhi, false, 8);

  const int x0 = left, x1 = width - right;
  auto px = [&](double x) { return x0 + static_cast<int>(std::lround((x - xa.lo) / (xa.hi - xa.lo) * (x1 - x0))); };
  for (int k = 0; k < static_cast<int>(panels.size()); ++k) {
    const auto& p = panels[k];
    const auto lines = lines_of(p);
    const int y0 = top + k * (panel_h + gap), y1 = y0 + panel_h;
    double ylo = INFINITY, yhi = -INFINITY;
    for (const auto& l : lines)
      for (size_t i = 0; i < l.x.size() && i < l.y.size(); ++i)
        if (std::isfinite(l.x[i]) && std::isfinite(l.y[i])) ylo = std::min(ylo, l.y[i]), yhi = std::max(yhi, l.y[i]);
    if (!(yhi >= ylo)) ylo = 0, yhi = 1;
    const Axis ya = fit_axis(ylo, yhi, p.log_y && ylo > 0, 5);
    auto pos = [&](double y) { return ya.log ? std::log10(y) : y; };
    const double plo = pos(ya.lo), phi = pos(ya.hi);
    auto py = [&](double y) { return y1 - static_cast<int>(std::lround((pos(y) - plo) / (phi - plo) * (y1 - y0))); };

    const double yspacing = ya.ticks.size() > 1 ? ya.ticks[1] - ya.ticks[0] : 1.0;
    for (double t : ya.ticks) {
      const int y = py(t);
      canvas.line(x0 + 1, y, x1 - 1, y, grid);
      canvas.line(x0 - 5, y, x0, y, axis);
      const auto label = tick_label(t, ya.log ? t : yspacing);
      canvas.text(x0 - 8 - Canvas::text_width(label, scale), y - char_h / 2, label, axis, scale);
    }
    const double xspacing = xa.ticks.size() > 1 ? xa.ticks[1] - xa.ticks[0] : 1.0;
    for (double t : xa.ticks) {
      const int x = px(t);
      canvas.line(x, y0 + 1, x, y1 - 1, grid);
      canvas.line(x, y1, x, y1 + 5, axis);
      const auto label = tick_label(t, xspacing);
      canvas.text(x - Canvas::text_width(label, scale) / 2, y1 + 9, label, axis, scale);
    }
    canvas.rect(x0, y0, x1, y1, axis);

    for (const auto& l : lines) {
      bool have_prev = false;
      int prev_x = 0, prev_y = 0;
      for (size_t i = 0; i < l.x.size() && i < l.y.size(); ++i) {
        if (!std::isfinite(l.x[i]) || !std::isfinite(l.y[i])) {
          have_prev = false;
          continue;
        }
        const int x = px(l.x[i]), y = py(l.y[i]);
        if (have_prev) canvas.line(prev_x, prev_y, x, y, l.color, 2);
        else canvas.line(x, y, x, y, l.color, 2);
        if (l.dots) canvas.line(x, y, x, y, l.color, 6);
        prev_x = x, prev_y = y, have_prev = true;
      }
    }
    // The title, then each overlay's label in its colour: the legend.
    int title_x = x0;
    const auto title = [&](const std::string& s, Rgb c) {
      canvas.text(title_x, y0 - char_h - 6, s, c, scale);
      title_x += Canvas::text_width(s + "   ", scale);
    };
    title(ya.log ? p.title + " (log scale)" : p.title, p.color);
    for (const auto& o : p.overlays) title(o.label, o.color);
  }
  canvas.text((x0 + x1 - Canvas::text_width(x_label, scale)) / 2, height - char_h - 6, x_label, axis, scale);
  return canvas;
}

std::vector<uint8_t> encode_png(const Canvas& canvas) {
  const int w = canvas.width(), h = canvas.height();
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(h) * (1 + 3 * w));
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);  // filter type None
    const auto* row = canvas.rgb().data() + static_cast<size_t>(y) * w * 3;
    raw.insert(raw.end(), row, row + 3 * static_cast<size_t>(w));
  }
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::vector<uint8_t> idat(size);
  PI0_CHECK(compress2(idat.data(), &size, raw.data(), static_cast<uLong>(raw.size()), 6) == Z_OK,
            "encode_png: zlib compression failed");
  idat.resize(size);

  std::vector<uint8_t> out = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  put_u32(ihdr, static_cast<uint32_t>(w));
  put_u32(ihdr, static_cast<uint32_t>(h));
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, colour type RGB, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", idat);
  put_chunk(out, "IEND", {});
  return out;
}

void write_png(const std::string& path, const Canvas& canvas) {
  const auto bytes = encode_png(canvas);
  write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

}  // namespace pi0::train
