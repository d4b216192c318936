// Loader throughput: samples/s with 2 cameras (stored at --image-size, default 224; resized to the model's 224),
// with and without augmentation, for 1 and 2 workers; median and best of --repeats runs of --batches batches.
// With --train-json (bench_train's --json output) it also prints the training step's consumption rate from that
// file and the ratio loader / step (target: the loader sustains >= 3x what the step consumes).
//   bench_loader [--batches N] [--batch-size B] [--repeats R] [--image-size S] [--dir DIR] [--tokenizer PATH]
//                [--train-json bench_train.json] [--format lerobot --data <LeRobot dataset root>]
//                [--workers N[,N...] (default 1,2; 0 = on the caller's thread)] [--augment no|yes|both (default both)]
// Besides wall-clock rates it reports the process CPU time (user + sys, all threads) of the timed batches and
// samples per CPU-second, the per-core figure that stays meaningful on a loaded machine (exact with 0 workers; with
// workers, up to `prefetch` batches built before the timer or still in flight after it blur both figures) (scripts/bench_lerobot.sh
// compares it with LeRobot's Python loader).
// With --format lerobot it reads that dataset (e.g. one written by tests/data/write_lerobot.py) instead of the
// generated LIBERO HDF5 file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <sys/resource.h>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/data/example_data.h"
#include "pi0/data/loader.h"
#include "pi0/data/tokenizer.h"

namespace {
// User + system CPU seconds of this process, all threads (the loader's workers are threads).
double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  const auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

struct Args {
  int64_t batches = 20, batch_size = 16, repeats = 3, image_size = 224;
  std::string dir = (pi0::posix_fs::temp_directory_path() / "pi0_bench_loader").string();
  std::string tokenizer, train_json, format = "libero", data, augment = "both";
  std::vector<int64_t> workers = {1, 2};
};

// Flags through the shared command-line layer (--help lists them); std::nullopt when --help/--version answered.
std::optional<Args> parse_args(int argc, char** argv) {
  Args a;
  namespace app = pi0::app;
  auto cli = app::make_parser("bench_loader", "Loader throughput (samples/s and samples per CPU-second) with and "
                                              "without augmentation, per worker count.");
  cli->add_option("--batches", a.batches, "timed batches per run")->check(app::int_in(1));
  cli->add_option("--batch-size", a.batch_size, "samples per batch")->check(app::int_in(1));
  cli->add_option("--repeats", a.repeats, "runs per row (median and best)")->check(app::int_in(1));
  cli->add_option("--image-size", a.image_size, "side of the generated LIBERO frames (resized to 224)")
      ->check(app::int_in(1));
  cli->add_option("--dir", a.dir, "where the generated LIBERO file goes")->check(app::non_empty());
  cli->add_option("--tokenizer", a.tokenizer, "sentencepiece model (default: data/tokenizer/tiny_spm.model)");
  cli->add_option("--train-json", a.train_json, "bench_train's --json output: adds loader / step ratios")
      ->check(app::non_empty());
  cli->add_option("--format", a.format, "libero (a generated file) or lerobot (--data)")
      ->check(app::one_of({"libero", "lerobot"}));
  cli->add_option("--data", a.data, "with --format lerobot: the LeRobot dataset root")->check(app::non_empty());
  cli->add_option("--workers", a.workers, "worker counts, comma-separated; 0 = batches on the caller's thread")
      ->delimiter(',')
      ->check(app::int_in(0));
  cli->add_option("--augment", a.augment, "rows without augmentation, with it, or both")
      ->check(app::one_of({"no", "yes", "both"}));
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  if (a.format == "lerobot" && a.data.empty()) throw pi0::UserError("--format lerobot needs --data <dataset root>");
  return a;
}

int run(const Args& args) {
  std::string tokenizer_path = args.tokenizer;
  spdlog::set_level(spdlog::level::warn);
  pi0::data::ExampleDataOptions eo;
  eo.episodes = 8;
  eo.steps = 100;
  eo.image_size = args.image_size;
  pi0::data::DatasetOptions o;
  o.format = args.format;
  if (args.format == "lerobot") o.paths = {args.data};
  else o.paths = {pi0::data::write_example_libero(args.dir, eo)};
  o.action_horizon = 50;
  auto dataset = std::make_shared<pi0::data::RobotDataset>(o);
  // Run from the repo root or build/ (or pass --tokenizer).
  for (const char* c : {"data/tokenizer/tiny_spm.model", "../data/tokenizer/tiny_spm.model"})
    if (tokenizer_path.empty() && pi0::posix_fs::exists(c)) tokenizer_path = c;
  auto tokenizer = std::make_shared<const pi0::data::Tokenizer>(tokenizer_path);
  pi0::data::TransformOptions t;  // pi0: 224 images, action_dim 32, 48 tokens
  auto transform = std::make_shared<pi0::data::SampleTransform>(t, pi0::data::compute_norm_stats(*dataset), tokenizer);

  std::printf("format %s%s%s\n", args.format.c_str(), args.data.empty() ? "" : ": ", args.data.c_str());
  std::printf("loader throughput: %lld frames, 2 cameras %lldx%lld -> 224x224, batch %lld, %lld batches x %lld "
              "repeats, prefetch 4, torch threads %d\n",
              static_cast<long long>(dataset->size()), static_cast<long long>(args.image_size),
              static_cast<long long>(args.image_size), static_cast<long long>(args.batch_size),
              static_cast<long long>(args.batches), static_cast<long long>(args.repeats), at::get_num_threads());
  std::vector<bool> augment_modes;
  if (args.augment != "yes") augment_modes.push_back(false);
  if (args.augment != "no") augment_modes.push_back(true);
  std::printf("| augment | workers | samples/s (median) | samples/s (best) | ms/batch (median) | CPU s (timed, all "
              "repeats) | samples per CPU-s |\n|---|---|---|---|---|---|---|\n");
  std::map<bool, double> two_worker_rate;  // augment → median samples/s with 2 workers
  for (bool augment : augment_modes) {
    for (int64_t workers : args.workers) {
      std::vector<double> rates;
      double cpu_s = 0;
      for (int64_t r = 0; r < args.repeats; ++r) {
        pi0::data::LoaderOptions lo;
        lo.batch_size = args.batch_size;
        lo.num_workers = workers;
        lo.prefetch = 4;
        lo.augment = augment;
        lo.seed = static_cast<uint64_t>(r);
        pi0::data::DataLoader loader(dataset, transform, lo);
        loader.next();  // warm-up
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = process_cpu_seconds();
        for (int64_t b = 0; b < args.batches; ++b) loader.next();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        cpu_s += process_cpu_seconds() - c0;
        rates.push_back(static_cast<double>(args.batches * args.batch_size) / s);
      }
      std::sort(rates.begin(), rates.end());
      const double median = rates[rates.size() / 2], best = rates.back();
      if (workers == 2) two_worker_rate[augment] = median;
      std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.2f | %.1f |\n", augment ? "yes" : "no",
                  static_cast<long long>(workers), median, best,
                  1000.0 * static_cast<double>(args.batch_size) / median, cpu_s, static_cast<double>(args.batches * args.batch_size * args.repeats) / cpu_s);
      std::fflush(stdout);
    }
  }
  if (!args.train_json.empty()) {
    std::ifstream f(args.train_json);
    const auto j = nlohmann::json::parse(f);
    std::printf("\nloader (2 workers, median) vs training step consumption (%s; target ratio >= 3)\n\n"
                "| precision | grad ckpt | batch | step samples/s (median) | ratio, augment off | ratio, augment on |\n"
                "|---|---|---|---|---|---|\n",
                args.train_json.c_str());
    for (const auto& r : j.at("rows")) {
      const double step = r.at("samples_per_s_median").get<double>();
      const auto ratio = [&](bool augment) {  // "-" where that mode or 2 workers was not run
        const auto it = two_worker_rate.find(augment);
        return it == two_worker_rate.end() ? std::string("-") : fmt::format("{:.1f}x", it->second / step);
      };
      std::printf("| %s | %s | %lld | %.2f | %s | %s |\n", r.at("precision").get<std::string>().c_str(),
                  r.at("gradient_checkpointing").get<bool>() ? "on" : "off",
                  static_cast<long long>(r.at("batch").get<int64_t>()), step, ratio(false).c_str(),
                  ratio(true).c_str());
    }
  }
  if (args.format != "lerobot") pi0::posix_fs::remove_all(args.dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("bench_loader", [&] {
    const auto args = parse_args(argc, argv);
    return args ? run(*args) : 0;
  });
}
