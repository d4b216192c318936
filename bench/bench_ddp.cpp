// Data-parallel step time on CPU: pi0-train on configs/debug.yaml with 1 rank and with N ranks (Gloo, processes
// on 127.0.0.1, launched like torchrun), same global batch. Reports the median step time after warm-up and, for
// N ranks, the gradient all-reduce span per step and how much of it backward hid (1 − time in wait() / span).
// --shard runs the N ranks once per dist.shard mode (comma-separated, or "all") and adds what a rank holds of
// AdamW state, EMA and gradients after its first step (rank 0 logs "rank R of W holds ..." for every rank; the
// largest is reported) next to the plan of `pi0-train --print-params --world-size N` (train::plan_rank_memory: the
// rank with the largest share). --json also prints the figures as one JSON object.
// Usage (from the build dir): ./bench_ddp [--ranks 2] [--steps 12] [--warmup 3] [--batch-size 16] [--threads 1]
//                             [--bucket-mb 25] [--freeze full] [--shard none|optimizer|gradients|all] [--json]
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/config/config.h"
#include "pi0/train/metrics.h"
#include "pi0/train/memory_plan.h"

extern char** environ;
namespace fs = pi0::posix_fs;

namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

int shell(const std::string& cmd) { return std::system(cmd.c_str()); }

struct Result {
  double step_s = 0, comm_s = 0, exposed_s = 0;
  bool held_logged = false;  ///< the "holds ... bytes" line was found
  int64_t optimizer_bytes = 0, ema_bytes = 0, grad_bytes = 0;  ///< the rank holding the most
};

// "rank R of W holds X bytes of AdamW state, Y of EMA and Z of gradients (dist.shard=...)" lines of a rank's log.
void read_held_bytes(const fs::path& log, Result& r) {
  static const std::regex line(R"(rank \d+ of \d+ holds (\d+) bytes of AdamW state, (\d+) of EMA and (\d+) of gradients)");
  std::ifstream in(log);
  std::string text;
  while (std::getline(in, text)) {
    std::smatch m;
    if (!std::regex_search(text, m, line)) continue;
    const int64_t opt = std::stoll(m[1]), ema = std::stoll(m[2]), grads = std::stoll(m[3]);
    if (!r.held_logged || opt + ema + grads > r.optimizer_bytes + r.ema_bytes + r.grad_bytes)
      r.optimizer_bytes = opt, r.ema_bytes = ema, r.grad_bytes = grads;
    r.held_logged = true;
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result train(const std::string& bin, const std::string& src, const fs::path& work, int world, int steps, int warmup,
             int batch, int threads, int bucket_mb, const std::string& freeze, const std::string& shard) {
  const std::string tag = "w" + std::to_string(world) + "_" + shard;
  const auto run_dir = work / ("run_" + tag);
  fs::remove_all(run_dir);
  std::vector<std::string> args = {
      bin + "/pi0-train", "--config", src + "/configs/debug.yaml",
      "--set", "data.dataset.paths=[" + (work / "data").string() + "/*.hdf5]",
      "--set", "data.norm_stats=" + (work / "data" / "norm_stats.json").string(),
      "--set", "data.tokenizer=" + src + "/data/tokenizer/tiny_spm.model",
      "--set", "checkpoint.run_dir=" + run_dir.string(),
      "--set", "checkpoint.save_interval=100000",
      "--set", "train.num_steps=" + std::to_string(steps + warmup),
      "--set", "train.batch_size=" + std::to_string(batch),
      "--set", "train.freeze=" + freeze,
      "--set", "train.log_interval=1",
      "--set", "dist.bucket_size_mb=" + std::to_string(bucket_mb),
      "--set", "dist.shard=" + shard};
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      if (world > 1) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      }
      setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
      const auto log = (work / (tag + "_rank" + std::to_string(r) + ".log")).string();
      if (FILE* f = std::fopen(log.c_str(), "w")) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execve(argv[0], argv.data(), environ);
      _exit(127);
    }
    pids.push_back(pid);
  }
  for (pid_t p : pids) {
    int status = 0;
    waitpid(p, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "bench_ddp: a rank of the %d-rank run failed; see %s/%s_rank*.log\n", world,
                   work.c_str(), tag.c_str());
      std::exit(1);
    }
  }
  std::vector<double> step, comm, exposed;
  for (const auto& m : pi0::train::read_metrics((run_dir / "metrics.jsonl").string())) {
    if (m.at("step").get<int>() <= warmup) continue;
    step.push_back(m.at("step_time_s").get<double>());
    if (m.contains("comm_s")) {
      comm.push_back(m.at("comm_s").get<double>());
      exposed.push_back(m.at("comm_exposed_s").get<double>());
    }
  }
  Result r;
  r.step_s = median(step);
  for (double c : comm) r.comm_s += c / static_cast<double>(comm.size());
  for (double e : exposed) r.exposed_s += e / static_cast<double>(exposed.size());
  read_held_bytes(work / (tag + "_rank0.log"), r);
  return r;
}

std::vector<std::string> split_modes(const std::string& value) {
  if (value == "all") return {"none", "optimizer", "gradients"};
  std::vector<std::string> modes;
  std::stringstream in(value);
  for (std::string m; std::getline(in, m, ',');) {
    if (m != "none" && m != "optimizer" && m != "gradients")
      throw pi0::UserError("--shard: got '" + m + "', expected none, optimizer, gradients (comma-separated) or all");
    modes.push_back(m);
  }
  return modes;
}

double mb(int64_t bytes) { return static_cast<double>(bytes) / 1e6; }

struct Args {
  int ranks = 2, steps = 12, warmup = 3, batch_size = 16, threads = 1, bucket_mb = 25;
  std::string freeze = "full", shard = "none";
  bool json = false;
};

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  namespace app = pi0::app;
  auto cli = app::make_parser("bench_ddp", "Data-parallel step time on CPU: pi0-train on configs/debug.yaml with 1 "
                                           "rank and with N ranks (Gloo), same global batch.");
  cli->add_option("--ranks", a.ranks, "processes of the data-parallel runs")->check(app::int_in(1));
  cli->add_option("--steps", a.steps, "measured steps per run")->check(app::int_in(1));
  cli->add_option("--warmup", a.warmup, "steps before them, not measured")->check(app::int_in(0));
  cli->add_option("--batch-size", a.batch_size, "global batch (train.batch_size)")->check(app::int_in(1));
  cli->add_option("--threads", a.threads, "OMP_NUM_THREADS of each rank")->check(app::int_in(1));
  cli->add_option("--bucket-mb", a.bucket_mb, "dist.bucket_size_mb")->check(app::int_in(1));
  cli->add_option("--freeze", a.freeze, "train.freeze preset")->check(app::non_empty());
  cli->add_option("--shard", a.shard, "dist.shard modes of the N-rank runs: none, optimizer, gradients "
                                      "(comma-separated) or all");
  cli->add_flag("--json", a.json, "also print the figures as one JSON object");
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  return a;
}

int run(const Args& args) {
  const auto modes = split_modes(args.shard);
  const std::string bin = fs::canonical("/proc/self/exe").parent_path().string();
  std::string src = PI0_BENCH_SOURCE_DIR;
  const auto work = fs::temp_directory_path() / ("pi0_bench_ddp_" + std::to_string(getpid()));
  fs::create_directories(work / "data");
  if (shell(bin + "/pi0-make-example-data --out " + (work / "data").string() + " --episodes 8 --steps 40 > /dev/null") ||
      shell(bin + "/pi0-norm-stats --config " + src + "/configs/debug.yaml --set 'data.dataset.paths=[" +
          (work / "data").string() + "/*.hdf5]' --out " + (work / "data" / "norm_stats.json").string() +
          " > /dev/null 2>&1")) {
    std::fprintf(stderr, "bench_ddp: making the example data failed\n");
    return 1;
  }
  std::printf("bench_ddp: configs/debug.yaml (float32, freeze %s), global batch %d, %d threads per rank, %d "
              "measured steps after %d warm-up, bucket %d MB\n",
              args.freeze.c_str(), args.batch_size, args.threads, args.steps, args.warmup, args.bucket_mb);
  const auto one = train(bin, src, work, 1, args.steps, args.warmup, args.batch_size, args.threads, args.bucket_mb,
                         args.freeze, "none");
  std::printf("| ranks | dist.shard | step time (median) | speed-up | reduction span / step | exposed in wait() / step "
              "| hidden | AdamW / rank | EMA / rank | grads / rank | plan: AdamW + EMA + grads / rank |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  {
    const auto cfg = pi0::config::load_config(
        src + "/configs/debug.yaml", {"train.batch_size=" + std::to_string(args.batch_size), "train.freeze=" + args.freeze});
    const auto plan = pi0::train::plan_rank_memory(cfg, 1);
    auto logged = [&](int64_t bytes) { return one.held_logged ? mb(bytes) : -1.0; };
    std::printf("| 1 | - | %.1f ms | 1.00x | - | - | - | %.2f MB | %.2f MB | %.2f MB | %.2f + %.2f + %.2f MB |\n",
                one.step_s * 1e3, logged(one.optimizer_bytes), logged(one.ema_bytes), logged(one.grad_bytes),
                mb(plan.optimizer_bytes), mb(plan.ema_bytes), mb(plan.grad_bytes));
  }
  nlohmann::json out = {{"config", "configs/debug.yaml"}, {"freeze", args.freeze},
                        {"global_batch", args.batch_size}, {"threads_per_rank", args.threads},
                        {"bucket_mb", args.bucket_mb}, {"ranks", args.ranks},
                        {"one_rank_step_s", one.step_s}, {"one_rank_optimizer_bytes", one.optimizer_bytes},
                        {"one_rank_ema_bytes", one.ema_bytes}, {"one_rank_grad_bytes", one.grad_bytes},
                        {"modes", nlohmann::json::object()}};
  for (const auto& mode : modes) {
    const auto many = train(bin, src, work, args.ranks, args.steps, args.warmup, args.batch_size, args.threads,
                            args.bucket_mb, args.freeze, mode);
    const auto cfg = pi0::config::load_config(src + "/configs/debug.yaml",
                                              {"train.batch_size=" + std::to_string(args.batch_size),
                                               "train.freeze=" + args.freeze,
                                               "dist.bucket_size_mb=" + std::to_string(args.bucket_mb),
                                               "dist.shard=" + mode});
    const auto plan = pi0::train::plan_rank_memory(cfg, args.ranks);
    const double hidden = many.comm_s > 0 ? 100.0 * std::max(0.0, 1.0 - many.exposed_s / many.comm_s) : 0.0;
    auto logged = [&](int64_t bytes) { return many.held_logged ? mb(bytes) : -1.0; };
    std::printf("| %d | %s | %.1f ms | %.2fx | %.1f ms | %.1f ms | %.0f %% | %.2f MB | %.2f MB | %.2f MB | %.2f + %.2f + "
                "%.2f MB |\n",
                args.ranks, mode.c_str(), many.step_s * 1e3, one.step_s / many.step_s, many.comm_s * 1e3,
                many.exposed_s * 1e3, hidden, logged(many.optimizer_bytes), logged(many.ema_bytes),
                logged(many.grad_bytes), mb(plan.optimizer_bytes), mb(plan.ema_bytes), mb(plan.grad_bytes));
    out["modes"][mode] = {{"step_s", many.step_s},
                          {"speedup", one.step_s / many.step_s},
                          {"reduction_span_s", many.comm_s},
                          {"exposed_s", many.exposed_s},
                          {"optimizer_bytes", many.optimizer_bytes},
                          {"ema_bytes", many.ema_bytes},
                          {"grad_bytes", many.grad_bytes},
                          {"plan", pi0::train::rank_memory_json(plan)}};
  }
  if (args.json) std::printf("%s\n", out.dump().c_str());
  fs::remove_all(work);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("bench_ddp", [&] {
    const auto args = parse_args(argc, argv);
    return args ? run(*args) : 0;
  });
}
