#include "pi0/train/placement.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"
#include "pi0/model/model_config.h"
#include "pi0/model/pi0.h"
#include "pi0/train/freeze.h"

namespace pi0::train {

namespace {

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

// Layers the model runs in float32 whatever the precision (nn::Dense computes in its input's dtype, and these get
// float32 inputs): the action and state projections, the time MLPs and the adaRMS modulation
// (`...layernorm.dense`), whose outputs set the flow-matching velocity and the norms' scales.
bool reads_in_float32(const std::string& name) {
  for (const char* m : {"action_in_proj.", "action_out_proj.", "state_proj.", "time_mlp_in.", "time_mlp_out.",
                        "action_time_mlp_in.", "action_time_mlp_out."})
    if (name.rfind(m, 0) == 0) return true;
  return name.find("norm.dense.") != std::string::npos;
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
          {"device_copy_bytes", s.device_copy_bytes},
          {"host_bytes", s.host_bytes},
          {"memory_bytes", s.memory_bytes()}};
}

}  // namespace

const std::vector<std::string>& precision_modes() {
  static const std::vector<std::string> modes = {"float32", "bf16-mixed", "bf16"};
  return modes;
}

std::vector<bool> PlacementTable::trainable_mask() const {
  std::vector<bool> mask;
  mask.reserve(params.size());
  for (const auto& p : params) mask.push_back(p.trainable);
  return mask;
}

PlacementTable make_placement(const std::vector<model::ParamSpec>& layout, const std::vector<bool>& trainable,
                              const std::string& precision, bool ema, bool cast_cache, bool offload) {
  const auto& modes = precision_modes();
  if (std::find(modes.begin(), modes.end(), precision) == modes.end()) {
    std::string valid;
    for (const auto& m : modes) valid += (valid.empty() ? "" : ", ") + m;
    std::string msg = "precision '" + precision + "' is unknown; valid: " + valid;
    const auto guess = did_you_mean(precision, modes);
    if (!guess.empty()) msg += " (did you mean '" + guess + "'?)";
    throw UserError(msg);
  }
  PI0_CHECK(trainable.size() == layout.size(), "make_placement: mask has ", trainable.size(), " entries for ",
            layout.size(), " parameters");
  PlacementTable table;
  table.precision = precision;
  table.ema = ema;
  table.offload = offload;
  const bool any_bf16 = precision != "float32";
  table.compute = any_bf16 ? torch::kBFloat16 : torch::kFloat32;
  table.buffers = precision == "bf16" ? torch::kBFloat16 : torch::kFloat32;
  table.params.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    ParamPlacement p;
    p.name = layout[i].name;
    p.numel = layout[i].numel();
    p.trainable = trainable[i];
    // float32 master weights for what trains under bf16-mixed; everything else in the compute dtype.
    p.storage = precision == "bf16" || (precision == "bf16-mixed" && !p.trainable) ? torch::kBFloat16
                                                                                     : torch::kFloat32;
    p.compute = reads_in_float32(p.name) ? torch::kFloat32 : table.compute;
    // nn::Dense caches whatever it casts, trained or not: the bf16 copies of float32 masters under bf16-mixed, and
    // the float32 copies of frozen bf16 weights read in float32 (time MLPs, projections, adaRMS modulation), which
    // the step census found (tests/unit/train/test_step_census.cpp).
    p.cast_cached = cast_cache && p.storage != p.compute && casts_in_layers(p.name);
    p.device_copy = p.storage;
    if (offload && p.trainable) {
      // The device copy is already in the dtype the layer reads, so nothing is cast (or cached) on the device.
      p.residence = Residence::kHost;
      if (casts_in_layers(p.name)) p.device_copy = p.compute;
      p.cast_cached = false;
    }
    table.params.push_back(std::move(p));
  }
  return table;
}

PlacementTable make_placement(const config::Config& cfg, bool offload) {
  const auto layout = model::parameter_layout(model::options_from_config(cfg.model));
  const auto& t = cfg.train;
  auto table = make_placement(layout, trainable_mask(names_of(layout), t.freeze, t.trainable_include,
                                                    t.trainable_exclude),
                              t.precision, t.ema_decay > 0, t.weight_cast_cache, offload);
  table.host_accumulation = t.grad_accum_steps > 1;
  table.host_transfer = t.device.rfind("cuda", 0) == 0;
  return table;
}

PlacementTable make_placement(const config::Config& cfg) {
  return make_placement(cfg, cfg.train.offload == "optimizer");
}

std::vector<std::pair<const ParamPlacement*, torch::Tensor>> placed_parameters(model::Pi0Impl& model,
                                                                               const PlacementTable& table,
                                                                               const char* who) {
  auto named = model.named_parameters();
  PI0_CHECK(named.size() == table.params.size(), who, ": the model has ", named.size(),
            " parameters, the placement table ", table.params.size());
  std::vector<std::pair<const ParamPlacement*, torch::Tensor>> out;
  out.reserve(named.size());
  size_t i = 0;
  for (auto& item : named) {
    const auto& place = table.params[i];
    PI0_CHECK(item.key() == place.name, who, ": parameter ", i, " is '", item.key(), "', the placement table says '",
              place.name, "'");
    out.emplace_back(&place, item.value());
    ++i;
  }
  return out;
}

void apply_placement(model::Pi0Impl& model, const PlacementTable& table, bool weights_from_file) {
  torch::NoGradGuard no_grad;
  for (auto& [placement, p] : placed_parameters(model, table, "apply_placement")) {
    const auto& place = *placement;
    p.set_requires_grad(place.trainable);
    if (p.scalar_type() != place.storage) {
      const bool drawn = !weights_from_file || place.name.find(".lora_") != std::string::npos;
      p.set_data(drawn ? p.data().to(place.storage) : torch::empty(p.sizes(), p.options().dtype(place.storage)));
    }
  }
  for (auto& b : model.buffers()) {
    if (b.is_floating_point() && b.scalar_type() != table.buffers) b.set_data(b.data().to(table.buffers));
  }
  model.set_compute_dtype(table.compute);
}

ParamBreakdown breakdown(const PlacementTable& table) {
  ParamBreakdown b;
  b.precision = table.precision;
  b.ema = table.ema;
  b.offload = table.offload;
  for (const auto& c : model::kComponents) b.components.push_back(ComponentStats{c});
  b.total.name = "total";
  for (const auto& p : table.params) {
    const auto c = model::component_of(p.name);
    auto it = std::find(model::kComponents.begin(), model::kComponents.end(), c);
    PI0_CHECK(it != model::kComponents.end(), "breakdown: unknown component ", c);
    for (ComponentStats* s : {&b.components[it - model::kComponents.begin()], &b.total}) {
      s->total += p.numel;
      (p.trainable ? s->trainable : s->frozen) += p.numel;
      s->weight_bytes += p.weight_bytes();
      s->grad_bytes += p.grad_bytes();
      s->optimizer_bytes += p.optimizer_bytes();
      if (table.ema) s->ema_bytes += p.ema_bytes();
      s->cast_bytes += p.cast_bytes();
      s->device_copy_bytes += p.device_copy_bytes();
      if (p.on_host()) {
        s->host_bytes += p.weight_bytes() + (table.host_accumulation ? p.grad_bytes() : 0) + p.optimizer_bytes() +
                         (table.ema ? p.ema_bytes() : 0) + (table.host_transfer ? p.device_copy_bytes() : 0);
        s->on_device_bytes += p.device_copy_bytes();
      } else {
        s->on_device_bytes += p.weight_bytes() + p.grad_bytes() + p.optimizer_bytes() +
                              (table.ema ? p.ema_bytes() : 0) + p.cast_bytes() + p.device_copy_bytes();
      }
    }
  }
  return b;
}

ParamBreakdown breakdown(const std::vector<model::ParamSpec>& layout, const std::vector<bool>& trainable,
                         const std::string& precision, bool ema) {
  return breakdown(make_placement(layout, trainable, precision, ema, /*cast_cache=*/true));
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
  std::vector<std::string> header = {"component", "total", "trainable", "frozen", "trainable %", "weights",
                                     "grads",     "optimizer", "ema", "casts", "memory"};
  // Offloaded: the device copies, and where the memory is (the columns before say what it is).
  if (b.offload) header.insert(header.end() - 1, "copies"), header.insert(header.end(), {"on device", "on host"});
  std::vector<std::vector<std::string>> rows = {header};
  auto row = [&b](const ComponentStats& s) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.1f%%", s.trainable_percent());
    std::vector<std::string> r{s.name,           with_thousands(s.total), with_thousands(s.trainable),
                               with_thousands(s.frozen), pct, gib(s.weight_bytes), gib(s.grad_bytes),
                               gib(s.optimizer_bytes),   gib(s.ema_bytes),       gib(s.cast_bytes)};
    if (b.offload) r.push_back(gib(s.device_copy_bytes));
    r.push_back(gib(s.memory_bytes()));
    if (b.offload) r.push_back(gib(s.device_bytes())), r.push_back(gib(s.host_bytes));
    return r;
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
     << (b.ema ? "on" : "off") << "): memory = weights + grads + optimizer + ema + casts" << (b.offload ? " + copies" : "")
     << ", held between steps; "
     << "activations not included" << (b.offload ? "; train.offload=optimizer: what trains (weights, grads, "
                                                     "optimizer, ema) is on the host, copies on the device" : "")
     << "\n";
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
  j["offload"] = b.offload ? "optimizer" : "none";
  j["total"] = stats_json(b.total);
  for (const auto& s : b.components) j[s.name] = stats_json(s);
  return j;
}

}  // namespace pi0::train
