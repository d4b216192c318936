// pi0-make-example-data: writes a small LIBERO-layout HDF5 file with a learnable task (see example_data.h).
//   pi0-make-example-data --out data/generated/example --episodes 8 --steps 60 --seed 0 --image-size 64
//   pi0-make-example-data --out data/generated/example --observation-out obs.safetensors [--frame N]
//     (the second form writes one frame of the existing dataset as a pi0-infer observation file: openpi keys
//      image/<camera> uint8 [1,H,W,3], image_mask/<camera> bool [1], state float32 [1,S] — raw robot values)
// Flags and exit codes: pi0-make-example-data --help.
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/observation.h"

namespace {

int make_example_data_main(int argc, char** argv) {
  pi0::data::ExampleDataOptions opt;
  std::string out, format = "libero", observation_out;
  int64_t frame = 0;
  auto cli = pi0::app::make_parser(
      "pi0-make-example-data",
      "Writes a small HDF5 dataset with a learnable task, or one frame of it as a pi0-infer observation file.");
  cli->add_option("--out", out, "dataset directory (written, or read with --observation-out)")
      ->required()->check(pi0::app::non_empty());
  cli->add_option("--episodes", opt.episodes, "episodes to write")->check(pi0::app::int_in(1));
  cli->add_option("--steps", opt.steps, "steps per episode")->check(pi0::app::int_in(1));
  cli->add_option("--seed", opt.seed, "random seed")->check(pi0::app::int_in(0));
  cli->add_option("--image-size", opt.image_size, "square image side in pixels")->check(pi0::app::int_in(1, 4096));
  cli->add_option("--format", format, "dataset layout")->check(pi0::app::one_of({"libero", "aloha"}));
  cli->add_option("--observation-out", observation_out,
                  "instead: write frame --frame of the dataset in --out as a pi0-infer observation file "
                  "(image/<camera> uint8 [1,H,W,3], image_mask/<camera> bool [1], raw state float32 [1,S])")
      ->check(pi0::app::non_empty());
  cli->add_option("--frame", frame, "with --observation-out: the frame index")->check(pi0::app::int_in(0));
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  if (!observation_out.empty()) {
    pi0::data::DatasetOptions d;
    d.format = format;
    d.paths = {out};
    d.action_horizon = 1;
    if (format == "aloha") d.prompt = "unused";
    pi0::data::RobotDataset dataset(d);
    if (frame < 0 || frame >= dataset.size())
      throw pi0::UserError("--frame must be in [0, " + std::to_string(dataset.size()) + ") (got " + std::to_string(frame) + ")");
    const auto sample = dataset.get(frame);
    std::vector<std::pair<std::string, torch::Tensor>> obs;
    for (size_t c = 0; c < pi0::model::kCameraNames.size(); ++c) {
      if (c >= sample.images.size() || !sample.images[c].defined()) continue;
      obs.emplace_back("image/" + pi0::model::kCameraNames[c], sample.images[c].unsqueeze(0).contiguous());
      obs.emplace_back("image_mask/" + pi0::model::kCameraNames[c], torch::ones({1}, torch::kBool));
    }
    obs.emplace_back("state", sample.state.unsqueeze(0).to(torch::kFloat32).contiguous());
    pi0::io::save_safetensors(observation_out, obs);
    spdlog::info("wrote observation {} (frame {} of {}, prompt '{}')", observation_out, frame, out, sample.prompt);
    return 0;
  }
  const std::string written = format == "aloha" ? pi0::data::write_example_aloha(out, opt)
                                                : pi0::data::write_example_libero(out, opt);
  spdlog::info("wrote {} ({} episodes x {} steps, {}x{} images)", written, opt.episodes, opt.steps, opt.image_size,
               opt.image_size);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return pi0::app::run_app("pi0-make-example-data", [&] { return make_example_data_main(argc, argv); });
}
