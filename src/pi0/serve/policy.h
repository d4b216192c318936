// The served policy: a loaded bundle behind a robot profile, with one model thread that runs sample_actions.
// A request goes: frame fields → robot profile (robot_profile.h) → infer::make_inputs (pi0-infer's input path:
// resize-with-pad, state normalization, prompt tokenization) and infer::rtc_request (a previous chunk, when the
// frame carries one) on the caller's thread → queue → model thread:
// infer::predict (sample_actions, then unnormalize, absolute actions, ALOHA's convention: pi0-infer's sequence,
// infer/inference.h) on the batch → sliced to the robot's dims.
//
// Batching: the model thread takes up to `max_batch` queued requests (rows) and runs them as one sample_actions
// call. Default 1 on the CPU (a batch of B costs B times one request there, and one answer would wait for all)
// and 8 on CUDA, where a batch of 8 costs about as much as one. Requests never wait for a batch to fill: the
// thread takes what is queued when it is free. A request that continues a previous chunk (real-time chunking,
// infer::rtc_request) runs as its own call.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pi0/data/tokenizer.h"
#include "pi0/infer/inference.h"
#include "pi0/io/bundle.h"
#include "pi0/serve/msgpack_numpy.h"
#include "pi0/serve/robot_profile.h"

namespace pi0::serve {

struct PolicyOptions {
  Robot robot = Robot::kRaw;
  int64_t num_steps = 10;                   ///< Euler steps of sample_actions
  int64_t max_batch = 0;                    ///< rows per sample_actions call; 0 = 1 on CPU, 8 on CUDA
  std::optional<std::string> default_prompt;///< used when a frame has no 'prompt'
  torch::Tensor noise;                      ///< fixed initial noise [H,A] or [1,H,A] for every request (tests); undefined = random
  /// --metadata: keys added to (or, null, removed from) the bundle's policy metadata (config/policy_metadata.h).
  nlohmann::json metadata = nlohmann::json::object();
  /// --rtc*: how requests that carry prev_action_chunk are answered (real-time chunking; announced as "rtc").
  infer::RtcSettings rtc;
};

/// One `--metadata key=json` flag: the key and its JSON value. UserError naming the flag otherwise.
std::pair<std::string, nlohmann::json> parse_metadata_flag(const std::string& assignment);

/// One answer: the robot's actions and the times openpi reports.
struct PolicyResult {
  torch::Tensor actions;   ///< [H,D] float32 ([B,H,D] for batched raw requests)
  double model_ms = 0;     ///< sample_actions (this request's batch)
  double total_ms = 0;     ///< profile + inputs + model + outputs
  nlohmann::json rtc;      ///< {"mode": "trained"|"guided", "delay": d} when the answer continues a previous chunk
  /// A model trained with train.subtask: the subtask it decoded (a string; a list of them for batched requests);
  /// null otherwise.
  nlohmann::json subtask;
  /// A pi0-FAST model: whether its tokens held actions (infer::Prediction::fast_decodable; a list for batched
  /// requests); null otherwise.
  nlohmann::json fast_decodable;
};

class Policy {
 public:
  Policy(io::Bundle bundle, PolicyOptions options);
  ~Policy();
  Policy(const Policy&) = delete;
  Policy& operator=(const Policy&) = delete;

  /// Sent to every client on connect: model type, action horizon and dims, robot profile, config id, ..., and the
  /// policy metadata: the bundle's (its training config's serve.policy_metadata over the robot's defaults, e.g.
  /// ALOHA's reset_pose) with options.metadata applied. The model computes in the bundle's dtype (io::load_bundle:
  /// pi0-infer's rule), reported as "dtype".
  const nlohmann::json& metadata() const { return metadata_; }
  const PolicyOptions& options() const { return options_; }
  const io::Bundle& bundle() const { return bundle_; }

  using Callback = std::function<void(PolicyResult result, std::exception_ptr error)>;
  /// Thread-safe. Prepares the inputs on the calling thread (UserError for a bad observation, thrown here), then
  /// queues them; `done` runs on the model thread with the result or the model's exception.
  void submit(const Fields& fields, Callback done);
  /// submit() and wait.
  PolicyResult infer(const Fields& fields);
  /// Stops the model thread after the queued requests (called by the destructor).
  void stop();
  /// Most rows one sample_actions call has taken so far (batching at work when > 1).
  int64_t largest_batch() const { return largest_batch_; }

 private:
  struct Pending;
  void model_loop();
  void run_batch(std::vector<std::unique_ptr<Pending>>& batch);

  io::Bundle bundle_;
  PolicyOptions options_;
  torch::Device device_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
  int64_t action_dims_ = 0;  // D sent to the robot
  nlohmann::json metadata_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Pending>> queue_;
  bool stopping_ = false;
  std::atomic<int64_t> largest_batch_{0};
  std::thread thread_;
};

}  // namespace pi0::serve
