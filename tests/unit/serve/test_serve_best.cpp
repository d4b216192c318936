// pi0-serve --checkpoint RUN_DIR [--best]: a run's checkpoint served without a separate pi0-export (issue 49 item 9).
// The checkpoint served is the one pi0-export exports (--best: checkpoint.keep_best's first), and the temporary
// bundle it goes through is gone once the model is loaded.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/manifest.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/tiny_run.h"
#include "unit/serve/serve_fixture.h"

using namespace pi0;
using Catch::Contains;

namespace {

// The JSON of pi0-serve's second stdout line ("pi0-serve: {...}"), the metadata it serves.
nlohmann::json served_metadata(const std::string& out) {
  const auto listening = out.find("listening on");
  REQUIRE(listening != std::string::npos);
  const auto start = out.find("pi0-serve: {", listening);
  REQUIRE(start != std::string::npos);
  return nlohmann::json::parse(out.substr(start + 11, out.find('\n', start) - start - 11));
}

}  // namespace

TEST_CASE("pi0-serve --checkpoint RUN_DIR --best serves keep_best's first checkpoint and leaves no temporary bundle",
          "[integration][serve]") {
  if (!testing::apps_built({"pi0-serve"})) return;
  testing::TinyRun run;
  train::Trainer(run.config("run", {"train.num_steps=3", "checkpoint.save_interval=1", "checkpoint.keep_last=3",
                                    "checkpoint.keep_best=1", "data.validation_split=0.34", "train.val_samples=4"}))
      .run();
  // Step 2 the best whatever the passes measured (a verified value), so --best and the newest (3) differ.
  const auto run_dir = run.dir.str("run");
  for (const int64_t step : io::complete_checkpoints(run_dir)) {
    const auto ck = io::checkpoint_path(run_dir, step);
    nlohmann::json j;
    std::ifstream(ck + "/" + io::kTrainerStateFile) >> j;
    j["val_loss"] = step == 2 ? 1e-6 : 1.0;
    std::ofstream(ck + "/" + io::kTrainerStateFile) << j.dump(2) << "\n";
    io::write_manifest(ck, step);
  }
  REQUIRE(io::complete_checkpoints(run_dir) == std::vector<int64_t>{1, 2, 3});
  const int64_t best = 2;

  // The temporary bundle goes under $TMPDIR: an empty directory of its own, empty again once serving.
  const auto tmp = run.dir.str("tmp");
  std::filesystem::create_directories(tmp);
  const char* old_tmp = std::getenv("TMPDIR");
  const std::string saved = old_tmp ? old_tmp : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  for (const bool use_best : {true, false}) {
    INFO("--best " << use_best);
    serve_test::AppProcess app("pi0-serve",
                            "--checkpoint " + run_dir + (use_best ? " --best" : "") +
                                " --port 0 --host 127.0.0.1 --robot raw",
                            run.dir, use_best ? "best" : "newest");
    const int port = app.port();
    INFO(app.stdout_text() << app.stderr_text());
    REQUIRE(port > 0);
    const auto md = served_metadata(app.stdout_text());
    CHECK(md.at("bundle") == std::to_string(use_best ? best : 3));  // the checkpoint's directory name: its step
    CHECK(std::filesystem::is_empty(tmp));
    if (use_best) {
      CHECK_THAT(app.stderr_text() + app.stdout_text(),
                 Contains("--best: the best checkpoint of " + run_dir + " is step " + std::to_string(best)));
    }
    CHECK(app.stop(SIGTERM) == 0);
  }
  if (old_tmp) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
}
