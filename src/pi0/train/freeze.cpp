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

}  // namespace

const std::vector<std::string>& freeze_presets() {
  static const std::vector<std::string> presets = {"full",          "projection-only", "+vision", "+language",
                                                   "action-expert-only", "freeze-vision", "lora",    "lora-only"};
  return presets;
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

}  // namespace pi0::train
