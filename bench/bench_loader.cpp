// Loader throughput: samples/s with 2 cameras stored at 128x128, resized to 224x224, with and without augmentation,
// for 1 and 2 workers. Usage: bench_loader [--batches N] [--batch-size B] [--dir DIR] [--tokenizer PATH]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/data/example_data.h"
#include "pi0/data/loader.h"
#include "pi0/data/tokenizer.h"

int main(int argc, char** argv) {
  int64_t batches = 20, batch_size = 16;
  std::string dir = (std::filesystem::temp_directory_path() / "pi0_bench_loader").string();
  std::string tokenizer_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batches") batches = std::stoll(argv[i + 1]);
    else if (a == "--batch-size") batch_size = std::stoll(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
    else if (a == "--tokenizer") tokenizer_path = argv[i + 1];
  }
  spdlog::set_level(spdlog::level::warn);
  pi0::data::ExampleDataOptions eo;
  eo.episodes = 8;
  eo.steps = 100;
  eo.image_size = 128;
  pi0::data::DatasetOptions o;
  o.paths = {pi0::data::write_example_libero(dir, eo)};
  o.action_horizon = 50;
  auto dataset = std::make_shared<pi0::data::RobotDataset>(o);
  // Run from the repo root or build/ (or pass --tokenizer).
  for (const char* c : {"data/tokenizer/tiny_spm.model", "../data/tokenizer/tiny_spm.model"})
    if (tokenizer_path.empty() && std::filesystem::exists(c)) tokenizer_path = c;
  auto tokenizer = std::make_shared<const pi0::data::Tokenizer>(tokenizer_path);
  pi0::data::TransformOptions t;  // pi0: 224 images, action_dim 32, 48 tokens
  auto transform = std::make_shared<pi0::data::SampleTransform>(t, pi0::data::compute_norm_stats(*dataset), tokenizer);

  std::printf("loader throughput: %lld frames, 2 cameras 128x128 -> 224x224, batch %lld, %lld batches, torch threads %d\n",
              static_cast<long long>(dataset->size()), static_cast<long long>(batch_size),
              static_cast<long long>(batches), at::get_num_threads());
  std::printf("| augment | workers | samples/s | ms/batch |\n|---|---|---|---|\n");
  for (bool augment : {false, true}) {
    for (int64_t workers : {1, 2}) {
      pi0::data::LoaderOptions lo;
      lo.batch_size = batch_size;
      lo.num_workers = workers;
      lo.prefetch = 4;
      lo.augment = augment;
      pi0::data::DataLoader loader(dataset, transform, lo);
      loader.next();  // warm-up
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t b = 0; b < batches; ++b) loader.next();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("| %s | %lld | %.1f | %.1f |\n", augment ? "yes" : "no", static_cast<long long>(workers),
                  static_cast<double>(batches * batch_size) / s, 1000.0 * s / static_cast<double>(batches));
      std::fflush(stdout);
    }
  }
  std::filesystem::remove_all(dir);
  return 0;
}
