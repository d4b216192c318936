// pi0-serve: serves an inference bundle (pi0-export) to robot runtimes over openpi's websocket protocol.
//   pi0-serve --bundle DIR [--host 0.0.0.0] [--port 8000] [--device cpu|cuda[:N]] [--robot libero|aloha|droid|raw]
//             [--num-steps 10] [--dtype bf16|f32] [--api-key KEY] [--max-clients N] ...
// Protocol, profiles and errors: docs/serving.md. Exit codes: 0 stopped by SIGINT/SIGTERM, 2 bad input, 1 internal.
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/io/bundle.h"
#include "pi0/io/safetensors.h"
#include "pi0/serve/policy.h"
#include "pi0/serve/server.h"

namespace {

const char* kUsage =
    "usage: pi0-serve --bundle DIR [--host 0.0.0.0] [--port 8000] [--device cpu|cuda[:N]]\n"
    "                 [--robot libero|aloha|droid|raw] [--num-steps 10] [--dtype bf16|f32] [--api-key KEY]\n"
    "                 [--max-clients 64] [--max-batch 0] [--io-threads 2] [--default-prompt TEXT]\n"
    "                 [--noise noise.safetensors]\n"
    "  --robot        observation keys and action dims of the robot runtime (default libero; docs/serving.md)\n"
    "  --dtype        activations: f32 (default on CPU) or bf16 (default on CUDA)\n"
    "  --api-key      refuse clients without the header 'Authorization: Api-Key KEY'\n"
    "  --max-batch    requests per model call (0 = 1 on CPU, 8 on CUDA)\n"
    "  --default-prompt  task text for observations without 'prompt'\n"
    "  --noise        fixed initial noise [H,A] (key 'noise') for every request: deterministic answers (tests)\n"
    "  --port 0       any free port; the chosen one is printed\n";

struct Args {
  std::string bundle, host = "0.0.0.0", device = "cpu", robot = "libero", dtype, api_key, noise;
  std::optional<std::string> default_prompt;
  int64_t port = 8000, num_steps = 10, max_clients = 64, max_batch = 0, io_threads = 2;
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  try {
    size_t used = 0;
    const int64_t x = std::stoll(v, &used);
    if (used == v.size() && x >= lo && x <= hi) return x;
  } catch (const std::exception&) {
  }
  throw pi0::UserError(flag + ": got '" + v + "', expected an integer in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw pi0::UserError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--bundle") a.bundle = value();
    else if (arg == "--host") a.host = value();
    else if (arg == "--port") a.port = parse_int(arg, value(), 0, 65535);
    else if (arg == "--device") a.device = value();
    else if (arg == "--robot") a.robot = value();
    else if (arg == "--num-steps") a.num_steps = parse_int(arg, value(), 1, 1000);
    else if (arg == "--dtype") a.dtype = value();
    else if (arg == "--api-key") a.api_key = value();
    else if (arg == "--max-clients") a.max_clients = parse_int(arg, value(), 1, 100000);
    else if (arg == "--max-batch") a.max_batch = parse_int(arg, value(), 0, 1024);
    else if (arg == "--io-threads") a.io_threads = parse_int(arg, value(), 1, 256);
    else if (arg == "--default-prompt") a.default_prompt = value();
    else if (arg == "--noise") a.noise = value();
    else if (arg == "-h" || arg == "--help") {
      std::cout << kUsage;
      std::exit(0);
    } else {
      throw pi0::UserError("unknown argument '" + arg + "' (see --help)");
    }
  }
  if (a.bundle.empty()) throw pi0::UserError("--bundle is required (see --help)");
  if (!a.dtype.empty() && a.dtype != "bf16" && a.dtype != "f32")
    throw pi0::UserError("--dtype: got '" + a.dtype + "', expected bf16 or f32");
  return a;
}

torch::Device parse_device(const std::string& s) {
  torch::Device d(torch::kCPU);
  try {
    if (s != "cpu" && s.rfind("cuda", 0) != 0) throw std::invalid_argument(s);
    d = torch::Device(s);
  } catch (const std::exception&) {
    throw pi0::UserError("--device: got '" + s + "', expected cpu, cuda or cuda:N");
  }
  if (d.is_cuda() && !torch::cuda::is_available())
    throw pi0::UserError("--device: got '" + s + "' but no CUDA device is usable (CPU-only LibTorch or no GPU); use --device cpu");
  return d;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    const torch::Device device = parse_device(args.device);
    pi0::serve::PolicyOptions po;
    po.robot = pi0::serve::parse_robot(args.robot);
    po.num_steps = args.num_steps;
    po.max_batch = args.max_batch;
    po.default_prompt = args.default_prompt;
    const std::string dtype = args.dtype.empty() ? (device.is_cuda() ? "bf16" : "f32") : args.dtype;
    po.compute_dtype = dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
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

    pi0::serve::Policy policy(pi0::io::load_bundle(args.bundle, device), po);
    {
      pi0::serve::Server server(policy, so);
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
  } catch (const pi0::UserError& e) {
    std::cerr << "pi0-serve: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "pi0-serve: internal error: " << e.what() << "\n";
    return 1;
  }
}
