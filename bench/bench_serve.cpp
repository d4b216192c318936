// bench_serve: what pi0-serve adds to a model call. One websocket client on 127.0.0.1 at batch 1 sends raw-profile
// observations (224x224 uint8 cameras, state, prompt) and times each round trip; the server reports the
// in-process sample_actions time of that request (policy_timing.infer_ms), so
//   overhead = round trip − sample_actions = msgpack + websocket + robot profile + resize/normalize/tokenize +
//              unnormalize, per request (target: <= 2 ms at the median).
// Then throughput with 1, 4 and 8 clients (requests/s over all clients). Random weights, fixed noise.
//   bench_serve [--config configs/bench_cpu.yaml] [--device cpu|cuda] [--dtype f32|bf16] [--cameras 1,3]
//               [--iters 30] [--warmup 3] [--clients 1,4,8] [--requests 6] [--num-steps 10] [--json out.json]
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/io/bundle.h"
#include "pi0/model/model_config.h"
#include "pi0/nn/param_device.h"
#include "pi0/serve/msgpack_numpy.h"
#include "pi0/serve/policy.h"
#include "pi0/serve/server.h"
#include "pi0/data/config_options.h"

using namespace pi0;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string config = "configs/bench_cpu.yaml", device = "cpu", dtype = "f32", json;
  std::vector<int64_t> cameras = {1, 3}, clients = {1, 4, 8};
  int iters = 30, warmup = 3, requests = 6, num_steps = 10;
};

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  auto cli = app::make_parser("bench_serve", "What pi0-serve adds to a model call, and its throughput.");
  cli->add_option("--config", a.config, "model config (random weights)")->check(app::non_empty());
  cli->add_option("--device", a.device, "cpu, cuda or cuda:N");
  cli->add_option("--dtype", a.dtype, "activations")->check(app::one_of({"f32", "bf16"}));
  cli->add_option("--cameras", a.cameras, "camera counts, comma-separated")->delimiter(',')->check(app::int_in(1, 3));
  cli->add_option("--clients", a.clients, "concurrent client counts, comma-separated")
      ->delimiter(',')
      ->check(app::int_in(1, 1024));
  cli->add_option("--iters", a.iters, "timed requests for the overhead table")->check(app::int_in(1));
  cli->add_option("--warmup", a.warmup, "untimed requests first")->check(app::int_in(0));
  cli->add_option("--requests", a.requests, "requests per client for the throughput table")->check(app::int_in(1));
  cli->add_option("--num-steps", a.num_steps, "denoising steps")->check(app::int_in(1, 1000));
  cli->add_option("--json", a.json, "also write the rows as JSON here")->check(app::non_empty());
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  return a;
}

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

// A bundle in memory: the config's model with random weights, 8-dim norm stats, the tiny tokenizer.
io::Bundle bench_bundle(const std::string& config_path, const torch::Device& device) {
  io::Bundle b;
  b.dir = config_path;
  b.config = config::load_config(config_path);
  b.transform = data::transform_options(b.config).resolved();
  data::KeyStats k;
  for (int d = 0; d < 8; ++d) {
    k.mean.push_back(0.0);
    k.std.push_back(1.0);
    k.q01.push_back(-1.0);
    k.q99.push_back(1.0);
  }
  b.norm_stats.keys = {{"state", k}, {"actions", k}};
  b.tokenizer_path = std::string(PI0_BENCH_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model";
  {
    nn::ParamDeviceScope on_device(device);  // random weights made on the GPU, not on the host
    b.model = model::Pi0(model::options_from_config(b.config.model));
  }
  b.model->to(device);
  b.model->eval();
  return b;
}

std::string observation_frame(int64_t cameras, int64_t size) {
  serve::Fields f;
  const char* names[] = {"image/base_0_rgb", "image/left_wrist_0_rgb", "image/right_wrist_0_rgb"};
  for (int64_t c = 0; c < cameras; ++c) f[names[c]].tensor = torch::randint(0, 256, {size, size, 3}).to(torch::kUInt8);
  f["state"].tensor = torch::randn({8});
  f["prompt"].text = "pick up the red block and put it in the bowl";
  return serve::encode_fields(f);
}

class Client {
 public:
  explicit Client(int port) {
    ws_.next_layer().connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(port)});
    ws_.next_layer().set_option(boost::asio::ip::tcp::no_delay(true));
    ws_.handshake("127.0.0.1", "/");
    ws_.write_buffer_bytes(1 << 20);  // mask a whole observation at once, not 4 KiB at a time
    boost::beast::flat_buffer b;
    ws_.read(b);  // metadata
  }
  /// Round trip in ms; `model_ms` and `server_ms` from the answer.
  double request(const std::string& frame, double* model_ms, double* server_ms) {
    const auto t0 = Clock::now();
    ws_.binary(true);
    ws_.write(boost::asio::buffer(frame));
    boost::beast::flat_buffer b;
    ws_.read(b);
    const double rtt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (ws_.got_text()) throw std::runtime_error(boost::beast::buffers_to_string(b.data()));
    const auto r = serve::decode_frame(b.data().data(), b.data().size());
    *model_ms = r.at("policy_timing/infer_ms").tensor.item<double>();
    *server_ms = r.at("server_timing/infer_ms").tensor.item<double>();
    return rtt;
  }

 private:
  boost::asio::io_context ioc_;
  boost::beast::websocket::stream<boost::asio::ip::tcp::socket> ws_{ioc_};
};

}  // namespace

int bench_main(int argc, char** argv) {
  const auto parsed = parse_args(argc, argv);
  if (!parsed) return 0;
  const Args& a = *parsed;
  spdlog::set_level(spdlog::level::warn);  // no per-connection lines in the tables
  const torch::Device device = app::parse_device("--device", a.device);
  io::Bundle bundle = bench_bundle(a.config, device);
  bundle.dtype = a.dtype == "bf16" ? torch::kBFloat16 : torch::kFloat32;  // activations; random weights stay float32
  bundle.model->set_compute_dtype(bundle.dtype);
  const auto mo = bundle.model->options();
  const int64_t size = bundle.transform.image_size;
  serve::PolicyOptions po;
  po.robot = serve::Robot::kRaw;
  po.num_steps = a.num_steps;
  po.noise = torch::randn({1, mo.action_horizon, mo.action_dim});
  serve::Policy policy(std::move(bundle), po);
  serve::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  serve::Server server(policy, so);
  std::thread serving([&] { server.run(false); });
  const int port = server.port();

  std::cout << "# bench_serve\n\nconfig " << a.config << " (" << (mo.pi05 ? "pi05" : "pi0") << "), device " << a.device
            << ", " << a.dtype << ", " << a.num_steps << " steps, raw profile, " << size << "x" << size
            << " uint8 cameras, one client on 127.0.0.1, " << a.iters << " requests after " << a.warmup
            << " warm-up\noverhead = round trip - sample_actions (policy_timing.infer_ms); transport = round trip - "
               "server_timing.infer_ms (msgpack + websocket only)\n\n"
            << "| cameras | frame KiB | round trip ms (median / p99) | sample_actions ms (median) | overhead ms (median / p99) "
               "| transport ms (median / p99) |\n|---|---|---|---|---|---|\n";
  nlohmann::json rows = nlohmann::json::array();
  for (const int64_t cams : a.cameras) {
    const std::string frame = observation_frame(cams, size);
    Client c(port);
    std::vector<double> rtt, model, overhead, transport;
    for (int i = 0; i < a.warmup + a.iters; ++i) {
      double m = 0, s = 0;
      const double r = c.request(frame, &m, &s);
      if (i < a.warmup) continue;
      rtt.push_back(r);
      model.push_back(m);
      overhead.push_back(r - m);
      transport.push_back(r - s);
    }
    std::printf("| %lld | %.0f | %.2f / %.2f | %.2f | %.2f / %.2f | %.2f / %.2f |\n", static_cast<long long>(cams),
                frame.size() / 1024.0, percentile(rtt, 0.5), percentile(rtt, 0.99), percentile(model, 0.5),
                percentile(overhead, 0.5), percentile(overhead, 0.99), percentile(transport, 0.5),
                percentile(transport, 0.99));
    rows.push_back({{"cameras", cams}, {"rtt_ms_median", percentile(rtt, 0.5)}, {"rtt_ms_p99", percentile(rtt, 0.99)},
                    {"sample_actions_ms_median", percentile(model, 0.5)},
                    {"overhead_ms_median", percentile(overhead, 0.5)}, {"overhead_ms_p99", percentile(overhead, 0.99)},
                    {"transport_ms_median", percentile(transport, 0.5)}, {"transport_ms_p99", percentile(transport, 0.99)}});
  }

  std::cout << "\n| clients | requests | wall s | requests/s | round trip ms (median / p99) |\n|---|---|---|---|---|\n";
  nlohmann::json tput = nlohmann::json::array();
  const std::string frame = observation_frame(a.cameras.front(), size);
  for (const int64_t n : a.clients) {
    std::vector<std::vector<double>> per(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    const auto t0 = Clock::now();
    for (int64_t k = 0; k < n; ++k) {
      threads.emplace_back([&, k] {
        Client c(port);
        for (int i = 0; i < a.requests; ++i) {
          double m = 0, s = 0;
          per[static_cast<size_t>(k)].push_back(c.request(frame, &m, &s));
        }
      });
    }
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    std::vector<double> all;
    for (auto& v : per) all.insert(all.end(), v.begin(), v.end());
    const double rps = static_cast<double>(all.size()) / wall;
    std::printf("| %lld | %zu | %.2f | %.2f | %.1f / %.1f |\n", static_cast<long long>(n), all.size(), wall, rps,
                percentile(all, 0.5), percentile(all, 0.99));
    tput.push_back({{"clients", n}, {"requests", all.size()}, {"wall_s", wall}, {"requests_per_s", rps},
                    {"rtt_ms_median", percentile(all, 0.5)}, {"rtt_ms_p99", percentile(all, 0.99)}});
  }
  server.stop();
  serving.join();
  policy.stop();
  if (!a.json.empty())
    std::ofstream(a.json) << nlohmann::json{{"config", a.config}, {"device", a.device}, {"dtype", a.dtype},
                                            {"latency", rows}, {"throughput", tput}}.dump(2) << "\n";
  return 0;
}

int main(int argc, char** argv) {
  return app::run_app("bench_serve", [&] { return bench_main(argc, argv); });
}
