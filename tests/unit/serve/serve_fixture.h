// Shared by the serve tests: a tiny exported bundle (LIBERO: 8 state dims; ALOHA: 14 dims, trained with
// adapt_to_pi), fixed noise, observation frames, an in-process server, an app runner, and a small Beast websocket
// client.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <catch2/catch.hpp>

#include "pi0/config/config.h"
#include "pi0/data/norm_stats.h"
#include "pi0/io/bundle.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/model_config.h"
#include "pi0/serve/msgpack_numpy.h"
#include "pi0/serve/policy.h"
#include "pi0/serve/server.h"
#include "support/app_process.h"
#include "support/test_support.h"

namespace pi0::serve_test {

using testing::TempDir;

constexpr int64_t kHorizon = 4;
constexpr int64_t kModelDim = 16;  // action_dim: > 14 so ALOHA fits and padding is exercised

struct TinyBundle {
  std::string bundle, noise;
  int64_t state_dim = 0;
};

/// Exports a tiny pi0.5 bundle under `dir` for dataset `format` ("libero": 8 dims, "aloha": 14 dims), in `dtype`
/// (float32 or bfloat16, pi0-export's default); `extra_yaml` is appended to the training config (e.g. a serve section);
/// `rtc_max_delay`: the config's train.rtc_max_delay (what a bundle trained for real-time chunking announces);
/// `train_extra`: more train keys in flow style (", subtask: {enabled: true, key: s}").
inline TinyBundle make_tiny_bundle(const TempDir& dir, const std::string& format,
                                   torch::ScalarType dtype = torch::kFloat32, const std::string& extra_yaml = "",
                                   int64_t rtc_max_delay = 0, const std::string& train_extra = "") {
  TinyBundle b;
  b.state_dim = format == "aloha" ? 14 : 8;
  const std::string tok = std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
  const std::string yaml =
      "model: {type: pi05, paligemma_variant: dummy, action_expert_variant: dummy, siglip_variant: tiny/14,"
      " vocab_size: 1024, image_size: 28, action_dim: " + std::to_string(kModelDim) +
      ", action_horizon: " + std::to_string(kHorizon) + ", max_token_len: 48}\n"
      "data: {dataset: {format: " + format + ", paths: [unused.hdf5]}, norm_stats: " + dir.str("stats.json") +
      ", tokenizer: " + tok + "}\n"
      "train: {precision: float32, rtc_max_delay: " + std::to_string(rtc_max_delay) + train_extra + "}\n"
      "checkpoint: {run_dir: " + dir.str("run") + ", asset_id: tiny_" + format + "}\n" + extra_yaml;
  const auto cfg = config::parse_config(YAML::Load(yaml), "test config");
  data::NormStats stats;
  for (const char* key : {"state", "actions"}) {
    data::KeyStats k;
    for (int64_t d = 0; d < b.state_dim; ++d) {
      k.mean.push_back(0.05 * d);
      k.std.push_back(0.6 + 0.05 * d);
      k.q01.push_back(-1.0 - 0.1 * d);
      k.q99.push_back(1.0 + 0.2 * d);
    }
    stats.keys[key] = k;
  }
  data::save_norm_stats(stats, cfg.data.norm_stats);
  torch::manual_seed(5);
  model::Pi0 m(model::options_from_config(cfg.model));
  {
    torch::NoGradGuard no_grad;  // at init the zero gates cut most of the model out: perturb every parameter
    for (auto& p : m->named_parameters()) p.value().add_(torch::randn_like(p.value()) * 0.05);
  }
  const std::string ckpt = dir.str("run/checkpoints/1");
  std::filesystem::create_directories(ckpt + "/assets/tiny_" + format);
  io::SaveOptions so;
  so.openpi_layout = false;
  io::save_model_weights(*m, ckpt + "/model.safetensors", so);
  std::ofstream(ckpt + "/config.yaml") << YAML::Dump(config::to_yaml(cfg)) << "\n";
  std::filesystem::copy_file(cfg.data.norm_stats, ckpt + "/assets/tiny_" + format + "/norm_stats.json");
  std::filesystem::copy_file(tok, ckpt + "/tokenizer.model");
  std::ofstream(ckpt + "/COMPLETE") << "1\n";
  io::ExportOptions eo;
  eo.weights = "model";
  eo.dtype = dtype;
  b.bundle = dir.str("bundle_" + format + (dtype == torch::kBFloat16 ? "_bf16" : ""));
  io::export_bundle(ckpt, b.bundle, eo);
  b.noise = dir.str("noise_" + format + ".safetensors");
  io::save_safetensors(b.noise, {{"noise", torch::randn({1, kHorizon, kModelDim})}});
  return b;
}

/// A LIBERO observation (HWC uint8 images of two sizes, float64 state [8]) varied by `seed`.
inline serve::Fields libero_fields(int64_t seed) {
  torch::manual_seed(seed);
  pi0::serve::Fields f;
  f["observation/image"].tensor = torch::randint(0, 256, {32, 32, 3}).to(torch::kUInt8);
  f["observation/wrist_image"].tensor = torch::randint(0, 256, {24, 40, 3}).to(torch::kUInt8);
  f["observation/state"].tensor = torch::randn({8}, torch::kFloat64);
  f["prompt"].text = "pick up the red block " + std::to_string(seed % 3);
  return f;
}

/// What the in-process servers run: 2 steps from the bundle's fixed noise (deterministic answers).
inline serve::PolicyOptions policy_options(const TinyBundle& b, serve::Robot robot, int64_t max_batch = 0) {
  serve::PolicyOptions o;
  o.robot = robot;
  o.max_batch = max_batch;
  o.num_steps = 2;
  o.noise = io::read_safetensors(b.noise).at("noise");
  return o;
}

/// Policy + Server on 127.0.0.1, any free port, serving on a background thread.
struct LiveServer {
  serve::Policy policy;
  serve::Server server;
  std::thread thread;

  LiveServer(const TinyBundle& b, serve::Robot robot, serve::ServerOptions so = {}, int64_t max_batch = 0,
             nlohmann::json metadata = nlohmann::json::object())
      : LiveServer(b, with_metadata(policy_options(b, robot, max_batch), std::move(metadata)), std::move(so)) {}
  LiveServer(const TinyBundle& b, serve::PolicyOptions po, serve::ServerOptions so = {})
      : policy(io::load_bundle(b.bundle), std::move(po)), server(policy, local(std::move(so))),
        thread([this] { server.run(/*handle_signals=*/false); }) {}
  ~LiveServer() {
    server.stop();
    thread.join();
  }
  int port() const { return server.port(); }

  static serve::PolicyOptions with_metadata(serve::PolicyOptions o, nlohmann::json metadata) {
    o.metadata = std::move(metadata);
    return o;
  }
  static serve::ServerOptions local(serve::ServerOptions so) {
    so.host = "127.0.0.1";
    so.port = 0;
    return so;
  }
};

inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

/// Runs `app args` in the background with stdout/stderr to files; stop() signals it and returns the exit code.
class AppProcess {
 public:
  /// `ignore_sigint`: the app inherits SIGINT ignored (as a background job of a non-interactive shell does).
  AppProcess(const std::string& app, const std::string& args, const TempDir& dir, const std::string& tag,
             bool ignore_sigint = false)
      : out_(dir.str(tag + "_stdout.txt")), err_(dir.str(tag + "_stderr.txt")) {
    const std::string cmd = "exec " + testing::app_dir() + "/" + app + " " + args + " > " + out_ + " 2> " + err_;
    pid_ = ::fork();
    if (pid_ == 0) {
      if (ignore_sigint) ::signal(SIGINT, SIG_IGN);  // kept by sh and by exec
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~AppProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  /// The port from the "listening on ws://host:PORT" line (waits up to 120 s); 0 if the app exited first.
  int port() {
    for (int i = 0; i < 1200; ++i) {
      const std::string s = stdout_text();
      const auto pos = s.find("listening on ws://");
      if (pos != std::string::npos) {
        const auto colon = s.find(':', pos + 18);
        const auto eol = s.find('\n', pos);
        if (colon != std::string::npos && eol != std::string::npos) return std::stoi(s.substr(colon + 1, eol - colon - 1));
      }
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }
  /// Waits (up to 120 s) until stdout or stderr holds one of `texts`; false if the app exited first or never wrote
  /// any of them.
  bool wait_for(const std::vector<std::string>& texts) {
    for (int i = 0; i < 12000; ++i) {
      const std::string all = stdout_text() + stderr_text();
      for (const auto& t : texts)
        if (all.find(t) != std::string::npos) return true;
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  /// Sends `sig` and waits (up to 30 s): the exit code, or -1 when killed or still running.
  int stop(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    for (int i = 0; i < 300; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return -1;
  }
  std::string stdout_text() const { return slurp(out_); }
  std::string stderr_text() const { return slurp(err_); }

 private:
  static std::string slurp(const std::string& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }
  std::string out_, err_;
  pid_t pid_ = -1;
};

/// A blocking websocket client on 127.0.0.1 (what a robot runtime does, in C++).
class WsClient {
 public:
  explicit WsClient(int port, const std::string& authorization = "") {
    namespace net = boost::asio;
    namespace ws = boost::beast::websocket;
    net::ip::tcp::endpoint ep(net::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port));
    ws_.next_layer().connect(ep);
    ws_.next_layer().set_option(net::ip::tcp::no_delay(true));
    if (!authorization.empty())
      ws_.set_option(ws::stream_base::decorator(
          [authorization](ws::request_type& req) { req.set(boost::beast::http::field::authorization, authorization); }));
    ws_.handshake("127.0.0.1", "/");
    // As JSON, not as decode_frame's Fields: the metadata holds lists of strings (rtc's modes and keys), which an
    // observation may not.
    boost::beast::flat_buffer b;
    ws_.read(b);
    const auto* bytes = static_cast<const uint8_t*>(b.data().data());
    metadata = nlohmann::json::from_msgpack(bytes, bytes + b.data().size());
  }
  /// Sends one frame; returns the decoded answer, or throws std::runtime_error(text) for a text frame.
  pi0::serve::Fields infer(const std::string& frame, bool text = false) {
    ws_.text(text);
    ws_.write(boost::asio::buffer(frame));
    return read_binary();
  }
  void send(const std::string& frame, bool text = false) {
    ws_.text(text);
    ws_.write(boost::asio::buffer(frame));
  }
  /// After an error: the close code the server sent (reads until the close arrives).
  int close_code() {
    boost::beast::flat_buffer b;
    boost::beast::error_code ec;
    for (int i = 0; i < 4 && !ec; ++i) ws_.read(b, ec);
    return ec == boost::beast::websocket::error::closed ? static_cast<int>(ws_.reason().code) : -1;
  }
  void close_now() { ws_.next_layer().close(); }

  nlohmann::json metadata;

 private:
  pi0::serve::Fields read_binary() {
    boost::beast::flat_buffer b;
    ws_.read(b);
    const auto d = b.data();
    if (ws_.got_text()) throw std::runtime_error(std::string(static_cast<const char*>(d.data()), d.size()));
    return pi0::serve::decode_frame(d.data(), d.size());
  }
  boost::asio::io_context ioc_;
  boost::beast::websocket::stream<boost::asio::ip::tcp::socket> ws_{ioc_};
};

/// A bad request on a fresh connection: the answer is one text line containing `expected`, then close 1011.
inline void check_refused(int port, const std::string& frame, bool text, const std::string& expected) {
  WsClient c(port);
  try {
    c.infer(frame, text);
    FAIL("no error frame");
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains(expected));
    CHECK(msg.find('\n') == std::string::npos);
  }
  CHECK(c.close_code() == 1011);
}

}  // namespace pi0::serve_test
