// pi0-make-example-data: writes a small LIBERO-layout HDF5 file with a learnable task (see example_data.h).
//   pi0-make-example-data --out data/generated/example --episodes 8 --steps 60 --seed 0 --image-size 64
//   pi0-make-example-data --out data/generated/example --observation-out obs.safetensors [--frame N]
//     (the second form writes one frame of the existing dataset as a pi0-infer observation file: openpi keys
//      image/<camera> uint8 [1,H,W,3], image_mask/<camera> bool [1], state float32 [1,S] — raw robot values)
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/data/dataset.h"
#include "pi0/data/example_data.h"
#include "pi0/io/safetensors.h"
#include "pi0/model/observation.h"

int main(int argc, char** argv) {
  try {
    pi0::data::ExampleDataOptions opt;
    std::string out;
    std::string format = "libero";
    std::string observation_out;
    int64_t frame = 0;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw pi0::UserError(a + ": missing value");
        return argv[++i];
      };
      if (a == "--out") out = value();
      else if (a == "--episodes") opt.episodes = std::stoll(value());
      else if (a == "--steps") opt.steps = std::stoll(value());
      else if (a == "--seed") opt.seed = std::stoull(value());
      else if (a == "--image-size") opt.image_size = std::stoll(value());
      else if (a == "--format") format = value();
      else if (a == "--observation-out") observation_out = value();
      else if (a == "--frame") frame = std::stoll(value());
      else if (a == "-h" || a == "--help") {
        std::cout << "usage: pi0-make-example-data --out DIR [--episodes N] [--steps T] [--seed S] [--image-size 64] "
                     "[--format libero|aloha]\n"
                     "       pi0-make-example-data --out DIR --observation-out obs.safetensors [--frame N]\n";
        return 0;
      } else throw pi0::UserError("unknown flag " + a);
    }
    if (out.empty()) throw pi0::UserError("--out DIR is required");
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
  } catch (const pi0::UserError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "internal error: " << e.what() << "\n";
    return 1;
  }
}
