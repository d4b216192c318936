// pi0-plot: draws training curves from a metrics JSONL file to a PNG, without Python.
//   pi0-plot --metrics run/metrics.jsonl --out loss.png [--width 1000] [--height 700] [--keys loss,lr]
// One panel per key (default: loss and learning rate), step on the x axis.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "pi0/common/check.h"
#include "pi0/train/metrics.h"
#include "pi0/train/plot.h"

namespace {

const char* kUsage =
    "usage: pi0-plot --metrics <metrics.jsonl> --out <plot.png> [--width N] [--height N] [--keys loss,lr]\n"
    "  draws each key (default loss and lr; 'lr' falls back to 'learning_rate') against 'step'\n";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(',', start);
    const auto part = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (!part.empty()) out.push_back(part);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

int to_int(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < 200 || n > 10000)
    throw pi0::UserError(flag + " must be an integer in [200, 10000] (got '" + v + "')");
  return static_cast<int>(n);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string metrics, out;
    int width = 1000, height = 700;
    std::vector<std::string> keys = {"loss", "lr"};
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      }
      if (i + 1 >= argc) throw pi0::UserError("option " + a + " needs a value\n" + kUsage);
      const std::string v = argv[++i];
      if (a == "--metrics") metrics = v;
      else if (a == "--out") out = v;
      else if (a == "--width") width = to_int(a, v);
      else if (a == "--height") height = to_int(a, v);
      else if (a == "--keys") keys = split(v);
      else throw pi0::UserError("unknown option '" + a + "'\n" + kUsage);
    }
    if (metrics.empty() || out.empty()) throw pi0::UserError(std::string("--metrics and --out are required\n") + kUsage);
    if (keys.empty()) throw pi0::UserError("--keys must name at least one metric");

    const auto records = pi0::train::read_metrics(metrics);
    const std::vector<pi0::train::Rgb> colors = {{31, 119, 180}, {214, 39, 40}, {44, 160, 44}, {148, 103, 189}};
    std::vector<pi0::train::PlotSeries> panels;
    for (size_t k = 0; k < keys.size(); ++k) {
      pi0::train::PlotSeries s;
      s.title = keys[k] == "lr" ? "learning rate" : keys[k];
      s.color = colors[k % colors.size()];
      for (const auto& r : records) {
        if (!r.contains("step") || !r["step"].is_number()) continue;
        const nlohmann::json* v = nullptr;
        if (r.contains(keys[k])) v = &r[keys[k]];
        else if (keys[k] == "lr" && r.contains("learning_rate")) v = &r["learning_rate"];
        if (v == nullptr) continue;
        s.x.push_back(r["step"].get<double>());
        s.y.push_back(v->is_number() ? v->get<double>() : NAN);  // null (NaN in JSON) breaks the line
      }
      if (s.x.empty()) std::cerr << "pi0-plot: warning: no records with '" << keys[k] << "' in " << metrics << "\n";
      panels.push_back(std::move(s));
    }
    pi0::train::write_png(out, pi0::train::plot_panels(panels, width, height, "step"));
    std::cout << "wrote " << out << " (" << records.size() << " records)\n";
    return 0;
  } catch (const pi0::UserError& e) {
    std::cerr << "pi0-plot: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "pi0-plot: internal error: " << e.what() << "\n";
    return 1;
  }
}
