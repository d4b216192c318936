// Loader throughput: samples/s with 2 cameras (stored at --image-size, default 224; resized to the model's 224),
// with and without augmentation, for 1 and 2 workers; median and best of --repeats runs of --batches batches.
// With --train-json (bench_train's --json output) it also prints the training step's consumption rate from that
// file and the ratio loader / step (target: the loader sustains >= 3x what the step consumes).
//   bench_loader [--batches N] [--batch-size B] [--repeats R] [--image-size S] [--dir DIR] [--tokenizer PATH]
//                [--train-json bench_train.json] [--format lerobot --data <LeRobot dataset root>]
//                [--workers N[,N...] (default 1,2; 0 = on the caller's thread)] [--augment no|yes|both (default both)]
//                [--mixture <LeRobot dataset root, with video>]
// Besides wall-clock rates it reports the process CPU time (user + sys, all threads) of the timed batches and
// samples per CPU-second, the per-core figure that stays meaningful on a loaded machine (exact with 0 workers; with
// workers, up to `prefetch` batches built before the timer or still in flight after it blur both figures) (scripts/bench_lerobot.sh
// compares it with LeRobot's Python loader).
// With --format lerobot it reads that dataset (e.g. one written by tests/data/write_lerobot.py) instead of the
// generated LIBERO HDF5 file.
// With --mixture ROOT it also times a weighted mixture (data.datasets) of three sources in the same loader rows:
// the generated LIBERO file (weight 2), a generated ALOHA set (3 cameras, JPEG rows where libjpeg is built; weight 1)
// and the LeRobot dataset at ROOT (meant to hold video, e.g. write_lerobot.py --images av1; weight 1), its runs
// taking turns with the LIBERO file's so that both see the same machine load. It prints each source alone (main
// thread, no augmentation; from these, the rate the mix's shares predict), then the mixture's rows with their ratio
// to the LIBERO rows, wall-clock and per CPU-second. The ratio mixes two things: the other sources' own cost (a
// third camera, JPEG and video decoding) and the cost of mixing; the prediction separates them.
#include <algorithm>
#include <array>
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
#include "pi0/data/jpeg.h"
#include "pi0/data/lerobot.h"
#include "pi0/data/loader.h"
#include "pi0/data/norm_stats.h"
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
  std::string tokenizer, train_json, format = "libero", data, augment = "both", mixture;
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
  cli->add_option("--mixture", a.mixture,
                  "a LeRobot dataset root (with video): also time the mixture of the generated LIBERO file, a "
                  "generated ALOHA set and this dataset, weights 2:1:1, against the LIBERO rows")
      ->check(app::non_empty());
  if (app::parse(*cli, argc, argv)) return std::nullopt;
  if (a.format == "lerobot" && a.data.empty()) throw pi0::UserError("--format lerobot needs --data <dataset root>");
  if (!a.mixture.empty() && a.format != "libero")
    throw pi0::UserError("--mixture is compared with the generated LIBERO file, one of its sources: drop --format " +
                         a.format);
  return a;
}

// A loader source: the dataset of `o` through the pi0 transform (224 images, action_dim 32, 48 tokens) with the
// dataset's own norm stats, as make_data_pipeline builds each entry of data.datasets.
pi0::data::DataSource make_source(const std::string& name, pi0::data::DatasetOptions o, double weight,
                                  const std::shared_ptr<const pi0::data::Tokenizer>& tokenizer) {
  o.action_horizon = 50;
  pi0::data::DataSource s;
  s.name = name;
  s.weight = weight;
  s.dataset = std::make_shared<const pi0::data::RobotDataset>(o);
  s.transform = std::make_shared<const pi0::data::SampleTransform>(
      pi0::data::TransformOptions{}, pi0::data::compute_norm_stats(*s.dataset), tokenizer);
  return s;
}

struct Timing {
  double median = 0, best = 0;  ///< samples/s over the repeats
  double cpu_s = 0;             ///< process CPU seconds of the timed batches, all repeats
  int64_t samples = 0;          ///< timed samples, all repeats
  double per_cpu_s() const { return static_cast<double>(samples) / cpu_s; }
};

// `repeats` runs of `batches` timed batches per set of sources, the sets taking turns run by run so that a change in
// the machine's load falls on all of them alike (their ratio is the figure); each run is a fresh loader after one
// untimed batch.
std::vector<Timing> time_loaders(const std::vector<std::vector<pi0::data::DataSource>>& sets, const Args& args,
                                 bool augment, int64_t workers, int64_t repeats) {
  std::vector<Timing> t(sets.size());
  std::vector<std::vector<double>> rates(sets.size());
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < sets.size(); ++i) {
      pi0::data::LoaderOptions lo;
      lo.batch_size = args.batch_size;
      lo.num_workers = workers;
      lo.prefetch = 4;
      lo.augment = augment;
      lo.seed = static_cast<uint64_t>(r);
      pi0::data::DataLoader loader(sets[i], lo);
      loader.next();  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = process_cpu_seconds();
      for (int64_t b = 0; b < args.batches; ++b) loader.next();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      t[i].cpu_s += process_cpu_seconds() - c0;
      t[i].samples += args.batches * args.batch_size;
      rates[i].push_back(static_cast<double>(args.batches * args.batch_size) / s);
    }
  }
  for (size_t i = 0; i < sets.size(); ++i) {
    std::sort(rates[i].begin(), rates[i].end());
    t[i].median = rates[i][rates[i].size() / 2], t[i].best = rates[i].back();
  }
  return t;
}

// The --mixture sources, weights 2:1:1: `libero`, a generated ALOHA set (3 cameras, 14-d; JPEG rows as ALOHA 2
// records them where libjpeg is built; fewer frames, as it has a quarter of the draws) and the LeRobot dataset at
// --mixture. `what` gets a line per source for the output.
std::vector<pi0::data::DataSource> make_mixture(const Args& args, const pi0::data::DataSource& libero,
                                                pi0::data::ExampleDataOptions eo,
                                                const std::shared_ptr<const pi0::data::Tokenizer>& tokenizer,
                                                std::vector<std::string>& what) {
  eo.episodes = 4;
  eo.steps = 50;
  const bool jpeg = pi0::data::jpeg_available();
  pi0::data::DatasetOptions aloha;
  aloha.format = "aloha";
  aloha.paths = {pi0::data::write_example_aloha(args.dir + "/aloha", eo, jpeg)};
  aloha.prompt = "transfer the cube";  // ALOHA files store no language
  pi0::data::DatasetOptions lerobot;
  lerobot.format = "lerobot";
  lerobot.paths = {args.mixture};
  std::vector<pi0::data::DataSource> mixture = {libero, make_source("aloha", aloha, 1.0, tokenizer),
                                                make_source("lerobot", lerobot, 1.0, tokenizer)};
  mixture[0].weight = 2.0;
  const auto& lr = mixture[2].dataset->lerobot_source(0);
  bool video = false;
  for (const auto& [key, feature] : lr.features()) video = video || feature.dtype == "video";
  what = {"LIBERO HDF5, 2 cameras, raw rows",
          std::string("ALOHA HDF5, 3 cameras, ") + (jpeg ? "JPEG rows" : "raw rows"),
          "LeRobot " + lr.version() + ", " + (video ? "video" : "image") + " features (" + args.mixture + ")"};
  return mixture;
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
  // Run from the repo root or build/ (or pass --tokenizer).
  for (const char* c : {"data/tokenizer/tiny_spm.model", "../data/tokenizer/tiny_spm.model"})
    if (tokenizer_path.empty() && pi0::posix_fs::exists(c)) tokenizer_path = c;
  auto tokenizer = std::make_shared<const pi0::data::Tokenizer>(tokenizer_path);
  // sets[0]: the one dataset; with --mixture, sets[1]: the mixture, timed in turn with it.
  std::vector<std::vector<pi0::data::DataSource>> sets = {{make_source(args.format, o, 1.0, tokenizer)}};
  std::vector<std::string> what;
  if (!args.mixture.empty()) sets.push_back(make_mixture(args, sets[0][0], eo, tokenizer, what));
  const auto& dataset = sets[0][0].dataset;

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
  std::vector<std::array<Timing, 2>> mixture_rows;  // per row: the one dataset, the mixture
  for (bool augment : augment_modes) {
    for (int64_t workers : args.workers) {
      const auto t = time_loaders(sets, args, augment, workers, args.repeats);
      if (workers == 2) two_worker_rate[augment] = t[0].median;
      if (t.size() == 2) mixture_rows.push_back({t[0], t[1]});
      std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.2f | %.1f |\n", augment ? "yes" : "no",
                  static_cast<long long>(workers), t[0].median, t[0].best,
                  1000.0 * static_cast<double>(args.batch_size) / t[0].median, t[0].cpu_s, t[0].per_cpu_s());
      std::fflush(stdout);
    }
  }
  if (!args.mixture.empty()) {
    // Each source alone on the caller's thread (CPU time exact), and the samples per CPU-second the shares predict
    // for the mix: the shares' per-sample CPU costs added.
    const auto& mixture = sets[1];
    double weights = 0;
    for (const auto& s : mixture) weights += s.weight;
    std::printf("\nmixture of 3 sources (data.datasets), stored %lldx%lld (LeRobot: as written) -> 224x224; each "
                "alone: main thread, no augmentation, %lld batches\n\n"
                "| source | data | frames | weight | samples/s | samples per CPU-s |\n|---|---|---|---|---|---|\n",
                static_cast<long long>(args.image_size), static_cast<long long>(args.image_size),
                static_cast<long long>(args.batches));
    double cpu_s_per_sample = 0;
    for (size_t i = 0; i < mixture.size(); ++i) {
      const Timing t = time_loaders({{mixture[i]}}, args, false, 0, 1)[0];
      cpu_s_per_sample += mixture[i].weight / weights / t.per_cpu_s();
      std::printf("| %s | %s | %lld | %.0f | %.1f | %.1f |\n", mixture[i].name.c_str(), what[i].c_str(),
                  static_cast<long long>(mixture[i].size()), mixture[i].weight, t.median, t.per_cpu_s());
      std::fflush(stdout);
    }
    std::printf("\npredicted for the mix from the sources alone: %.1f samples per CPU-s (main thread, no "
                "augmentation)\n\nthe mixture, its runs taking turns with the rows above:\n\n"
                "| augment | workers | samples/s (median) | samples/s (best) | ms/batch (median) | CPU s (timed, all "
                "repeats) | samples per CPU-s | samples/s: mixture / libero | per CPU-s: mixture / libero |\n"
                "|---|---|---|---|---|---|---|---|---|\n",
                1.0 / cpu_s_per_sample);
    size_t row = 0;
    for (bool augment : augment_modes) {
      for (int64_t workers : args.workers) {
        const auto& [one, mix] = mixture_rows[row++];
        std::printf("| %s | %lld | %.1f | %.1f | %.1f | %.2f | %.1f | %.2fx | %.2fx |\n", augment ? "yes" : "no",
                    static_cast<long long>(workers), mix.median, mix.best,
                    1000.0 * static_cast<double>(args.batch_size) / mix.median, mix.cpu_s, mix.per_cpu_s(),
                    mix.median / one.median, mix.per_cpu_s() / one.per_cpu_s());
      }
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
