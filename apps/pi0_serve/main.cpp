// pi0-serve: serves an inference bundle (pi0-export) to robot runtimes over openpi's websocket protocol.
//   pi0-serve --bundle DIR | --checkpoint RUN_DIR [--best]  [--host 0.0.0.0] [--port 8000] [--device cpu|cuda[:N]] [--robot libero|aloha|droid|raw]
//             [--num-steps 10] [--dtype bf16|f32] [--api-key KEY] [--max-clients N] [--metadata key=json]
//             [--rtc auto|guided|trained|off] [--rtc-jacobian identity|exact] [--rtc-schedule exp|...] ...
// Protocol, profiles and errors: docs/serving.md. Flags and exit codes: pi0-serve --help.
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/common/interrupt.h"
#include "pi0/common/threads.h"
#include "pi0/infer/inference.h"
#include "pi0/io/bundle.h"
#include "pi0/io/safetensors.h"
#include "pi0/serve/policy.h"
#include "pi0/serve/server.h"
#include "pi0/train/best_checkpoint.h"
#include "pi0/train/signals.h"

namespace {

struct Args {
  std::string checkpoint;
  bool best = false;
  std::string bundle, host = "0.0.0.0", device = "cpu", robot = "libero", dtype, api_key, noise, asset;
  std::optional<std::string> default_prompt;
  std::vector<std::string> metadata;
  pi0::infer::RtcSettings rtc;
  int64_t port = 8000, num_steps = 10, max_clients = 64, max_batch = 0, io_threads = 2, max_frame_mb = 256;
};

int serve_main(int argc, char** argv) {
  Args args;
  auto cli = pi0::app::make_parser("pi0-serve",
                                   "Serves an inference bundle to robot runtimes over openpi's websocket protocol.");
  cli->add_option("--bundle", args.bundle, "inference bundle directory (pi0-export); or --checkpoint")
      ->check(pi0::app::non_empty());
  cli->add_option("--checkpoint", args.checkpoint,
                  "instead of --bundle: a run directory (its newest checkpoint, or with --best its best) or one "
                  "checkpoint, exported as pi0-export does (EMA weights, bf16) to a temporary bundle under $TMPDIR "
                  "that is removed once loaded")
      ->check(pi0::app::non_empty());
  cli->add_flag("--best", args.best,
                "with --checkpoint RUN_DIR: serve the checkpoint with the lowest val_loss as checkpoint.keep_best "
                "ranks them (pi0-export --best's)");
  cli->add_option("--host", args.host, "address to listen on (127.0.0.1 keeps it local)")->check(pi0::app::non_empty());
  cli->add_option("--port", args.port, "TCP port; 0 = any free port (the chosen one is printed)")
      ->check(pi0::app::int_in(0, 65535));
  cli->add_option("--device", args.device, "cpu, cuda or cuda:N");
  cli->add_option("--robot", args.robot, "observation keys and action dims of the robot runtime: libero, aloha, "
                  "droid or raw (docs/serving.md)");
  cli->add_option("--num-steps", args.num_steps, "denoising steps")->check(pi0::app::int_in(1, 1000));
  cli->add_option("--dtype", args.dtype,
                  "compute precision bf16 or f32 (default: the bundle's, i.e. bf16 for a bf16 export, as pi0-infer)")
      ->check(pi0::app::one_of({"bf16", "bfloat16", "f32", "float32"}));
  cli->add_option("--asset", args.asset,
                  "which dataset's norm stats and robot settings to apply, by asset id (a model trained on a mixture "
                  "holds one per dataset; default: the bundle's first, its config.json asset_id)")
      ->check(pi0::app::non_empty());
  cli->add_option("--api-key", args.api_key, "refuse clients without the header 'Authorization: Api-Key KEY'")
      ->check(pi0::app::non_empty());
  cli->add_option("--max-clients", args.max_clients, "connections served at once")->check(pi0::app::int_in(1, 100000));
  cli->add_option("--max-batch", args.max_batch, "requests per model call (0 = 1 on CPU, 8 on CUDA)")
      ->check(pi0::app::int_in(0, 1024));
  cli->add_option("--io-threads", args.io_threads, "network threads")->check(pi0::app::int_in(1, 256));
  cli->add_option("--max-frame-mb", args.max_frame_mb,
                  "largest observation frame in MiB; a larger one gets the error text frame and close 1011")
      ->check(pi0::app::int_in(1, 4096));
  cli->add_option("--metadata", args.metadata,
                  "key=<JSON value> added to the metadata sent on connect, over the bundle's (e.g. "
                  "reset_pose=[0,-1.5,1.5,0,0,0]; null removes a key); repeatable")
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->type_name("KEY=JSON");
  cli->add_option("--default-prompt", args.default_prompt, "task text for observations without 'prompt'");
  cli->add_option("--noise", args.noise,
                  "fixed initial noise [H,A] (key 'noise') for every request: deterministic answers (tests)")
      ->check(pi0::app::non_empty());
  pi0::app::add_rtc_options(*cli, args.rtc);
  cli->footer("Exit codes: 0 stopped by SIGINT/SIGTERM, 1 internal error, 2 bad input (one line on stderr naming "
              "the flag or file).");
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  if (args.bundle.empty() == args.checkpoint.empty()) {
    throw pi0::UserError(args.bundle.empty() ? "--bundle: missing; give a bundle (pi0-export --out) or --checkpoint "
                                               "RUN_DIR to serve a run's checkpoint"
                                             : "--bundle and --checkpoint: give one of them, not both");
  }
  if (args.best && args.checkpoint.empty()) {
    throw pi0::UserError("--best: needs --checkpoint RUN_DIR (a bundle holds one model already; pi0-export --best "
                         "picks a run's best)");
  }
  const torch::Device device = pi0::app::parse_device("--device", args.device);
  // On the CPU every available core, as pi0-infer: the same arithmetic. On CUDA the host only prepares requests
  // (small tensors), and a large intra-op pool costs more in wake-ups than it saves: on a 16-core H100 machine, pi0
  // with 3 cameras, 12.5 ms of per-request overhead with 16 threads against 5.8 ms with 4 (docs/benchmarks_gpu.md).
  // OMP_NUM_THREADS, when set, decides either way.
  const bool few_threads = device.is_cuda() && std::getenv("OMP_NUM_THREADS") == nullptr;
  spdlog::info("{}", pi0::set_num_threads(few_threads ? std::min(4, pi0::default_num_threads()) : 0).describe());
  pi0::serve::PolicyOptions po;
  po.robot = pi0::serve::parse_robot(args.robot);
  po.num_steps = args.num_steps;
  po.max_batch = args.max_batch;
  po.default_prompt = args.default_prompt;
  po.rtc = args.rtc;
  for (const auto& m : args.metadata) {
    auto [key, value] = pi0::serve::parse_metadata_flag(m);
    po.metadata[key] = value;
  }
  if (!args.noise.empty()) {
    const auto nt = pi0::io::read_safetensors(args.noise);
    if (nt.count("noise")) po.noise = nt.at("noise");
    else if (nt.size() == 1) po.noise = nt.begin()->second;
    else throw pi0::UserError(args.noise + ": no tensor 'noise', expected the initial noise [H,A]");
  }
  pi0::serve::ServerOptions so;
  so.host = args.host;
  so.port = static_cast<uint16_t>(args.port);
  so.api_key = args.api_key;
  so.max_clients = args.max_clients;
  so.io_threads = args.io_threads;
  so.max_frame_bytes = static_cast<size_t>(args.max_frame_mb) << 20;

  // The bundle's precision unless --dtype says otherwise: pi0-infer's rule, so both answer alike.
  // --checkpoint: exported once to a temporary bundle, removed once the policy has loaded it (the model and the
  // tokenizer), so nothing is left behind whatever happens to the server later.
  struct TempBundle {
    std::string dir;
    ~TempBundle() {
      std::error_code ec;
      if (!dir.empty()) pi0::posix_fs::remove_all(dir, ec);
    }
  } temp;
  std::string bundle_dir = args.bundle, served = args.bundle;
  if (!args.checkpoint.empty()) {
    const auto report = pi0::train::export_to_temp(args.checkpoint, args.best, {});
    temp.dir = bundle_dir = report.out_dir;
    served = report.checkpoint_dir;
  }
  auto bundle = pi0::io::load_bundle(bundle_dir, device, pi0::io::parse_compute_dtype(args.dtype), args.asset);
  bundle.dir = served;  // what the metadata's "bundle" names: the checkpoint, not the temporary copy
  pi0::serve::Policy policy(std::move(bundle), po);
  if (!temp.dir.empty()) {
    pi0::posix_fs::remove_all(temp.dir);
    temp.dir.clear();
  }
  {
    pi0::serve::Server server(policy, so);
    pi0::interruption_point();  // a SIGINT/SIGTERM during the load: stop before serving anyone
    const auto& md = policy.metadata();
    // One parseable line (tests and scripts wait for it), then the resolved settings.
    std::printf("pi0-serve: listening on ws://%s:%u\n", args.host.c_str(), static_cast<unsigned>(server.port()));
    std::printf("pi0-serve: %s\n", md.dump().c_str());
    std::fflush(stdout);
    server.run(/*handle_signals=*/true);
  }
  policy.stop();
  std::printf("pi0-serve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // First thing, as pi0-train: a SIGINT/SIGTERM during start-up (the bundle's load takes a while) sets the stop
  // flag instead of killing the process with no message, and one inherited as ignored (a background job of a
  // shell) is handled all the same. Serving hands both signals to the server's own handlers (Server::run).
  pi0::train::install_stop_signal_handlers("\npi0-serve: stop requested during start-up; exiting without serving "
                                           "(send the signal again to exit immediately)\n");
  return pi0::app::run_app("pi0-serve", [&] {
    try {
      return serve_main(argc, argv);
    } catch (const pi0::Interrupted&) {
      std::cout.flush();
      std::cerr << "pi0-serve: stopped before serving" << std::endl;
      return 0;
    }
  });
}
