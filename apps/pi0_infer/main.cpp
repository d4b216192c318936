// pi0-infer: runs an inference bundle (pi0-export) on an observation file and writes the predicted action chunk.
//   pi0-infer --bundle DIR --obs obs.safetensors --out actions.safetensors [--prompt "..."]
//             [--noise noise.safetensors] [--num-steps 10] [--device cpu|cuda[:N]] [--loss]
//             [--rtc auto|guided|trained|off] [--rtc-jacobian identity|exact] [--rtc-schedule exp|...] ...
//             [--prev-actions previous_out.safetensors [--prev-executed S] [--inference-delay D]]
// The observation file may carry the previous chunk of real-time chunking (prev_action_chunk, inference_delay,
// execute_horizon), read as pi0-serve reads them from a request; or --prev-actions gives a previous answer's rows
// from S on with delay D (the quickstart's RTC request).
// Observation keys (openpi names) and outputs: docs/formats.md, "Observation files for pi0-infer".
// Flags and exit codes: pi0-infer --help.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/shape_str.h"
#include "pi0/common/threads.h"
#include "pi0/data/observation_file.h"
#include "pi0/data/tokenizer.h"
#include "pi0/infer/inference.h"
#include "pi0/io/bundle.h"
#include "pi0/io/safetensors.h"

namespace {

using pi0::shape_str;

struct Args {
  std::string bundle, obs, out, noise, device = "cpu", cuda_graph = "on", dtype, asset;
  std::optional<std::string> prompt;
  pi0::infer::RtcSettings rtc;
  int64_t num_steps = 10;
  bool loss = false;
  bool simulate_fp8 = false;
  // Real-time chunking from the shell: the previous answer as a file instead of keys in the observation file.
  std::string prev_actions;
  std::optional<int64_t> prev_executed, inference_delay;
};

// `what` in `tensors` as float32 of exactly `shape`; UserError naming the file and key otherwise.
torch::Tensor float_of_shape(const std::map<std::string, torch::Tensor>& tensors, const std::string& key,
                             const std::string& source, const std::vector<int64_t>& shape, const std::string& legend) {
  auto it = tensors.find(key);
  if (it == tensors.end())
    throw pi0::UserError(source + ": missing tensor '" + key + "', expected float " + legend + " = " + shape_str(shape));
  const auto& t = it->second;
  if (!t.is_floating_point() || t.sizes().vec() != shape)
    throw pi0::UserError(source + ": '" + key + "' has shape " + shape_str(t.sizes()) + " and dtype " +
                         std::string(c10::toString(t.scalar_type())) + ", expected float " + legend + " = " +
                         shape_str(shape));
  pi0::data::check_finite(t, source + ": '" + key + "'");
  return t.to(torch::kFloat32);
}

int infer_main(int argc, char** argv) {
  Args args;
  auto cli = pi0::app::make_parser("pi0-infer",
                                   "Runs an inference bundle on an observation file and writes the action chunk.");
  cli->add_option("--bundle", args.bundle, "inference bundle directory (pi0-export)")
      ->required()->check(pi0::app::non_empty());
  cli->add_option("--obs", args.obs, "observation file (docs/formats.md)")->required()->check(pi0::app::non_empty());
  cli->add_option("--out", args.out, "actions file to write")->required()->check(pi0::app::non_empty());
  cli->add_option("--prompt", args.prompt,
                  "task text, tokenized with the bundle's tokenizer (else the file's tokenized_prompt[_mask])");
  cli->add_option("--noise", args.noise,
                  "initial noise [B,H,A] (key 'noise'; else the obs file's 'noise', else random)")
    ->check(pi0::app::non_empty());
  cli->add_option("--num-steps", args.num_steps, "denoising steps")->check(pi0::app::int_in(1));
  cli->add_option("--device", args.device, "cpu, cuda or cuda:N");
  cli->add_flag("--loss", args.loss,
                "the obs file also holds actions [B,H,A] (model space), noise [B,H,A] and time [B]: write the "
                "per-element flow-matching loss [B,H,A] instead of sampling");
  cli->add_option("--cuda-graph", args.cuda_graph,
                  "on CUDA, replay the whole call (prefix pass and denoising loop) as captured CUDA graphs "
                  "(no effect on CPU)")
    ->check(pi0::app::one_of({"on", "off"}));
  cli->add_option("--dtype", args.dtype,
                  "compute precision bf16 or f32 (default: the bundle's, i.e. bf16 for a bf16 export)")
    ->check(pi0::app::one_of({"bf16", "bfloat16", "f32", "float32"}));
  cli->add_option("--asset", args.asset,
                  "which dataset's norm stats and robot settings to apply, by asset id (a model trained on a mixture "
                  "holds one per dataset; default: the bundle's first, its config.json asset_id)")
      ->check(pi0::app::non_empty());
  cli->add_flag("--simulate-fp8", args.simulate_fp8,
                "simulate FP8 (E4M3, per-channel weight and per-token activation scales) in the prefix's Gemma GEMMs, "
                "in float32 on any device: compare the actions with a run without it to see what an FP8 path would "
                "cost your model (docs/serving.md, FP8)");
  pi0::app::add_rtc_options(*cli, args.rtc);
  cli->add_option("--prev-actions", args.prev_actions,
                  "real-time chunking: a previous pi0-infer --out; its actions_unnormalized rows from --prev-executed "
                  "on are this request's prev_action_chunk (instead of the observation file's keys)")
      ->check(pi0::app::non_empty());
  cli->add_option("--prev-executed", args.prev_executed,
                  "with --prev-actions: rows of that answer executed before this observation was taken (default 0)")
      ->check(pi0::app::int_in(0));
  cli->add_option("--inference-delay", args.inference_delay,
                  "with --prev-actions: rows that execute while this request runs, d (default 0)")
      ->check(pi0::app::int_in(0));
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  if (args.prev_actions.empty() && (args.prev_executed || args.inference_delay)) {
    throw pi0::UserError(std::string(args.prev_executed ? "--prev-executed" : "--inference-delay") +
                         ": needs --prev-actions FILE (the previous answer; or put prev_action_chunk and "
                         "inference_delay into the observation file)");
  }
  const std::optional<torch::ScalarType> dtype = pi0::io::parse_compute_dtype(args.dtype);
  spdlog::info("{}", pi0::set_num_threads(0).describe());  // every available CPU
  const torch::Device device = pi0::app::parse_device("--device", args.device);
  const auto obs_tensors = pi0::io::read_safetensors(args.obs);  // read first: input errors before the (slow) model load
  if (!args.prompt && !obs_tensors.count("tokenized_prompt")) {
    // The frame's own prompt, written by pi0-make-example-data --observation-out (docs/formats.md).
    const pi0::io::SafetensorsFile file(args.obs);
    const auto& md = file.metadata();
    if (auto it = md.find(pi0::data::kObservationPromptKey); it != md.end()) {
      args.prompt = it->second;
      spdlog::info("prompt from {}: '{}' (--prompt overrides)", args.obs, it->second);
    }
  }
  pi0::io::Bundle bundle = pi0::io::load_bundle(args.bundle, device, dtype, args.asset);
  if (bundle.assets.size() > 1) {
    std::string all;
    for (const auto& id : bundle.assets) all += (all.empty() ? "" : ", ") + id;
    spdlog::info("norm stats and robot settings of dataset '{}' (the bundle holds {}; --asset picks)",
                 bundle.config.checkpoint.asset_id, all);
  }
  spdlog::info("computing in {}{}", bundle.dtype == torch::kBFloat16 ? "bf16" : "float32",
               dtype ? " (--dtype)" : " (the bundle's precision; --dtype f32 to change)");
  std::unique_ptr<pi0::data::Tokenizer> tokenizer;
  if (args.prompt) tokenizer = std::make_unique<pi0::data::Tokenizer>(bundle.tokenizer_path);
  const auto inputs = pi0::infer::make_inputs(bundle, obs_tensors, args.obs, args.prompt, tokenizer.get());
  const auto& mo = bundle.model->options();
  const int64_t B = inputs.observation.batch_size();
  const std::vector<int64_t> bha = {B, mo.action_horizon, mo.action_dim};
  const std::string bha_legend = "[B,H,A]";

  const bool fast = bundle.fast_prompt != nullptr;
  if (fast) {
    // pi0-FAST decodes action tokens: no flow-matching loss, no noise, no Euler steps (docs/pi0_fast.md).
    if (args.loss)
      throw pi0::UserError("--loss: " + args.bundle + " is a pi0-FAST bundle, which has no flow-matching loss");
    if (!args.noise.empty())
      throw pi0::UserError("--noise: " + args.bundle + " is a pi0-FAST bundle; it decodes action tokens and draws no noise");
    if (args.simulate_fp8)
      throw pi0::UserError("--simulate-fp8: not available for a pi0-FAST bundle (" + args.bundle +
                           "); it simulates FP8 in pi0 / pi0.5's sampling path");
    if (obs_tensors.count("noise")) spdlog::warn("{}: 'noise' is not used by a pi0-FAST bundle (it decodes tokens)", args.obs);
  }
  if (args.loss) {
    if (!args.noise.empty()) throw pi0::UserError("--noise: not used with --loss (the obs file holds 'noise')");
    auto actions = float_of_shape(obs_tensors, "actions", args.obs, bha, bha_legend);
    auto noise = float_of_shape(obs_tensors, "noise", args.obs, bha, bha_legend);
    auto time = float_of_shape(obs_tensors, "time", args.obs, {B}, "[B]");
    torch::NoGradGuard no_grad;
    auto loss = bundle.model->compute_loss(inputs.observation.to(device), actions.to(device), noise.to(device),
                                           time.to(device));
    pi0::io::save_safetensors(args.out, {{"loss", loss.to(torch::kCPU, torch::kFloat32)}});
    std::cout << "loss (mean over " << loss.numel() << " elements): " << loss.mean().item<double>() << "\n"
              << "wrote " << args.out << "\n";
    return 0;
  }

  std::optional<torch::Tensor> noise;
  if (!args.noise.empty()) {
    const auto nt = pi0::io::read_safetensors(args.noise);
    if (nt.count("noise")) noise = float_of_shape(nt, "noise", args.noise, bha, bha_legend);
    else if (nt.size() == 1) noise = float_of_shape(nt, nt.begin()->first, args.noise, bha, bha_legend);
    else throw pi0::UserError(args.noise + ": no tensor 'noise', expected the initial noise " + bha_legend);
  } else if (obs_tensors.count("noise") && !fast) {
    noise = float_of_shape(obs_tensors, "noise", args.obs, bha, bha_legend);
  }
  auto file_tensor = [&](const std::string& key) {
    auto it = obs_tensors.find(key);
    return it == obs_tensors.end() ? torch::Tensor() : it->second;
  };
  pi0::model::RtcRequest rtc;
  if (args.rtc.mode != "off") {  // off: the keys are ignored, as pi0-serve ignores them
    auto prev = file_tensor("prev_action_chunk"), delay = file_tensor("inference_delay");
    std::string source = args.obs;
    if (!args.prev_actions.empty()) {
      if (prev.defined() || delay.defined()) {
        throw pi0::UserError("--prev-actions: " + args.obs + " already holds prev_action_chunk or inference_delay; "
                             "give the previous chunk one way, not both");
      }
      const auto answer = pi0::io::read_safetensors(args.prev_actions);
      auto it = answer.find("actions_unnormalized");
      if (it == answer.end() || it->second.dim() != 3) {
        throw pi0::UserError("--prev-actions: " + args.prev_actions + " has no actions_unnormalized [B,H,D]; expected "
                             "a pi0-infer --out file");
      }
      const int64_t rows = it->second.size(1), executed = args.prev_executed.value_or(0);
      if (executed >= rows) {
        throw pi0::UserError("--prev-executed: got " + std::to_string(executed) + ", but " + args.prev_actions +
                             " holds " + std::to_string(rows) + " rows; expected 0.." + std::to_string(rows - 1));
      }
      prev = it->second.narrow(1, executed, rows - executed);  // the rows not yet executed, row 0 next
      delay = torch::tensor(args.inference_delay.value_or(0), torch::kInt64);
      source = "--prev-actions " + args.prev_actions;
    }
    const auto chunk = pi0::infer::previous_chunk(prev, delay, file_tensor("execute_horizon"), B, source);
    rtc = pi0::infer::rtc_request(bundle, args.rtc, chunk, inputs.raw_state, source);
  }
  bundle.model->set_cuda_graph(args.cuda_graph == "on" && device.is_cuda());
  if (args.simulate_fp8) {
    bundle.model->set_fp8_simulation(true);
    spdlog::info("FP8 simulated in the prefix's Gemma GEMMs (E4M3 values in float32; not faster, a measure of its error)");
  }
  pi0::model::SampleTiming timing;
  const auto predicted = pi0::infer::predict(bundle, inputs, noise, args.num_steps, &timing, &rtc);
  const auto& actions = predicted.actions;
  const auto& robot = predicted.robot_actions;
  std::map<std::string, std::string> info = {{"num_steps", std::to_string(args.num_steps)}, {"bundle", args.bundle}};
  if (rtc.mode != pi0::model::RtcMode::kOff) {
    const std::string mode = pi0::model::to_string(rtc.mode);
    std::printf("real-time chunking: %s, inference_delay %lld\n", mode.c_str(), static_cast<long long>(rtc.delay));
    info["rtc"] = mode;
    info["inference_delay"] = std::to_string(rtc.delay);
  }
  std::vector<std::pair<std::string, torch::Tensor>> written = {{"actions", actions}, {"actions_unnormalized", robot}};
  if (fast) {
    // openpi's fallback for tokens that hold no actions is zeros (in model space): said, so a user can tell.
    std::vector<bool> decodable = predicted.fast_decodable;
    const auto tokens = predicted.fast_tokens.accessor<int64_t, 2>();
    for (size_t b = 0; b < decodable.size(); ++b) {
      int64_t before_eos = 0;
      while (before_eos < tokens.size(1) && tokens[b][before_eos] != pi0::model::kPaligemmaEos) ++before_eos;
      std::printf("fast[%zu]: %lld tokens before EOS, %s\n", b, static_cast<long long>(before_eos),
                  decodable[b] ? "actions decoded" : "NO actions decoded (zeros in model space, openpi's fallback)");
    }
    info["fast_decodable"] = nlohmann::json(decodable).dump();
    info["num_steps"] = "0";  // no Euler steps: the tokens were decoded
    written.emplace_back("fast_tokens", predicted.fast_tokens);
    std::printf("total: %.3f ms (batch %lld, %s; %lld decoding steps)\n", predicted.model_ms,
                static_cast<long long>(B), device.str().c_str(), static_cast<long long>(predicted.fast_tokens.size(1)));
  } else if (!predicted.subtasks.empty()) {
    // A model trained with train.subtask decoded its subtask before acting on it (docs/subtask.md).
    for (size_t b = 0; b < predicted.subtasks.size(); ++b)
      std::printf("subtask[%zu]: %s\n", b, predicted.subtasks[b].c_str());
    info["subtask"] = nlohmann::json(predicted.subtasks).dump();
    // Decoding and sampling are one model call there; its stages are not timed apart (SampleTiming stays empty).
    std::printf("total: %.3f ms (batch %lld, %s; subtask decoding and sampling)\n", predicted.model_ms,
                static_cast<long long>(B), device.str().c_str());
  } else {
    std::printf("prefix pass: %.3f ms\n", timing.prefix_ms);
    for (size_t i = 0; i < timing.step_ms.size(); ++i)
      std::printf("denoise step %zu/%zu: %.3f ms\n", i + 1, timing.step_ms.size(), timing.step_ms[i]);
    std::printf("total: %.3f ms (batch %lld, %s)\n", timing.total_ms(), static_cast<long long>(B),
                device.str().c_str());
  }
  pi0::io::save_safetensors(args.out, written, info);
  std::printf("wrote %s (actions %s, actions_unnormalized %s)\n", args.out.c_str(), shape_str(actions.sizes()).c_str(),
              shape_str(robot.sizes()).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("pi0-infer", [&] { return infer_main(argc, argv); });
}
