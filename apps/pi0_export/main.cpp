// pi0-export: turns a training checkpoint into an inference bundle (docs/formats.md, "Inference bundle").
//   pi0-export --checkpoint <run dir | run_dir/checkpoints/<step>> --out <bundle dir> [--best] [--weights ema|model]
//              [--dtype bf16|float32] [--base-weights PATH]
// A run directory exports its newest complete checkpoint that verifies (newer ones that do not are skipped with a
// warning, as pi0-train --resume does), or with --best its lowest val_loss as checkpoint.keep_best ranks it
// (train/best_checkpoint.h). Flags and exit codes: pi0-export --help.
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/common/threads.h"
#include "pi0/io/bundle.h"
#include "pi0/train/best_checkpoint.h"

namespace {

int export_main(int argc, char** argv) {
  std::string checkpoint, out, dtype = "bf16";
  bool best = false;
  pi0::io::ExportOptions opt;
  auto cli = pi0::app::make_parser("pi0-export", "Turns a training checkpoint into an inference bundle.");
  cli->add_option("--checkpoint", checkpoint, "run directory (its newest complete checkpoint) or one checkpoint")
      ->required()->check(pi0::app::non_empty());
  cli->add_option("--out", out, "bundle directory to write")->required()->check(pi0::app::non_empty());
  cli->add_flag("--best", best,
                "export the run directory's checkpoint with the lowest val_loss, as checkpoint.keep_best ranks them "
                "(the training log's 'best so far'), instead of the newest");
  cli->add_option("--weights", opt.weights, "ema or model (default: ema if the checkpoint has EMA weights, else model)")
      ->check(pi0::app::one_of({"ema", "model"}));
  cli->add_option("--dtype", dtype, "dtype of the exported weights (bf16 like openpi's converter; bfloat16, f32 also)")
      ->check(pi0::app::one_of({"bf16", "bfloat16", "float32", "f32"}));
  cli->add_option("--base-weights", opt.base_weights,
                  "a small checkpoint's frozen base (base_weights.json) at a new location")
      ->check(pi0::app::non_empty());
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  opt.dtype = dtype == "float32" || dtype == "f32" ? torch::kFloat32 : torch::kBFloat16;
  spdlog::info("{}", pi0::set_num_threads(0).describe());  // every available CPU
  if (best) pi0::train::export_best(checkpoint, out, opt);  // logs which checkpoint and what it wrote
  else pi0::io::export_run(checkpoint, out, opt);           // logs what it wrote, once
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("pi0-export", [&] { return export_main(argc, argv); });
}
