// pi0-train: fine-tune pi0 / pi0.5 from a YAML config.
//   pi0-train --config run.yaml [--set section.key=value ...] [--resume [--new-validation-set]]
//             [--print-params [--world-size N] [--card-gib 16,32,96,141] [--json]]
//             [--dump-batches N DIR] [--profile-steps N [--profile-dir DIR]]
// Data parallel: launch one process per GPU (or CPU rank) with torchrun --no-python or SLURM srun; the rank, world
// size and rendezvous come from the environment (see docs/distributed.md).
// Exit codes: 0 done (or stopped by SIGINT/SIGTERM: after saving, or before the first step with nothing to save),
// 2 bad input, 3 training diverged or out of memory, 1 internal, 4 distributed failure (a peer rank died or hung, rendezvous failed).
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/app/out_of_memory.h"
#include "pi0/common/check.h"
#include "pi0/common/interrupt.h"
#include "pi0/common/logging.h"
#include "pi0/common/profiler.h"
#include "pi0/common/threads.h"
#include "pi0/config/config.h"
#include "pi0/distributed/dist_env.h"
#include "pi0/distributed/process_group.h"
#include "pi0/train/memory_plan.h"
#include "pi0/train/sample_dump.h"
#include "pi0/train/signals.h"
#include "pi0/train/trainer.h"

namespace {

struct Args {
  std::string config;
  std::vector<std::string> overrides;
  bool resume = false, new_validation_set = false, print_params = false, json = false, reference = false;
  int64_t world_size = 0;  ///< --world-size; 0: the launcher's WORLD_SIZE (1 outside a launched job)
  std::string card_gib;    ///< --card-gib: the fit table's cards ("16,32,96,141"); empty: 24, 40, 48, 80
  std::vector<std::string> dump;  ///< --dump-batches N DIR
  int64_t profile_steps = 0;      ///< --profile-steps N: steps the profiler records (0: off)
  std::string profile_dir;        ///< --profile-dir DIR; empty: <checkpoint.run_dir>/profile
};

// --profile-steps/--profile-dir as the trainer's profiler options; an explicit folder is made now, so a bad one is
// refused before the model is built rather than after the first step.
pi0::ProfilerOptions profiler_options(const Args& args, const pi0::config::Config& cfg) {
  pi0::ProfilerOptions p;
  p.steps = args.profile_steps;
  p.dir = args.profile_dir.empty() ? cfg.checkpoint.run_dir + "/profile" : args.profile_dir;
  if (!args.profile_dir.empty()) pi0::make_profile_dir(p.dir, "--profile-dir");
  return p;
}

// The N of --dump-batches N DIR.
int64_t dump_count(const std::string& text) {
  size_t used = 0;
  long long n = 0;
  try {
    n = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || n < 1)
    throw pi0::UserError("--dump-batches: got '" + text + "' samples, expected an integer >= 1 (--dump-batches N DIR)");
  return n;
}

int print_params(const pi0::config::Config& cfg, const Args& args) {
  // The job being planned: --world-size, else the one this process was launched into (so --print-params inside
  // a torchrun/srun job reports that job's per-rank figures), else a single process.
  const int64_t world_size =
      args.world_size > 0 ? args.world_size : pi0::distributed::dist_env_from_environment().world_size;
  const auto cards =
      args.card_gib.empty() ? pi0::train::common_cards_gib() : pi0::train::parse_card_gib(args.card_gib, "--card-gib");
  if (args.json) std::cout << pi0::train::memory_report_json(cfg, world_size, args.resume, cards).dump(2) << "\n";
  else std::cout << pi0::train::format_memory_report(cfg, world_size, args.resume, cards);
  return 0;
}

// What an out-of-memory error will report (app/out_of_memory.h): the plan --print-params prints for this job, or
// once `trainer` is built, the plan of what it runs: train.offload and train.gradient_checkpointing as it decided
// "auto" from the GPU's memory.
void remember_memory_plan(const pi0::config::Config& cfg, int64_t world_size, pi0::train::Trainer* trainer = nullptr) {
  pi0::app::OutOfMemoryContext c;
  c.world_size = world_size;
  c.grad_accum_steps = cfg.train.grad_accum_steps;
  c.freeze = cfg.train.freeze;
  c.shard = cfg.dist.shard;
  try {
    std::optional<pi0::model::CheckpointedLayers> checkpointed;
    if (trainer) checkpointed = trainer->model()->checkpointed_layers();
    const auto plan = pi0::train::plan_memory(cfg, world_size, checkpointed);
    c.checkpointing = pi0::train::describe_checkpointing(cfg, plan.checkpointed);
    c.micro_batch = plan.micro_batch;
    const auto rank = trainer ? pi0::train::plan_rank_memory(cfg, world_size, trainer->offload() != nullptr)
                              : pi0::train::plan_rank_memory(cfg, world_size);
    c.predicted_peak_bytes = rank.peak_bytes(plan.activations);
  } catch (const std::exception&) {
    // A config the plan refuses is refused by the trainer too, with the same message: the context stays partial.
  }
  pi0::app::set_out_of_memory_context(c);
}

int train_main(int argc, char** argv) {
  Args args;
  auto cli = pi0::app::make_parser("pi0-train", "Fine-tunes pi0 / pi0.5 from a YAML config (docs/config.md).");
  cli->add_option("--config", args.config, "the run's YAML config")->check(pi0::app::non_empty());
  pi0::app::add_config_overrides(*cli, args.overrides);
  auto* resume =
      cli->add_flag("--resume", args.resume, "continue from the newest complete checkpoint in checkpoint.run_dir");
  cli->add_flag("--new-validation-set", args.new_validation_set,
                "with --resume: accept another held-out validation set than the checkpoint's (data.validation_split, "
                "train.seed, train.val_samples or the data changed); earlier val_loss values are then not comparable "
                "and checkpoint.keep_best ranks afresh")
      ->needs(resume);
  auto* print = cli->add_flag("--print-params", args.print_params,
                              "print total, trainable and frozen parameters and their memory per component, then exit");
  cli->add_flag("--json", args.json, "with --print-params: as JSON")->needs(print);
  cli->add_option("--world-size", args.world_size,
                  "with --print-params: plan for this many data-parallel ranks (dist.shard decides what they "
                  "split; default: WORLD_SIZE of a launched job, else 1)")
      ->check(pi0::app::int_in(1))
      ->needs(print);
  cli->add_option("--card-gib", args.card_gib,
                  "with --print-params: the GPU memory sizes (GiB, comma-separated, e.g. 16,32,96,141) of the "
                  "card-fit table; default 24,40,48,80")
      ->needs(print);
  cli->add_option("--dump-batches", args.dump,
                  "write the first N samples training reads to the new directory DIR (frames as read and as the model "
                  "sees them, state, actions, prompt tokens; docs/data.md), then exit")
      ->expected(2)
      ->type_name("N DIR");
  auto* profile = cli->add_option("--profile-steps", args.profile_steps,
                                  "record N training steps with the profiler, after one unrecorded step, and write a "
                                  "Chrome/Perfetto trace and a table of where each step's time goes (docs/profiling.md)")
                      ->check(pi0::app::int_in(1));
  cli->add_option("--profile-dir", args.profile_dir,
                  "with --profile-steps: the folder for trace.json, profile.txt and profile.json (default: "
                  "<checkpoint.run_dir>/profile)")
      ->check(pi0::app::non_empty())
      ->needs(profile);
  cli->add_flag("--config-reference", args.reference, "print every config key with its default (markdown) and exit");
  cli->footer("Exit codes: 0 done (or stopped by SIGINT/SIGTERM), 1 internal error, 2 bad input (one line on stderr "
              "naming the flag, key or file), 3 training diverged or out of memory, 4 distributed failure.");
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  if (args.reference) {
    std::cout << "| key | default | meaning |\n|---|---|---|\n";
    for (const auto& [key, def, doc] : pi0::config::config_reference())
      std::cout << "| `" << key << "` | `" << def << "` | " << doc << " |\n";
    return 0;
  }
  if (args.config.empty()) throw pi0::UserError("--config is required (see --help)");
  auto cfg = pi0::config::load_config(args.config, args.overrides);
  if (args.print_params) return print_params(cfg, args);
  if (!args.dump.empty()) {
    pi0::train::dump_samples(cfg, dump_count(args.dump[0]), args.dump[1]);
    return 0;
  }

  pi0::train::RunOptions run;
  run.resume = args.resume;
  if (args.profile_steps > 0) run.profile = profiler_options(args, cfg);
  run.new_validation_set = args.new_validation_set;
  const auto env = pi0::distributed::dist_env_from_environment();
  run.rank = env.rank;
  run.world_size = env.world_size;
  pi0::set_log_rank(static_cast<int>(run.rank));
  remember_memory_plan(cfg, run.world_size);
  if (env.distributed()) {
    if (cfg.train.device == "cuda") cfg.train.device = "cuda:" + std::to_string(env.local_rank);  // one GPU per rank
    spdlog::info("rank {} of {} (local rank {}, launcher {}), device {}, rendezvous {}:{}", env.rank,
                 env.world_size, env.local_rank, env.launcher, cfg.train.device, env.master_addr, env.master_port);
    run.process_group = std::make_shared<pi0::distributed::ProcessGroup>(env, torch::Device(cfg.train.device),
                                                                  std::chrono::seconds(cfg.dist.timeout_s));
  }
  spdlog::info("config {} as resolved (saved as {}/config.yaml):\n{}", args.config, cfg.checkpoint.run_dir,
               pi0::config::to_compact_text(cfg));
  spdlog::info("{} (train.num_threads {})", pi0::set_num_threads(static_cast<int>(cfg.train.num_threads)).describe(),
               cfg.train.num_threads);
  try {
    pi0::test_pause_until_interrupt("train_startup");  // tests only (docs/testing.md): a stop before the Trainer's build
    pi0::train::Trainer trainer(cfg, run);
    remember_memory_plan(cfg, run.world_size, &trainer);
    trainer.run();
  } catch (const pi0::Interrupted&) {
    // SIGINT/SIGTERM during start-up (data checks, model build, weight load, resume): a stop on request, not a
    // failure. Once a step has run, a stop finishes that step and saves instead (Trainer::run).
    std::cout.flush();
    std::cerr << "stopped before the first step; nothing to save" << std::endl;
    return 0;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  pi0::app::use_passive_openmp_wait(argv);  // before anything else: the program may start again from here
  // First thing: a SIGINT/SIGTERM at any point of start-up sets the stop flag (checked at the interruption points
  // of start-up and after every step) instead of killing the process with no message.
  pi0::train::install_stop_signal_handlers();
  return pi0::app::run_app("pi0-train", [&] { return train_main(argc, argv); });
}
