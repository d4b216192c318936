// bench_infer: sampling latency (prefix pass + 10 Euler steps with the KV cache, batch 1) for 1 and 3 cameras,
// the number a robot sees per action chunk. Random weights: latency does not depend on their values.
//   bench_infer [--config configs/pi05_libero.yaml] [--device cpu|cuda] [--dtype bf16|float32]
//               [--cameras 1,3] [--iters N] [--warmup W] [--json out.json] [--cuda-graph off,on]
// --cuda-graph: rows with the denoising loop replayed as a CUDA graph ("on") and launched op by op ("off").
// Target for the full-size models on an H100: <= 30 ms for 3 cameras and 10 steps.
// On CUDA, SampleTiming synchronizes the device before reading each clock.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/nn/param_device.h"
#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/model/model_config.h"
#include "pi0/model/pi0.h"

using namespace pi0;

namespace {

struct Args {
  std::string config = "configs/pi05_libero.yaml", device = "cpu", dtype = "bf16", json;
  std::vector<int64_t> cameras = {1, 3};
  std::vector<std::string> cuda_graph = {"off"};
  int iters = 20, warmup = 3;
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UserError(k + " needs a value");
      return argv[++i];
    };
    if (k == "--config") a.config = value();
    else if (k == "--device") a.device = value();
    else if (k == "--dtype") a.dtype = value();
    else if (k == "--iters") a.iters = std::stoi(value());
    else if (k == "--warmup") a.warmup = std::stoi(value());
    else if (k == "--json") a.json = value();
    else if (k == "--cuda-graph") {
      a.cuda_graph.clear();
      std::stringstream ss(value());
      for (std::string c; std::getline(ss, c, ',');) {
        if (c != "on" && c != "off") throw UserError("--cuda-graph takes on and/or off (got " + c + ")");
        a.cuda_graph.push_back(c);
      }
    } else if (k == "--cameras") {
      a.cameras.clear();
      std::stringstream ss(value());
      for (std::string c; std::getline(ss, c, ',');) a.cameras.push_back(std::stoll(c));
    } else throw UserError("unknown argument '" + k + "' (see the usage line at the top of bench/bench_infer.cpp)");
  }
  if (a.dtype != "bf16" && a.dtype != "float32") throw UserError("--dtype must be bf16 or float32 (got " + a.dtype + ")");
  if (a.iters < 1) throw UserError("--iters must be >= 1");
  return a;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto a = parse_args(argc, argv);
    const torch::Device device(a.device);
    if (device.is_cuda() && !torch::cuda::is_available()) throw UserError("--device cuda: no usable CUDA device");
    const auto cfg = config::load_config(a.config);
    const auto opts = model::options_from_config(cfg.model);
    torch::NoGradGuard no_grad;
    model::Pi0 m{nullptr};
    {
      nn::ParamDeviceScope on_device(device);  // random weights made on the GPU, not on the host
      m = model::Pi0(opts);
    }
    const auto dtype = a.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;
    // Inference weights in the compute dtype (openpi's JAX inference loads every parameter as bf16).
    m->to(device, dtype);
    m->set_compute_dtype(dtype);
    m->eval();
    std::cout << "# bench_infer\n\nconfig " << a.config << " (" << (opts.pi05 ? "pi05" : "pi0") << "), device "
              << a.device << ", " << a.dtype << " weights and compute, batch 1, 10 steps with KV cache, median of "
              << a.iters << " after " << a.warmup << " warm-up\n\n"
              << "| cameras | cuda graph | prefix ms | per step ms | total ms |\n|---|---|---|---|---|\n";
    nlohmann::json rows = nlohmann::json::array();
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
    for (const auto& graph : a.cuda_graph)
    for (const int64_t cams : a.cameras) {
      m->set_cuda_graph(graph == "on");
      model::Observation obs;
      for (int64_t c = 0; c < cams; ++c) {
        obs.images.push_back(torch::rand({1, 3, opts.siglip.image_size, opts.siglip.image_size}, f32) * 2 - 1);
        obs.image_masks.push_back(torch::ones({1}, torch::TensorOptions().dtype(torch::kBool).device(device)));
      }
      obs.state = torch::zeros({1, opts.action_dim}, f32);
      obs.tokenized_prompt = torch::randint(1, 1000, {1, opts.max_token_len}, f32.dtype(torch::kLong));
      obs.tokenized_prompt_mask = torch::ones({1, opts.max_token_len}, f32.dtype(torch::kBool));
      auto noise = torch::randn({1, opts.action_horizon, opts.action_dim}, f32);
      std::vector<double> prefix, step, total;
      for (int i = 0; i < a.warmup + a.iters; ++i) {
        model::SampleTiming t;
        m->sample_actions(obs, noise, 10, true, &t);
        if (i < a.warmup) continue;
        prefix.push_back(t.prefix_ms);
        step.push_back((t.total_ms() - t.prefix_ms) / static_cast<double>(t.step_ms.size()));
        total.push_back(t.total_ms());
      }
      std::printf("| %lld | %s | %.2f | %.2f | %.2f |\n", static_cast<long long>(cams), graph.c_str(), median(prefix),
                  median(step), median(total));
      rows.push_back({{"cameras", cams}, {"cuda_graph", graph == "on"}, {"prefix_ms", median(prefix)}, {"step_ms", median(step)},
                      {"total_ms", median(total)}});
    }
    if (!a.json.empty()) {
      std::ofstream(a.json) << nlohmann::json{{"config", a.config}, {"device", a.device}, {"dtype", a.dtype},
                                              {"rows", rows}}.dump(2)
                            << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_infer: " << e.what() << "\n";
    return 1;
  }
}
