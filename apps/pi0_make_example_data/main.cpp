// pi0-make-example-data: writes a small LIBERO-layout HDF5 file with a learnable task (see example_data.h).
//   pi0-make-example-data --out data/generated/example --episodes 8 --steps 60 --seed 0 --image-size 64
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/data/example_data.h"

int main(int argc, char** argv) {
  try {
    pi0::data::ExampleDataOptions opt;
    std::string out;
    std::string format = "libero";
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
      else if (a == "-h" || a == "--help") {
        std::cout << "usage: pi0-make-example-data --out DIR [--episodes N] [--steps T] [--seed S] [--image-size 64] "
                     "[--format libero|aloha]\n";
        return 0;
      } else throw pi0::UserError("unknown flag " + a);
    }
    if (out.empty()) throw pi0::UserError("--out DIR is required");
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
