#include "pi0/io/model_weights.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/shape_str.h"
#include "pi0/common/interrupt.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/param_layout.h"

namespace pi0::io {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// pi0-FAST (model.type pi0_fast) in openpi's layout: PaliGemma's own names, as openpi's pi0-FAST (PaliGemma alone)
// and tests/data/pi0_fast_model_reference.py name them: pi0's "paligemma_with_expert." dropped, the tied embedding
// stored once as embed_tokens, no expert lm_head.
const std::string kFastDroppedPrefix = "paligemma_with_expert.";

std::string fast_openpi_name(const std::string& name) {
  return starts_with(name, kFastDroppedPrefix) ? name.substr(kFastDroppedPrefix.size()) : name;
}

bool is_projection(const std::string& name) {
  for (const char* p : {"action_in_proj.", "action_out_proj.", "state_proj."})
    if (starts_with(name, p)) return true;
  return false;
}

std::string join(const std::vector<std::string>& v, size_t limit = 12) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size() && i < limit; ++i) os << (i ? ", " : "") << v[i];
  if (v.size() > limit) os << ", ... (" << v.size() - limit << " more)";
  return os.str();
}

// Source of each tensor: a name in the file plus a way to read it.
struct Source {
  std::vector<std::string> names;                 // file names after normalization
  std::map<std::string, std::string> file_name;   // normalized → original name in the file
  std::function<std::vector<int64_t>(const std::string&)> shape;
  std::function<torch::ScalarType(const std::string&)> dtype;
  /// Copies every (file name, destination) pair; the order is up to the source (a file reads in file order).
  std::function<void(const std::vector<std::pair<std::string, torch::Tensor>>&)> read_into;
};

LoadReport load_from(model::Pi0Impl& model, const Source& src, const std::string& source,
                     const std::map<std::string, std::string>& aliases, const LoadOptions& options) {
  LoadReport report;
  std::set<std::string> available(src.names.begin(), src.names.end());
  std::set<std::string> used;
  auto resolve = [&](const std::string& name) -> std::string {
    if (available.count(name)) return name;
    // Tied embedding: either member of the group, or a metadata alias (dropped name → kept name).
    if (name == model::kEmbeddingName && available.count(kLmHeadName)) return kLmHeadName;
    auto it = aliases.find(name);
    if (it != aliases.end() && available.count(it->second)) return it->second;
    return "";
  };
  std::vector<std::string> mismatched;
  std::vector<std::pair<std::string, torch::Tensor>> reads;  // (file name, parameter), read once all are checked
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const auto& name = item.key();
    auto& param = item.value();
    const auto from = resolve(name);
    if (from.empty()) {
      if (name.find(".lora_") == std::string::npos) report.missing.push_back(name);
      continue;
    }
    used.insert(from);
    const auto shape = src.shape(from);
    if (shape != param.sizes().vec()) {
      if (options.reinit_mismatched_projections && is_projection(name)) {
        spdlog::warn("{}: re-initializing {} (file shape {} vs model shape {}; checkpoint.reinit_mismatched_projections)",
                     source, name, shape_str(shape), shape_str(param.sizes()));
        report.reinitialized.push_back(name);
      } else {
        mismatched.push_back(name + " (file " + shape_str(shape) + ", model " + shape_str(param.sizes()) + ")");
      }
      continue;
    }
    interruption_point();  // a stop during a multi-GB load ends it within one tensor
    const auto dtype = src.dtype(from);
    const bool float_param = at::isFloatingType(param.scalar_type());
    if (options.exact_dtypes ? dtype != param.scalar_type() : (float_param && !at::isFloatingType(dtype))) {
      throw UserError(source + ": tensor '" + from + "' is stored as " + std::string(c10::toString(dtype)) +
                      ", expected " + (options.exact_dtypes
                           ? std::string(c10::toString(param.scalar_type())) +
                                 " (a checkpoint holds exactly the dtypes its trainer wrote: the file was altered, "
                                 "or train.precision differs from the run that saved it)"
                           : "a floating-point type for parameter '" + name + "' (integer and bool tensors never "
                             "fill float parameters)"));
    }
    reads.emplace_back(from, param);
    report.loaded.push_back(name);
  }
  for (const auto& n : src.names) {
    if (used.count(n) || n == kExpertLmHeadName) continue;
    if (n == kLmHeadName && used.count(kLmHeadName) == 0 && available.count(model::kEmbeddingName)) continue;
    report.unexpected.push_back(n);
  }
  if (!mismatched.empty() || (options.strict && (!report.missing.empty() || !report.unexpected.empty()))) {
    std::string msg = source + ": weights do not match the model:";
    if (!report.missing.empty()) msg += " missing [" + join(report.missing) + "];";
    if (!report.unexpected.empty()) msg += " unexpected [" + join(report.unexpected) + "];";
    if (!mismatched.empty()) {
      msg += " shape mismatch [" + join(mismatched) + "];";
      if (std::all_of(mismatched.begin(), mismatched.end(), [](const auto& m) { return is_projection(m); }))
        msg += " set checkpoint.reinit_mismatched_projections=true to re-initialize these projections;";
    }
    msg += " check model.type and the variants in the config";
    throw UserError(msg);
  }
  src.read_into(reads);
  return report;
}

}  // namespace

LoadReport load_model_weights(model::Pi0Impl& model, const std::string& path, const LoadOptions& options) {
  SafetensorsFile file(path, AccessPattern::kSequential);
  Source src;
  // LeRobot checkpoints prefix every name with "model.".
  const bool lerobot = !file.names().empty() && std::all_of(file.names().begin(), file.names().end(), [](const auto& n) {
    return starts_with(n, "model.");
  });
  // A pi0-FAST model reads openpi's pi0-FAST layout ("paligemma.model...") as well as its own checkpoints' names.
  const bool fast_layout = model.is_fast() && !file.names().empty() &&
                           std::all_of(file.names().begin(), file.names().end(),
                                       [&](const auto& n) { return starts_with(lerobot ? n.substr(6) : n, "paligemma."); });
  const std::string add = fast_layout ? kFastDroppedPrefix : "";
  for (const auto& n : file.names()) {
    const auto norm = add + (lerobot ? n.substr(6) : n);
    src.names.push_back(norm);
    src.file_name[norm] = n;
  }
  src.shape = [&](const std::string& n) { return file.info(src.file_name.at(n)).shape; };
  src.dtype = [&](const std::string& n) { return file.info(src.file_name.at(n)).scalar_type; };
  // Progress lines for multi-GB files (a full-size model takes tens of seconds to read).
  const uint64_t total = file.file_size();
  uint64_t done = 0, next_report = 2ull << 30;
  const auto t0 = std::chrono::steady_clock::now();
  src.read_into = [&](const std::vector<std::pair<std::string, torch::Tensor>>& reads) {
    std::vector<std::pair<std::string, torch::Tensor>> in_file;
    for (const auto& [n, dst] : reads) in_file.emplace_back(src.file_name.at(n), dst);
    file.read_into_many(in_file, [&](const std::string&, uint64_t bytes) {
      interruption_point();  // a stop during a multi-GB load ends it within one chunk (the reader is joined)
      done += bytes;
      if (done >= next_report && done < total) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        spdlog::info("loading {}: {:.1f}/{:.1f} GB ({:.2f} GB/s)", path, done / 1e9, total / 1e9, done / 1e9 / s);
        while (next_report <= done) next_report += 2ull << 30;
      }
    });
  };
  std::map<std::string, std::string> aliases;
  for (const auto& [k, v] : file.metadata()) {
    aliases[add + (lerobot && starts_with(k, "model.") ? k.substr(6) : k)] =
        add + (lerobot && starts_with(v, "model.") ? v.substr(6) : v);
  }
  auto report = load_from(model, src, path, aliases, options);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("loaded {} tensors ({:.2f} GB) from {}{} in {:.1f} s", report.loaded.size(), done / 1e9, path,
               lerobot ? " (LeRobot layout)" : "", secs);
  return report;
}

LoadReport load_named_weights(model::Pi0Impl& model, const std::map<std::string, torch::Tensor>& tensors,
                              const std::string& source, const LoadOptions& options) {
  Source src;
  for (const auto& [n, t] : tensors) src.names.push_back(n);
  src.shape = [&](const std::string& n) { return tensors.at(n).sizes().vec(); };
  src.dtype = [&](const std::string& n) { return tensors.at(n).scalar_type(); };
  src.read_into = [&](const std::vector<std::pair<std::string, torch::Tensor>>& reads) {
    for (const auto& [n, dst] : reads) dst.copy_(tensors.at(n));
  };
  return load_from(model, src, source, {}, options);
}

std::vector<model::ParamSpec> export_layout(const model::Pi0Options& options) {
  auto o = options;
  o.paligemma.lora_rank = o.action_expert.lora_rank = 0;
  std::vector<model::ParamSpec> out;
  if (o.fast) {
    for (auto spec : model::parameter_layout(o)) out.push_back({fast_openpi_name(spec.name), spec.shape});
    return out;
  }
  for (auto spec : model::parameter_layout(o)) {
    if (spec.name == model::kEmbeddingName) spec.name = kLmHeadName;
    out.push_back(spec);
  }
  out.push_back({kExpertLmHeadName, {o.paligemma.vocab_size, o.action_expert.width}});
  return out;
}

FileDigest save_model_weights(model::Pi0Impl& model, const std::string& path, const SaveOptions& options,
                              const std::map<std::string, torch::Tensor>* replace) {
  std::vector<LazyTensor> tensors;
  std::map<std::string, std::string> metadata = options.metadata;
  auto lazy = [&](const std::string& name, const torch::Tensor& t) {
    const auto dtype = options.dtype.value_or(t.scalar_type());
    // The conversion happens when the writer gets to this tensor, and its result is dropped right after.
    tensors.push_back({name, dtype, t.sizes().vec(), [t, dtype] { return t.detach().to(dtype); }});
  };
  for (const auto& item : model.named_parameters()) {
    const auto& name = item.key();
    if (!options.include_lora && name.find(".lora_") != std::string::npos) continue;
    if (options.include && !options.include(name)) continue;
    torch::Tensor value = item.value();
    if (replace) {
      auto it = replace->find(name);
      if (it != replace->end()) value = it->second;
    }
    if (options.openpi_layout && model.is_fast()) {
      lazy(fast_openpi_name(name), value);
      continue;
    }
    if (options.openpi_layout && name == model::kEmbeddingName) {
      // Stored once under the lexicographically smaller tied name, as safetensors.save_model does.
      lazy(kLmHeadName, value);
      metadata[model::kEmbeddingName] = kLmHeadName;
      continue;
    }
    lazy(name, value);
  }
  if (options.openpi_layout && model.is_fast()) {
    metadata["format"] = "pt";
  } else if (options.openpi_layout) {
    const auto& o = model.options();
    auto dtype = options.dtype.value_or(model.action_in_proj->weight.scalar_type());
    // Unused by the forward pass but required by openpi's strict loader.
    const std::vector<int64_t> shape = {o.paligemma.vocab_size, o.action_expert.width};
    tensors.push_back({kExpertLmHeadName, dtype, shape, [shape, dtype] { return torch::zeros(shape, dtype); }});
    metadata["format"] = "pt";
  }
  return save_safetensors_lazy(path, tensors, metadata, options.progress);
}

namespace {
// Tensor names of a model file normalized as load_model_weights does: LeRobot's "model." prefix dropped.
struct FileNames {
  bool lerobot = false;
  std::map<std::string, std::string> file_name;  // normalized → in the file
  std::map<std::string, std::string> aliases;
};

FileNames file_names(const SafetensorsFile& file) {
  FileNames f;
  f.lerobot = !file.names().empty() && std::all_of(file.names().begin(), file.names().end(), [](const auto& n) {
    return starts_with(n, "model.");
  });
  for (const auto& n : file.names()) f.file_name[f.lerobot ? n.substr(6) : n] = n;
  for (const auto& [k, v] : file.metadata()) {
    f.aliases[f.lerobot && starts_with(k, "model.") ? k.substr(6) : k] =
        f.lerobot && starts_with(v, "model.") ? v.substr(6) : v;
  }
  return f;
}
}  // namespace

int64_t adopt_file_dtypes(model::Pi0Impl& model, const std::string& path,
                          const std::function<bool(const std::string&, torch::ScalarType)>& accept) {
  SafetensorsFile file(path);
  const auto f = file_names(file);
  int64_t changed = 0;
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    const auto& name = item.key();
    std::string from = name;
    if (!f.file_name.count(from)) {
      if (name == model::kEmbeddingName && f.file_name.count(kLmHeadName)) from = kLmHeadName;
      else if (f.aliases.count(name) && f.file_name.count(f.aliases.at(name))) from = f.aliases.at(name);
      else continue;
    }
    const auto& info = file.info(f.file_name.at(from));
    auto& p = item.value();
    if (info.scalar_type == p.scalar_type() || info.shape != p.sizes().vec() || !accept(name, info.scalar_type))
      continue;
    p.set_data(torch::empty(p.sizes(), p.options().dtype(info.scalar_type)));
    ++changed;
  }
  return changed;
}

BaseWeightsRef make_base_ref(const std::string& path) {
  namespace fs = pi0::posix_fs;
  BaseWeightsRef ref;
  ref.path = fs::absolute(path).lexically_normal().string();
  std::error_code ec;
  ref.size = fs::file_size(path, ec);
  if (ec) throw UserError(path + ": cannot read the base weights (" + ec.message() + ")");
  ref.checksum = digest_file(path).xxh3;
  return ref;
}

void write_base_ref(const std::string& checkpoint_dir, const BaseWeightsRef& ref) {
  namespace fs = pi0::posix_fs;
  const nlohmann::json j = {{"path", ref.path}, {"size", ref.size}, {"checksum", ref.checksum},
                            {"checksum_algorithm", kChecksumAlgorithm},
                            {"frozen_dtype", ref.frozen_dtype}};
  const auto path = fs::path(checkpoint_dir) / kBaseRefFile;
  write_file_atomic(path.string(), j.dump(2) + "\n");
}

std::optional<BaseWeightsRef> read_base_ref(const std::string& checkpoint_dir) {
  namespace fs = pi0::posix_fs;
  const auto path = fs::path(checkpoint_dir) / kBaseRefFile;
  if (!fs::exists(path)) return std::nullopt;
  std::ifstream in(path);
  try {
    const auto j = nlohmann::json::parse(in);
    BaseWeightsRef ref;
    ref.path = j.at("path").get<std::string>();
    ref.size = j.at("size").get<uint64_t>();
    ref.checksum = j.at("checksum").get<std::string>();
    // References from before XXH3 hold a checksum of another algorithm, which nothing computes any more.
    if (j.value("checksum_algorithm", std::string()) != kChecksumAlgorithm) ref.checksum.clear();
    ref.frozen_dtype = j.value("frozen_dtype", std::string());
    if (!ref.frozen_dtype.empty() && !scalar_type_from_dtype(ref.frozen_dtype))
      throw std::runtime_error("frozen_dtype '" + ref.frozen_dtype + "' is not a safetensors dtype");
    return ref;
  } catch (const std::exception& e) {
    throw UserError(path.string() + ": malformed (" + e.what() + "); expected {\"path\", \"size\", \"checksum\"}");
  }
}

std::string load_checkpoint_weights(model::Pi0Impl& model, const std::string& checkpoint_dir,
                                    const std::string& base_override, const std::string& override_hint,
                                    bool reinit_mismatched_projections, bool exact_dtypes) {
  namespace fs = pi0::posix_fs;
  const auto model_file = (fs::path(checkpoint_dir) / kModelFile).string();
  const auto ref = read_base_ref(checkpoint_dir);
  if (!ref) {
    LoadOptions own;
    own.exact_dtypes = exact_dtypes;
    load_model_weights(model, model_file, own);
    return "";
  }
  const std::string base = base_override.empty() ? ref->path : base_override;
  const auto ref_file = (fs::path(checkpoint_dir) / kBaseRefFile).string();
  if (!fs::exists(base)) {
    throw UserError(ref_file + ": the base weights '" + base + "' this checkpoint builds on do not exist; if they " +
                    "moved, point at the new location with " + override_hint);
  }
  std::error_code ec;
  const auto size = fs::file_size(base, ec);
  if (size != ref->size) {
    throw UserError(ref_file + ": the base weights '" + base + "' have " + std::to_string(size) +
                    " bytes, expected " + std::to_string(ref->size) + " (the file changed); point at the original " +
                    "file with " + override_hint);
  }
  const auto checksum = ref->checksum.empty() ? std::string() : digest_file(base).xxh3;
  if (ref->checksum.empty()) {
    spdlog::warn("{}: written before {} checksums; the base weights '{}' are checked by size only", ref_file,
                 kChecksumAlgorithm, base);
  } else if (checksum != ref->checksum) {
    throw UserError(ref_file + ": the base weights '" + base + "' have checksum " + checksum + ", expected " +
                    ref->checksum + " (the file changed); point at the original file with " + override_hint);
  }
  LoadOptions base_opts;
  base_opts.reinit_mismatched_projections = reinit_mismatched_projections;
  auto base_report = load_model_weights(model, base, base_opts);
  if (!ref->frozen_dtype.empty()) {
    const auto narrow = *scalar_type_from_dtype(ref->frozen_dtype);
    const std::set<std::string> from_base(base_report.loaded.begin(), base_report.loaded.end());
    const auto narrow_size = static_cast<int64_t>(c10::elementSize(narrow));
    torch::NoGradGuard no_grad;
    for (auto& item : model.named_parameters()) {
      auto& p = item.value();
      if (from_base.count(item.key()) && p.scalar_type() != narrow && narrow_size < p.element_size())
        p.copy_(p.to(narrow));
    }
  }
  LoadOptions ck;
  ck.strict = false;  // the frozen part came from the base
  ck.exact_dtypes = exact_dtypes;
  auto report = load_model_weights(model, model_file, ck);
  if (!report.unexpected.empty()) {
    throw UserError(model_file + ": tensor '" + report.unexpected.front() + "' is not a parameter of the model");
  }
  // Every parameter must come from one of the two files (LoRA factors included: a checkpoint always has them).
  std::set<std::string> filled(base_report.loaded.begin(), base_report.loaded.end());
  filled.insert(report.loaded.begin(), report.loaded.end());
  std::vector<std::string> missing;
  for (const auto& item : model.named_parameters())
    if (!filled.count(item.key())) missing.push_back(item.key());
  if (!missing.empty()) {
    throw UserError(model_file + ": parameters in neither it nor the base '" + base + "': [" + join(missing) + "]");
  }
  return base;
}

}  // namespace pi0::io
