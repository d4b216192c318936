// pi0-make-example-data: writes a small LIBERO-layout HDF5 file with a learnable task (see example_data.h), or one
// frame of a dataset as a pi0-infer observation file.
//   pi0-make-example-data --out data/generated/example --episodes 8 --steps 60 --seed 0 --image-size 64
//   pi0-make-example-data --config run.yaml [--set ...] [--dataset I] --episode E --frame F --observation-out obs.safetensors
//   pi0-make-example-data --out data/generated/example --observation-out obs.safetensors [--episode E] [--frame F]
//     (the observation forms read the frame through the trainer's dataset readers, so any format a config trains on
//      works: HDF5 LIBERO/ALOHA and LeRobot; openpi keys image/<camera> uint8 [1,H,W,3], image_mask/<camera> bool
//      [1], state float32 [1,S] (raw robot values), and the frame's prompt in the file's metadata, which pi0-infer
//      uses when no --prompt is given)
// Flags and exit codes: pi0-make-example-data --help.
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/config/config.h"
#include "pi0/data/config_options.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/data/observation_file.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/observation.h"

namespace {

// Frame `frame` of episode `episode` (or global frame `frame` without an episode) of `dataset`, as a pi0-infer
// observation file with the frame's prompt in its metadata.
void write_observation(const pi0::data::RobotDataset& dataset, const std::string& what, std::optional<int64_t> episode,
                       int64_t frame, const std::string& out, bool with_prompt) {
  int64_t index = frame;
  if (episode) {
    if (*episode >= dataset.num_episodes())
      throw pi0::UserError("--episode: got " + std::to_string(*episode) + ", expected 0.." +
                           std::to_string(dataset.num_episodes() - 1) + " (" + what + " has " +
                           std::to_string(dataset.num_episodes()) + " episodes)");
    const auto& ep = dataset.episode(*episode);
    if (frame >= ep.length)
      throw pi0::UserError("--frame: got " + std::to_string(frame) + ", expected 0.." + std::to_string(ep.length - 1) +
                           " (episode " + std::to_string(*episode) + " of " + what + " has " +
                           std::to_string(ep.length) + " frames)");
    index = ep.first_index + frame;
  } else if (frame >= dataset.size()) {
    throw pi0::UserError("--frame must be in [0, " + std::to_string(dataset.size()) + ") (got " + std::to_string(frame) + ")");
  }
  const auto sample = dataset.get(index);
  std::vector<std::pair<std::string, torch::Tensor>> obs;
  for (size_t c = 0; c < pi0::model::kCameraNames.size(); ++c) {
    if (c >= sample.images.size() || !sample.images[c].defined()) continue;
    obs.emplace_back("image/" + pi0::model::kCameraNames[c], sample.images[c].unsqueeze(0).contiguous());
    obs.emplace_back("image_mask/" + pi0::model::kCameraNames[c], torch::ones({1}, torch::kBool));
  }
  obs.emplace_back("state", sample.state.unsqueeze(0).to(torch::kFloat32).contiguous());
  std::map<std::string, std::string> metadata = {{"episode", std::to_string(sample.episode)},
                                                 {"frame", std::to_string(sample.frame)}, {"source", what}};
  if (with_prompt) metadata[pi0::data::kObservationPromptKey] = sample.prompt;
  pi0::io::save_safetensors(out, obs, metadata);
  spdlog::info("wrote observation {} (episode {}, frame {} of {}, prompt '{}')", out, sample.episode, sample.frame,
               what, with_prompt ? sample.prompt : std::string("none: give pi0-infer --prompt"));
}

int make_example_data_main(int argc, char** argv) {
  pi0::data::ExampleDataOptions opt;
  std::string out, format = "libero", observation_out, config_path;
  std::vector<std::string> overrides;
  int64_t frame = 0, dataset_index = 0;
  std::optional<int64_t> episode;
  auto cli = pi0::app::make_parser(
      "pi0-make-example-data",
      "Writes a small HDF5 dataset with a learnable task, or one frame of a dataset (a training config's, any format "
      "it reads) as a pi0-infer observation file.");
  cli->add_option("--out", out, "dataset directory (written, or read with --observation-out)")->check(pi0::app::non_empty());
  cli->add_option("--episodes", opt.episodes, "episodes to write")->check(pi0::app::int_in(1));
  cli->add_option("--steps", opt.steps, "steps per episode")->check(pi0::app::int_in(1));
  cli->add_option("--seed", opt.seed, "random seed")->check(pi0::app::int_in(0));
  cli->add_option("--image-size", opt.image_size, "square image side in pixels")->check(pi0::app::int_in(1, 4096));
  cli->add_option("--format", format, "dataset layout")->check(pi0::app::one_of({"libero", "aloha"}));
  cli->add_option("--observation-out", observation_out,
                  "instead: write one frame (--episode, --frame) of the dataset of --config (or the one in --out) as a "
                  "pi0-infer observation file (image/<camera> uint8 [1,H,W,3], image_mask/<camera> bool [1], raw state "
                  "float32 [1,S], the frame's prompt in the metadata)")
      ->check(pi0::app::non_empty());
  cli->add_option("--config", config_path,
                  "with --observation-out: a training config whose dataset (data.dataset, or data.datasets[--dataset]) "
                  "the frame comes from, read as the trainer reads it (HDF5 LIBERO/ALOHA, LeRobot)")
      ->check(pi0::app::non_empty());
  pi0::app::add_config_overrides(*cli, overrides);
  cli->add_option("--dataset", dataset_index, "with --config: the entry of data.datasets (0 = the first)")
      ->check(pi0::app::int_in(0));
  cli->add_option("--episode", episode, "with --observation-out: the episode; --frame then counts within it")
      ->check(pi0::app::int_in(0));
  cli->add_option("--frame", frame, "with --observation-out: the frame index (within --episode when given)")
      ->check(pi0::app::int_in(0));
  if (auto done = pi0::app::parse(*cli, argc, argv)) return *done;
  if (!config_path.empty()) {
    if (observation_out.empty())
      throw pi0::UserError("--config: reads one frame of the config's dataset; give --observation-out FILE too");
    if (!out.empty()) throw pi0::UserError("--out: not used with --config (the config names the dataset)");
    const auto cfg = pi0::config::load_config(config_path, overrides);
    const auto entries = pi0::config::dataset_entries(cfg);
    if (dataset_index >= static_cast<int64_t>(entries.size()))
      throw pi0::UserError("--dataset: got " + std::to_string(dataset_index) + ", expected 0.." +
                           std::to_string(entries.size() - 1) + " (" + config_path + " lists " +
                           std::to_string(entries.size()) + " dataset" + (entries.size() == 1 ? "" : "s") + ")");
    const auto i = static_cast<size_t>(dataset_index);
    const std::string key = pi0::config::dataset_key(cfg, i);
    auto d = pi0::data::dataset_options(pi0::config::for_dataset(cfg, i), key);
    d.action_horizon = 1;  // one frame: its action chunk is not written
    pi0::data::RobotDataset dataset(d);
    write_observation(dataset, key + " of " + config_path, episode, frame, observation_out, true);
    return 0;
  }
  if (!overrides.empty()) throw pi0::UserError("--set: only with --config");
  if (out.empty()) throw pi0::UserError("--out is required (or --config with --observation-out)");
  if (!observation_out.empty()) {
    pi0::data::DatasetOptions d;
    d.format = format;
    d.paths = {out};
    d.action_horizon = 1;
    if (format == "aloha") d.prompt = "unused";  // ALOHA files store no instruction: the file then carries none
    pi0::data::RobotDataset dataset(d);
    write_observation(dataset, out, episode, frame, observation_out, format != "aloha");
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
