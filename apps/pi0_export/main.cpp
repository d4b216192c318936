// pi0-export: turns a training checkpoint into an inference bundle (docs/formats.md, "Inference bundle").
//   pi0-export --checkpoint <run dir | run_dir/checkpoints/<step>> --out <bundle dir> [--weights ema|model]
//              [--dtype bf16|float32]
// A run directory exports its newest complete checkpoint. Exit codes: 0 done, 2 bad input, 1 internal error.
#include <filesystem>
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/io/bundle.h"
#include "pi0/train/checkpoint_dir.h"

namespace {

const char* kUsage =
    "usage: pi0-export --checkpoint <run dir | run_dir/checkpoints/<step>> --out <bundle dir>\n"
    "                  [--weights ema|model] [--dtype bf16|float32] [--base-weights PATH]\n"
    "  --weights  default: ema if the checkpoint has EMA weights, else model\n"
    "  --dtype    dtype of the exported weights (default bf16, like openpi's converter)\n"
    "  --base-weights  a small checkpoint's frozen base (base_weights.json) at a new location\n";

// A checkpoint directory as given, or the newest complete checkpoint of a run directory.
std::string resolve_checkpoint(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) throw pi0::UserError("--checkpoint: '" + path + "' is not a directory");
  if (fs::exists(fs::path(path) / pi0::train::kCompleteMarker)) return path;
  if (auto newest = pi0::train::newest_complete_checkpoint(path)) {
    spdlog::info("{}: newest complete checkpoint is step {} ({})", path, newest->first, newest->second);
    return newest->second;
  }
  throw pi0::UserError("--checkpoint: '" + path + "' is neither a complete checkpoint (no " +
                       pi0::train::kCompleteMarker + ") nor a run directory with complete checkpoints in " +
                       pi0::train::checkpoints_dir(path));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    spdlog::info("{}", pi0::set_num_threads(0).describe());  // every available CPU
    std::string checkpoint, out;
    pi0::io::ExportOptions opt;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw pi0::UserError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--checkpoint") checkpoint = value();
      else if (a == "--base-weights") opt.base_weights = value();
      else if (a == "--out") out = value();
      else if (a == "--weights") {
        opt.weights = value();
        if (opt.weights != "ema" && opt.weights != "model")
          throw pi0::UserError("--weights: got '" + opt.weights + "', expected ema or model");
      } else if (a == "--dtype") {
        const auto d = value();
        if (d == "bf16" || d == "bfloat16") opt.dtype = torch::kBFloat16;
        else if (d == "float32" || d == "f32") opt.dtype = torch::kFloat32;
        else throw pi0::UserError("--dtype: got '" + d + "', expected bf16 or float32");
      } else if (a == "-h" || a == "--help") {
        std::cout << kUsage;
        return 0;
      } else {
        throw pi0::UserError("unknown argument '" + a + "' (see --help)");
      }
    }
    if (checkpoint.empty() || out.empty()) throw pi0::UserError("--checkpoint and --out are required (see --help)");
    const auto report = pi0::io::export_bundle(resolve_checkpoint(checkpoint), out, opt);
    std::cout << "wrote " << report.out_dir << " from " << report.checkpoint_dir << " (" << report.weights
              << " weights, " << report.lora_layers_merged << " LoRA layers merged)\n";
    return 0;
  } catch (const pi0::UserError& e) {
    std::cerr << "pi0-export: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "pi0-export: internal error: " << e.what() << "\n";
    return 1;
  }
}
