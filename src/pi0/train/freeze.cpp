#include "pi0/train/freeze.h"

#include <algorithm>
#include <cstdio>
#include <regex>
#include <set>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"

namespace pi0::train {

namespace {

bool is_lora(const std::string& name) { return name.find(".lora_") != std::string::npos; }

// Component of the layer a parameter belongs to; LoRA factors count for the layer they adapt.
std::string owner_component(const std::string& name) {
  const auto pos = name.find(".lora_");
  if (pos == std::string::npos) return model::component_of(name);
  return model::component_of(name.substr(0, pos) + ".weight");
}

bool preset_trains(const std::string& preset, const std::string& name) {
  const std::string c = owner_component(name);
  if (preset == "full") return true;
  if (preset == "projection-only") return c == "projections";
  if (preset == "+vision") return c == "projections" || c == "vision";
  if (preset == "+language") return c == "projections" || c == "language" || c == "embedding";
  if (preset == "action-expert-only") return c == "projections" || c == "action_expert";
  if (preset == "freeze-vision") return c != "vision";
  // openpi's LoRA freeze filter matches only `llm` paths, so SigLIP and the projections stay trainable.
  if (preset == "lora") return is_lora(name) || c == "vision" || c == "projections";
  if (preset == "lora-only") return is_lora(name);
  PI0_CHECK(false, "preset_trains: unhandled preset ", preset);
  return false;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::vector<std::regex> compile(const std::vector<std::string>& patterns, const std::string& what) {
  std::vector<std::regex> out;
  for (const auto& p : patterns) {
    try {
      out.emplace_back(p, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw UserError("freeze " + what + " regex '" + p + "' is not a valid regular expression (" + e.what() +
                      ")");
    }
  }
  return out;
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return buf;
}

// Whether a parameter is one nn::Dense casts to the compute dtype (and caches): every layer weight, bias and
// LoRA factor, including the adaRMS modulation (`...layernorm.dense.weight`), but not norm scales (applied in
// float32), embedding tables (looked up, not cast) or the SigLIP patch convolution.
bool casts_in_layers(const std::string& name) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos) return false;
  const auto module_end = dot;
  const auto module_begin = name.rfind('.', module_end - 1);
  const auto module = name.substr(module_begin == std::string::npos ? 0 : module_begin + 1,
                                  module_end - (module_begin == std::string::npos ? 0 : module_begin + 1));
  return module.find("norm") == std::string::npos && module.find("embed") == std::string::npos &&
         module != "lm_head";
}

nlohmann::json stats_json(const ComponentStats& s) {
  return {{"total", s.total},
          {"trainable", s.trainable},
          {"frozen", s.frozen},
          {"trainable_percent", s.trainable_percent()},
          {"weight_bytes", s.weight_bytes},
          {"grad_bytes", s.grad_bytes},
          {"optimizer_bytes", s.optimizer_bytes},
          {"ema_bytes", s.ema_bytes},
          {"cast_bytes", s.cast_bytes},
          {"memory_bytes", s.memory_bytes()}};
}

}  // namespace

const std::vector<std::string>& freeze_presets() {
  static const std::vector<std::string> presets = {"full",          "projection-only", "+vision", "+language",
                                                   "action-expert-only", "freeze-vision", "lora",    "lora-only"};
  return presets;
}

const std::vector<std::string>& precision_modes() {
  static const std::vector<std::string> modes = {"float32", "bf16-mixed", "bf16"};
  return modes;
}


std::vector<bool> trainable_mask(const std::vector<std::string>& names, const std::string& preset,
                                 const std::vector<std::string>& include, const std::vector<std::string>& exclude) {
  const auto& presets = freeze_presets();
  if (std::find(presets.begin(), presets.end(), preset) == presets.end()) {
    std::string msg = "freeze preset '" + preset + "' is unknown; valid presets: " + join(presets);
    const auto guess = did_you_mean(preset, presets);
    if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
    throw UserError(msg);
  }
  if (preset == "lora" || preset == "lora-only") {
    if (std::none_of(names.begin(), names.end(), is_lora))
      throw UserError("freeze preset '" + preset + "' needs LoRA factors, but the model has none; use a LoRA "
                      "variant (e.g. gemma_2b_lora / gemma_300m_lora, i.e. lora_rank > 0) or another preset");
  }
  std::vector<bool> mask(names.size());
  for (size_t i = 0; i < names.size(); ++i) mask[i] = preset_trains(preset, names[i]);

  auto apply = [&](const std::vector<std::string>& patterns, const std::string& what, bool value) {
    const auto regexes = compile(patterns, what);
    for (size_t r = 0; r < regexes.size(); ++r) {
      bool matched = false;
      for (size_t i = 0; i < names.size(); ++i) {
        if (std::regex_match(names[i], regexes[r])) mask[i] = value, matched = true;
      }
      if (!matched)
        throw UserError("freeze " + what + " regex '" + patterns[r] + "' matches no parameter name (it must "
                        "match the whole name, e.g. '.*vision_tower.*')");
    }
  };
  apply(include, "include", true);
  apply(exclude, "exclude", false);
  return mask;
}

std::vector<std::string> names_of(const std::vector<model::ParamSpec>& layout) {
  std::vector<std::string> names;
  names.reserve(layout.size());
  for (const auto& p : layout) names.push_back(p.name);
  return names;
}

std::vector<bool> apply_freeze(torch::nn::Module& model, const std::string& preset,
                               const std::vector<std::string>& include, const std::vector<std::string>& exclude) {
  auto params = model.named_parameters();
  std::vector<std::string> names;
  for (const auto& item : params) names.push_back(item.key());
  auto mask = trainable_mask(names, preset, include, exclude);
  size_t i = 0;
  for (auto& item : params) item.value().set_requires_grad(mask[i++]);
  return mask;
}

ParamBreakdown breakdown(const std::vector<model::ParamSpec>& layout, const std::vector<bool>& trainable,
                         const std::string& precision, bool ema) {
  const auto& modes = precision_modes();
  if (std::find(modes.begin(), modes.end(), precision) == modes.end()) {
    std::string msg = "precision '" + precision + "' is unknown; valid: " + join(modes);
    const auto guess = did_you_mean(precision, modes);
    if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
    throw UserError(msg);
  }
  PI0_CHECK(trainable.size() == layout.size(), "breakdown: mask has ", trainable.size(), " entries for ",
            layout.size(), " parameters");
  // Bytes per element: trainable weight, frozen weight, grad, optimizer.
  int64_t tw = 4, fw = 4, g = 4, opt = 8, cast = 0;
  if (precision == "bf16-mixed") fw = 2, cast = 2;
  if (precision == "bf16") tw = 2, fw = 2, g = 2, opt = 4;

  ParamBreakdown b;
  b.precision = precision;
  b.ema = ema;
  for (const auto& c : model::kComponents) b.components.push_back(ComponentStats{c});
  b.total.name = "total";
  for (size_t i = 0; i < layout.size(); ++i) {
    const auto c = model::component_of(layout[i].name);
    auto it = std::find(model::kComponents.begin(), model::kComponents.end(), c);
    PI0_CHECK(it != model::kComponents.end(), "breakdown: unknown component ", c);
    const int64_t n = layout[i].numel();
    for (ComponentStats* s : {&b.components[it - model::kComponents.begin()], &b.total}) {
      s->total += n;
      if (trainable[i]) {
        s->trainable += n;
        s->weight_bytes += tw * n;
        s->grad_bytes += g * n;
        s->optimizer_bytes += opt * n;
        if (ema) s->ema_bytes += 4 * n;
        if (casts_in_layers(layout[i].name)) s->cast_bytes += cast * n;
      } else {
        s->frozen += n;
        s->weight_bytes += fw * n;
      }
    }
  }
  return b;
}

std::string with_thousands(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string format_breakdown(const ParamBreakdown& b) {
  const std::vector<std::string> header = {"component", "total", "trainable", "frozen", "trainable %", "weights",
                                           "grads",     "optimizer", "ema", "casts", "memory"};
  std::vector<std::vector<std::string>> rows = {header};
  auto row = [](const ComponentStats& s) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.1f%%", s.trainable_percent());
    return std::vector<std::string>{s.name,           with_thousands(s.total), with_thousands(s.trainable),
                                    with_thousands(s.frozen), pct, gib(s.weight_bytes), gib(s.grad_bytes),
                                    gib(s.optimizer_bytes),   gib(s.ema_bytes),       gib(s.cast_bytes),
                                    gib(s.memory_bytes())};
  };
  for (const auto& s : b.components) rows.push_back(row(s));
  rows.push_back(row(b.total));
  std::vector<size_t> width(header.size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::ostringstream os;
  // "memory" is defined here once for every place that quotes it (README, docs, --print-params, the training log):
  // what stays allocated from one step to the next. Activations come and go within a step; planned separately.
  os << "parameters and persistent training memory (precision " << b.precision << ", EMA "
     << (b.ema ? "on" : "off") << "): memory = weights + grads + optimizer + ema + casts, held between steps; "
     << "activations not included\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    if (r + 1 == rows.size()) {
      size_t line = 0;
      for (auto w : width) line += w + 2;
      os << std::string(line - 2, '-') << "\n";
    }
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const auto& cell = rows[r][c];
      const std::string pad(width[c] - cell.size(), ' ');
      os << (c == 0 ? cell + pad : pad + cell) << (c + 1 < rows[r].size() ? "  " : "\n");
    }
  }
  return os.str();
}

nlohmann::json breakdown_json(const ParamBreakdown& b) {
  nlohmann::json j;
  j["precision"] = b.precision;
  j["ema"] = b.ema;
  j["total"] = stats_json(b.total);
  for (const auto& s : b.components) j[s.name] = stats_json(s);
  return j;
}

}  // namespace pi0::train
