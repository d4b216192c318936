// Data-parallel training end to end: pi0-train processes on 127.0.0.1 (Gloo, CPU), launched the way torchrun
// launches them (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). Tiny debug model, a few steps each.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"
#include "pi0/io/sharded_state.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/train/metrics.h"
#include "support/app_process.h"
#include "support/distributed_support.h"
#include "support/test_support.h"

extern char** environ;

namespace {

using pi0::testing::free_port;
using pi0::testing::TempDir;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kBin = pi0::testing::app_dir();
const std::string kSrc = std::string(PI0_SOURCE_DIR);

/// The example dataset and its norm stats, made once per test binary run.
const TempDir& example_data() {
  static TempDir dir("pi0ddp_data");
  static bool made = false;
  if (!made) {
    const std::string d = dir.str();
    REQUIRE(std::system((kBin + "/pi0-make-example-data --out " + d + " --episodes 4 --steps 40 > /dev/null").c_str()) == 0);
    REQUIRE(std::system((kBin + "/pi0-norm-stats --config " + kSrc + "/configs/debug.yaml --set 'data.dataset.paths=[" +
                         d + "/*.hdf5]' --out " + d + "/norm_stats.json > /dev/null 2>&1").c_str()) == 0);
    made = true;
  }
  return dir;
}

/// pi0-train arguments for a tiny float32 run in `run_dir`; `extra` are more --set overrides.
std::vector<std::string> train_args(const std::string& run_dir, int64_t steps, const std::vector<std::string>& extra) {
  const auto& d = example_data();
  std::vector<std::string> a = {kBin + "/pi0-train", "--config", kSrc + "/configs/debug.yaml"};
  for (const std::string& s : std::vector<std::string>{"data.dataset.paths=[" + d.str() + "/*.hdf5]", "data.norm_stats=" + d.str("norm_stats.json"),
        "data.tokenizer=" + kSrc + "/data/tokenizer/tiny_spm.model", "data.augment=false", "data.num_workers=0",
        "checkpoint.run_dir=" + run_dir, "train.num_steps=" + std::to_string(steps), "train.batch_size=8",
        std::string("train.precision=float32"), std::string("train.ema_decay=0"), std::string("train.log_interval=1"),
        std::string("train.lr_warmup_steps=2"), std::string("dist.timeout_s=15")}) {
    a.push_back("--set");
    a.push_back(s);
  }
  for (const auto& s : extra) {
    if (s.rfind("--", 0) == 0) {
      a.push_back(s);
    } else {
      a.push_back("--set");
      a.push_back(s);
    }
  }
  return a;
}

/// fork + exec of `args` with the torchrun variables for (rank, world); output to `log`.
pid_t spawn(const std::vector<std::string>& args, int rank, int world, int port, const std::string& log) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string v(*e);
    for (const char* drop : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=", "SLURM_"})
      if (v.rfind(drop, 0) == 0) goto skip;
    env.push_back(v);
  skip:;
  }
  if (world > 1) {
    env.push_back("RANK=" + std::to_string(rank));
    env.push_back("LOCAL_RANK=" + std::to_string(rank));
    env.push_back("WORLD_SIZE=" + std::to_string(world));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
  }
  env.push_back("OMP_NUM_THREADS=1");
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f) {
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
    }
    std::vector<char*> argv, envp;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    for (const auto& s : env) envp.push_back(const_cast<char*>(s.c_str()));
    envp.push_back(nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

/// Waits up to `seconds` for `pid`; returns its exit status (128 + signal if killed), or -1 on timeout (then kills it).
int wait_exit(pid_t pid, double seconds) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  while (Clock::now() < deadline) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

/// Runs `world` ranks of pi0-train with `args`; REQUIREs every rank to exit 0 within `seconds`.
void run_ranks(const std::vector<std::string>& args, int world, const std::string& log_prefix, double seconds = 120) {
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) pids.push_back(spawn(args, r, world, port, log_prefix + std::to_string(r) + ".log"));
  for (int r = 0; r < world; ++r) {
    const int rc = wait_exit(pids[static_cast<size_t>(r)], seconds);
    INFO("rank " << r << " log:\n" << read_text(log_prefix + std::to_string(r) + ".log"));
    REQUIRE(rc == 0);
  }
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> out;
  for (const auto& m : pi0::train::read_metrics((fs::path(run_dir) / "metrics.jsonl").string()))
    out.push_back(m.at("loss").get<double>());
  return out;
}

std::map<std::string, torch::Tensor> final_weights(const std::string& run_dir) {
  const auto newest = pi0::io::newest_complete_checkpoint(run_dir);
  REQUIRE(newest.has_value());
  return pi0::io::read_safetensors((fs::path(newest->second) / "model.safetensors").string());
}

/// The EMA of the newest checkpoint, whole tensors, whether written by one rank or in pieces by several.
std::map<std::string, torch::Tensor> final_ema(const std::string& run_dir) {
  const auto dir = pi0::io::newest_complete_checkpoint(run_dir)->second;
  pi0::io::StateReader reader(pi0::io::state_files(dir, "ema"));
  std::map<std::string, torch::Tensor> out;
  std::vector<pi0::io::StateReader::Request> requests;
  for (const auto& [name, n] : reader.numels()) {
    out[name] = torch::zeros({n});
    requests.push_back({name, 0, out[name]});
  }
  reader.read(requests, /*exact_dtype=*/true);
  return out;
}

enum class Metric { kMax, kL2 };

/// Largest per-tensor relative error over tensors present in both (flattened): max |a − b| / max |a| (kMax) or
/// ‖a − b‖ / ‖a‖ (kL2). Excluded: the attention key biases, whose exact gradient is zero (softmax ignores a shift
/// shared by all keys of a query): their gradient is float rounding noise, which Adam's normalization turns into
/// ±lr steps that differ between summation orders.
double worst_error(const std::map<std::string, torch::Tensor>& a, const std::map<std::string, torch::Tensor>& b,
                   std::string& worst_name, Metric metric = Metric::kMax) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (const auto& [name, t] : a) {
    if (name.find("k_proj.bias") != std::string::npos) continue;
    const auto x = t.reshape({-1}).to(torch::kFloat64), y = b.at(name).reshape({-1}).to(torch::kFloat64);
    const double e = metric == Metric::kMax ? pi0::testing::max_rel_error(y, x)
                                            : (x - y).norm().item<double>() / std::max(x.norm().item<double>(), 1e-30);
    if (e > worst) worst = e, worst_name = name;
  }
  return worst;
}

// Summation order differs between a batch of 2b and two of b + a reduction, so weights are not bit-exact:
// elements whose gradient is near float32 rounding noise take Adam steps of up to ±lr whose sign depends on the
// order, so a tensor's max |Δw| can reach a few lr-sized steps although the maths agree. The GEMM library sets the
// order: 0.6e-4 was seen with Debian's OpenBLAS, 1.008e-4 with the MKL inside pip's LibTorch 2.x; 2e-4 keeps a 2x
// margin over both, still far below one step's relative size (lr / max|w|).
constexpr double kWeightTolerance = 2e-4;

// Losses of one rank with batch 2b against two ranks with batch b (u: the unit roundoff, 2⁻²⁴ in float32, 2⁻⁸ in
// bf16). At each step both compute the mean of the same 2b·H·A = 8·8·8 = 512 squared errors of the same model:
// identical weights at step 1, and afterwards weights that differ only on elements whose gradient is rounding noise
// (see kWeightTolerance), which by that very fact barely move the loss. Only the order of the sums differs: GEMM
// blocking over 2b or b rows, one mean of 512 terms or the mean of two means of 256.
// float32: reordering a sum of n terms moves it by at most γ_n·Σ|terms| (γ_n ≈ n·u) and, its rounding errors being
// independent, by λ·√n·u except with probability 2·exp(−λ²/2) (Higham & Mary's probabilistic bound). For the loss's
// 512 positive terms: 7.4·√512·2⁻²⁴ = 1e-5 of the loss (λ = 7.4: failure probability 1e-12); the model's own sums
// (≤ 256 terms in the dummy model) add less.
constexpr double kLossToleranceFloat32 = 1e-5;
// bf16 compute: every activation is rounded to bf16, so where the two orders' float32 sums straddle a rounding
// boundary the runs hold values one ulp (2u) apart, and those flips propagate: the two losses agree to bf16's
// resolution, u = 3.9e-3 relative, not to float32's. (Sample-level mistakes, a rank reading the other's samples,
// move the loss by its spread over samples, tens of percent.) The former 1e-5 bound failed at 3.3e-5 (step 3) on an
// AVX2 CPU where LibTorch 1.13 also summed the bf16 matmuls in bf16 (fixed in nn/matmul.h).
constexpr double kLossToleranceBf16 = 0x1p-8;

/// "rank R of W holds 1.2 MiB of AdamW state, ... (X, Y and Z bytes; dist.shard=...)", which rank 0 of a
/// multi-process run logs for every rank: the AdamW, EMA and gradient bytes.
std::array<int64_t, 3> held_bytes(const std::string& log, int rank, int world) {
  const auto at = log.find("rank " + std::to_string(rank) + " of " + std::to_string(world) + " holds ");
  INFO(log);
  REQUIRE(at != std::string::npos);
  const auto counts = log.find(" of gradients (", at);
  REQUIRE(counts != std::string::npos);
  std::array<int64_t, 3> out{};
  REQUIRE(std::sscanf(log.c_str() + counts, " of gradients (%ld, %ld and %ld bytes", &out[0], &out[1], &out[2]) == 3);
  return out;
}

}  // namespace

TEST_CASE("ddp: two ranks with batch b match one rank with batch 2b", "[dist][integration]") {
  if (!pi0::testing::apps_built({"pi0-train", "pi0-make-example-data", "pi0-norm-stats"})) return;
  TempDir dir("pi0ddp_eq");
  const int64_t steps = 6;
  const auto t0 = Clock::now();
  run_ranks(train_args(dir.str("one"), steps, {}), 1, dir.str("one_rank"));
  run_ranks(train_args(dir.str("two"), steps, {}), 2, dir.str("two_rank"));
  WARN("1 + 2 rank runs of " << steps << " steps: " << std::chrono::duration<double>(Clock::now() - t0).count() << " s");

  // Losses: the 2-rank loss is the mean of two half-batch means = the full-batch mean up to float32 rounding.
  const auto l1 = losses(dir.str("one")), l2 = losses(dir.str("two"));
  REQUIRE(l1.size() == static_cast<size_t>(steps));
  REQUIRE(l2.size() == l1.size());
  for (size_t i = 0; i < l1.size(); ++i) {
    INFO("step " << i + 1 << ": " << l1[i] << " vs " << l2[i]);
    CHECK(std::abs(l1[i] - l2[i]) <= kLossToleranceFloat32 * std::abs(l1[i]));
  }
  // Weights after `steps` AdamW steps: max |Δ| / max |w| per tensor (see kWeightTolerance).
  std::string worst_name;
  const double worst = worst_error(final_weights(dir.str("one")), final_weights(dir.str("two")), worst_name);
  WARN("weights: worst relative error " << worst << " (" << worst_name << ")");
  CHECK(worst <= kWeightTolerance);
}

TEST_CASE("ddp: a killed rank makes the other fail within dist.timeout_s and leaves the checkpoints intact",
          "[dist][shard][integration]") {
  if (!pi0::testing::apps_built({"pi0-train", "pi0-make-example-data", "pi0-norm-stats"})) return;
  const std::string shard = GENERATE("none", "gradients");
  INFO("dist.shard=" << shard);
  TempDir dir("pi0ddp_kill");
  const auto args = train_args(dir.str("run"), 100000, {"dist.shard=" + shard, "train.ema_decay=0.9",
                                                         "checkpoint.save_interval=3"});
  const int port = free_port();
  const pid_t r0 = spawn(args, 0, 2, port, dir.str("rank0.log"));
  const pid_t r1 = spawn(args, 1, 2, port, dir.str("rank1.log"));
  // Wait until a checkpoint exists and training went on past it, then kill rank 1 hard.
  const auto start = Clock::now();
  while ((!pi0::io::newest_complete_checkpoint(dir.str("run")) || losses(dir.str("run")).size() < 4) &&
         Clock::now() - start < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(pi0::io::newest_complete_checkpoint(dir.str("run")).has_value());
  kill(r1, SIGKILL);
  waitpid(r1, nullptr, 0);
  const auto killed = Clock::now();
  const int rc = wait_exit(r0, 15 + 30);  // dist.timeout_s = 15, plus margin for a busy machine
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  const auto log = read_text(dir.str("rank0.log"));
  INFO("rank 0 exit " << rc << " after " << took << " s; log tail:\n" << log.substr(log.size() > 2000 ? log.size() - 2000 : 0));
  WARN("dist.shard=" << shard << ": surviving rank exited with " << rc << " " << took << " s after the peer was killed");
  CHECK(rc == 4);
  CHECK(log.find("distributed failure") != std::string::npos);
  CHECK(log.find("rank 0 of 2") != std::string::npos);
  CHECK(log.find("dist.timeout_s") != std::string::npos);
  // Whatever step the kill hit, the newest complete checkpoint verifies (sizes, checksums, finite values).
  const auto newest = pi0::io::newest_complete_checkpoint(dir.str("run"));
  REQUIRE(newest.has_value());
  const auto manifest = pi0::io::read_manifest(newest->second);
  REQUIRE(manifest.has_value());
  CHECK_NOTHROW(pi0::io::check_manifest(newest->second, *manifest));
  CHECK_NOTHROW(pi0::io::verify_contents(newest->second, manifest));
  CHECK(manifest->files.count(shard == "none" ? "optimizer.safetensors" : "optimizer.rank1-of-2.safetensors") == 1);
}

TEST_CASE("ddp: resuming a two-rank run is exact", "[dist][integration]") {
  if (!pi0::testing::apps_built({"pi0-train", "pi0-make-example-data", "pi0-norm-stats"})) return;
  TempDir dir("pi0ddp_resume");
  const auto t0 = Clock::now();
  run_ranks(train_args(dir.str("full"), 4, {}), 2, dir.str("full_rank"));
  run_ranks(train_args(dir.str("half"), 2, {}), 2, dir.str("half_rank"));
  run_ranks(train_args(dir.str("half"), 4, {"--resume"}), 2, dir.str("resumed_rank"));
  WARN("three 2-rank runs: " << std::chrono::duration<double>(Clock::now() - t0).count() << " s");
  // Both ranks' RNG states and loader positions are in the checkpoint.
  pi0::io::SafetensorsFile rng((fs::path(pi0::io::newest_complete_checkpoint(dir.str("half"))->second) /
                                "rng.safetensors").string());
  CHECK(rng.names().size() == 2);
  const auto full = losses(dir.str("full")), resumed = losses(dir.str("half"));
  REQUIRE(full.size() == 4);
  REQUIRE(resumed.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(full[i] == resumed[i]);  // bit-exact: same ops in the same order on CPU
  const auto wf = final_weights(dir.str("full")), wr = final_weights(dir.str("half"));
  for (const auto& [name, t] : wf) {
    INFO(name);
    CHECK(torch::equal(t, wr.at(name)));
  }
}

TEST_CASE("ddp: sharded optimizer state and gradients match one rank with the double batch", "[dist][shard][integration]") {
  if (!pi0::testing::apps_built({"pi0-train", "pi0-make-example-data", "pi0-norm-stats"})) return;
  // Per group of settings: one rank with batch 2b, two ranks with batch b unsharded ("plain") and sharded.
  // Against the unsharded two-rank run sharding must change nothing: the same gradients (a sum of two values does not
  // depend on its order) and the same element-wise AdamW. The one exception is shard=gradients with accumulation,
  // which sums over ranks per micro-step instead of per step. Against one rank the summation order differs (see
  // kWeightTolerance); with gradient accumulation and with bf16 compute that noise grows on the elements whose true
  // gradient is near zero (pi0.5's zero-initialized AdaRMS modulation weights), so those groups compare the
  // per-tensor relative L2 error: 1e-4 measured for float32 with accumulation, 4.2e-3 for bf16 compute (bf16 has 8
  // mantissa bits, 3.9e-3 relative; 7e-3 while CPU bf16 matmuls summed in bf16).
  struct Group {
    std::string name;
    std::vector<std::string> sets;
    std::vector<std::string> modes;
    bool l2 = false;          ///< compare with one rank by relative L2 instead of max-element error
    double tolerance = 0;     ///< for that comparison
    double loss_tolerance = kLossToleranceFloat32;  ///< relative, per step
  };
  const auto g = GENERATE(
      Group{"float32, EMA", {"train.ema_decay=0.9"}, {"optimizer", "gradients"}, false, kWeightTolerance},
      Group{"float32, EMA, 2 accumulation steps", {"train.ema_decay=0.9", "train.grad_accum_steps=2"}, {"gradients"}, true, 5e-4},
      Group{"bf16-mixed, action-expert-only",
            {"train.precision=bf16-mixed", "train.freeze=action-expert-only", "train.ema_decay=0.9"}, {"gradients"}, true, 2e-2,
            kLossToleranceBf16},
      Group{"float32, LoRA",
            {"model.paligemma_variant=dummy_lora", "model.action_expert_variant=dummy_lora", "train.freeze=lora",
             "train.ema_decay=0.9"}, {"gradients"}, false, kWeightTolerance});
  INFO(g.name);
  TempDir dir("pi0ddp_shard");
  const int64_t steps = 4;
  auto with = [&](const std::string& mode) {
    auto s = g.sets;
    s.push_back("dist.shard=" + mode);
    return s;
  };
  run_ranks(train_args(dir.str("one"), steps, with("none")), 1, dir.str("one_rank"));
  run_ranks(train_args(dir.str("plain"), steps, with("none")), 2, dir.str("plain_rank"));
  const auto l1 = losses(dir.str("one"));
  const auto w1 = final_weights(dir.str("one")), wp = final_weights(dir.str("plain"));
  const auto e1 = final_ema(dir.str("one")), ep = final_ema(dir.str("plain"));
  // What one process holds: each rank of the unsharded run holds all of it (a single process logs no such line).
  CHECK(read_text(dir.str("one_rank0.log")).find(" holds ") == std::string::npos);
  const auto one = held_bytes(read_text(dir.str("plain_rank0.log")), 0, 2);
  for (const auto& mode : g.modes) {
    INFO("dist.shard=" << mode);
    run_ranks(train_args(dir.str(mode), steps, with(mode)), 2, dir.str(mode + "_rank"));
    const auto l2 = losses(dir.str(mode));
    REQUIRE(l1.size() == static_cast<size_t>(steps));
    REQUIRE(l2.size() == l1.size());
    for (size_t i = 0; i < l1.size(); ++i) {
      INFO("step " << i + 1 << ": " << l1[i] << " vs " << l2[i]);
      CHECK(std::abs(l1[i] - l2[i]) <= g.loss_tolerance * std::abs(l1[i]));
    }
    const auto w2 = final_weights(dir.str(mode));
    const auto e2 = final_ema(dir.str(mode));
    std::string wn, en;
    const double w_err = worst_error(w1, w2, wn, g.l2 ? Metric::kL2 : Metric::kMax);
    const double e_err = worst_error(e1, e2, en, g.l2 ? Metric::kL2 : Metric::kMax);
    std::string pn, pen;
    const bool accumulating = g.name.find("accumulation") != std::string::npos;
    const double p_err = worst_error(wp, w2, pn, Metric::kL2), pe_err = worst_error(ep, e2, pen, Metric::kL2);
    WARN(g.name << ", dist.shard=" << mode << ": against one rank " << (g.l2 ? "L2" : "max") << "-relative error "
                << w_err << " (" << wn << "), EMA " << e_err << " (" << en << "); against unsharded two ranks "
                << p_err << ", EMA " << pe_err);
    CHECK(w_err <= g.tolerance);
    CHECK(e_err <= g.tolerance);
    if (mode == "gradients" && accumulating) {
      CHECK(p_err <= 1e-4);
      CHECK(pe_err <= 1e-4);
    } else {
      for (const auto& [name, t] : wp) {
        INFO(name);
        CHECK(torch::equal(t, w2.at(name)));
      }
      for (const auto& [name, t] : ep) CHECK(torch::equal(t, e2.at(name)));
    }
    // Each rank wrote its own pieces; the manifest lists them.
    const auto ckpt = pi0::io::newest_complete_checkpoint(dir.str(mode))->second;
    const auto manifest = pi0::io::read_manifest(ckpt);
    REQUIRE(manifest.has_value());
    for (const char* f : {"optimizer.rank0-of-2.safetensors", "optimizer.rank1-of-2.safetensors",
                          "ema.rank0-of-2.safetensors", "ema.rank1-of-2.safetensors"}) {
      INFO(f);
      CHECK(fs::exists(fs::path(ckpt) / f));
      CHECK(manifest->files.count(f) == 1);
    }
    CHECK_FALSE(fs::exists(fs::path(ckpt) / "optimizer.safetensors"));
    // Per-rank state, measured from the tensors: AdamW and EMA split into halves (to an element); gradients split
    // (each rank holds its pieces of the parameters that got one) or, with shard=optimizer, whole on every rank.
    const auto log = read_text(dir.str(mode + "_rank0.log"));
    const auto r0 = held_bytes(log, 0, 2), r1 = held_bytes(log, 1, 2);
    for (int k = 0; k < 2; ++k) {
      CHECK(r0[k] + r1[k] == one[k]);
      CHECK(std::abs(r0[k] - r1[k]) <= 16);
    }
    if (mode == "gradients") {
      // Split: together at least the gradients one rank holds (a bucket also carries the zeros of a parameter the
      // loss never reaches, which one rank holds no gradient for), each less than all of them.
      CHECK(r0[2] + r1[2] >= one[2]);
      CHECK(std::max(r0[2], r1[2]) < one[2]);
    } else {
      CHECK(r0[2] == one[2]);
      CHECK(r1[2] == one[2]);
    }
    // The plan of `--print-params --world-size 2` for the same settings names the largest rank's bytes: AdamW and
    // EMA exactly; gradients as an upper bound (it counts every trainable parameter, also one the loss never reaches).
    std::string cmd;
    auto plan_args = train_args(dir.str("plan"), steps, with(mode));
    for (const char* a : {"--print-params", "--world-size", "2", "--json"}) plan_args.emplace_back(a);
    for (const auto& a : plan_args) cmd += "'" + a + "' ";
    REQUIRE(std::system((cmd + "> " + dir.str("plan.json") + " 2> " + dir.str("plan.err")).c_str()) == 0);
    const auto plan = nlohmann::json::parse(read_text(dir.str("plan.json"))).at("per_rank");
    CHECK(plan.at("optimizer_bytes").get<int64_t>() == std::max(r0[0], r1[0]));
    CHECK(plan.at("ema_bytes").get<int64_t>() == std::max(r0[1], r1[1]));
    CHECK(plan.at("grad_bytes").get<int64_t>() >= std::max(r0[2], r1[2]));
  }
}

TEST_CASE("ddp: a sharded checkpoint resumes at the same world size exactly and at another closely", "[dist][shard][integration]") {
  if (!pi0::testing::apps_built({"pi0-train", "pi0-make-example-data", "pi0-norm-stats"})) return;
  TempDir dir("pi0ddp_reshard");
  const std::vector<std::string> sets = {"dist.shard=gradients", "train.ema_decay=0.9", "checkpoint.save_interval=2"};
  run_ranks(train_args(dir.str("full"), 4, sets), 2, dir.str("full_rank"));
  // The state at step 2, resumed by 2 ranks and by 1.
  for (const char* copy : {"two", "one"}) {
    fs::copy(dir.str("full"), dir.str(copy), fs::copy_options::recursive);
    fs::remove_all(pi0::io::checkpoint_path(dir.str(copy), 4));
  }
  run_ranks(train_args(dir.str("two"), 4, [&] { auto s = sets; s.push_back("--resume"); return s; }()), 2,
            dir.str("two_rank"));
  run_ranks(train_args(dir.str("one"), 4, [&] { auto s = sets; s.push_back("--resume"); return s; }()), 1,
            dir.str("one_rank"));
  const auto full = losses(dir.str("full")), two = losses(dir.str("two")), one = losses(dir.str("one"));
  REQUIRE(full.size() == 4);
  REQUIRE(two.size() == 4);
  REQUIRE(one.size() == 4);
  for (size_t i = 2; i < 4; ++i) {
    CHECK(full[i] == two[i]);  // bit-exact: same ops in the same order on CPU
    CHECK(std::abs(full[i] - one[i]) <= kLossToleranceFloat32 * std::abs(full[i]));
  }
  const auto wf = final_weights(dir.str("full")), w2 = final_weights(dir.str("two"));
  for (const auto& [name, t] : wf) {
    INFO(name);
    CHECK(torch::equal(t, w2.at(name)));
  }
  const auto ef = final_ema(dir.str("full")), e2 = final_ema(dir.str("two"));
  for (const auto& [name, t] : ef) CHECK(torch::equal(t, e2.at(name)));
  std::string worst_name;
  const double worst = worst_error(wf, final_weights(dir.str("one")), worst_name);
  const double worst_ema = worst_error(ef, final_ema(dir.str("one")), worst_name);
  WARN("resumed at world 1: weights within " << worst << ", EMA within " << worst_ema);
  CHECK(worst <= kWeightTolerance);
  CHECK(worst_ema <= kWeightTolerance);
  // The world-1 continuation wrote an unsharded checkpoint.
  CHECK(fs::exists(fs::path(pi0::io::newest_complete_checkpoint(dir.str("one"))->second) / "optimizer.safetensors"));

  // Export: the sharded run's bundle equals the bundle of the same history trained without sharding.
  run_ranks(train_args(dir.str("plain"), 4, {"dist.shard=none", "train.ema_decay=0.9", "checkpoint.save_interval=2"}), 2,
            dir.str("plain_rank"));
  for (const char* run : {"full", "plain"}) {
    const std::string cmd = kBin + "/pi0-export --checkpoint " + dir.str(run) + " --out " + dir.str(std::string(run) + "_bundle") +
                            " --dtype float32 > " + dir.str(std::string(run) + "_export.log") + " 2>&1";
    INFO(read_text(dir.str(std::string(run) + "_export.log")));
    REQUIRE(std::system(cmd.c_str()) == 0);
  }
  CHECK(read_text(dir.str("full_export.log")).find("overlaid") != std::string::npos);
  // Two ranks without accumulation: the same sums and the same element-wise updates, so the same bits.
  const auto bf = pi0::io::read_safetensors(dir.str("full_bundle/model.safetensors"));
  const auto bp = pi0::io::read_safetensors(dir.str("plain_bundle/model.safetensors"));
  REQUIRE(bf.size() == bp.size());
  for (const auto& [name, t] : bp) {
    INFO(name);
    CHECK(torch::equal(t, bf.at(name)));
  }
}

