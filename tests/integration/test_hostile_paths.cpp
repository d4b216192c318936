// Hostile paths as users meet them through the apps (issue 23 items 1, 2, 5, 7): a FIFO or /dev/zero where a file
// is read (refused at once, never a hang), a device where a file is written (refused, left as it was), a
// checkpoint.asset_id that would escape its folder, and the true reason for unreadable inputs.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "pi0/config/config.h"
#include "support/app_process.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::check_user_error;
using pi0::testing::run_app_process;
using pi0::testing::TinyRun;
namespace fs = std::filesystem;

namespace {

// A refused input must be refused at once: a command that blocks (the old behaviour on a FIFO) is cut off here
// and then fails the exit-code check (124, or 137 when it outlives SIGTERM) instead of hanging the suite. The KILL
// matters: pi0-train catches SIGTERM, and a handler that only sets a flag does not end a blocked open().
const std::string kNoHang = "timeout -k 10 120 ";

}  // namespace

TEST_CASE("pi0-train refuses a FIFO as --config or data.tokenizer and /dev/zero as data.tokenizer, at once",
          "[integration][app][inputs]") {
  TinyRun run;
  const auto fifo = run.dir.str("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  auto r = run_app_process("pi0-train", "--config " + fifo, run.dir, kNoHang);
  check_user_error(r, "pi0-train", "config file '" + fifo + "': is a FIFO (named pipe), not a regular file");
  for (const std::string& tokenizer : {fifo, std::string("/dev/zero")}) {
    INFO(tokenizer);
    const auto cfg = run.write_config("tok.yaml", "run", {"data.tokenizer=" + tokenizer});
    r = run_app_process("pi0-train", "--config " + cfg, run.dir, kNoHang);
    check_user_error(r, "pi0-train", "data.tokenizer '" + tokenizer + "': is a ");
    CHECK_THAT(r.err, Contains("not a regular file; expected a sentencepiece model file"));
  }
}

TEST_CASE("pi0-train names the true reason: init_weights /dev/zero or a directory, unreadable HDF5 and norm stats",
          "[integration][app][inputs]") {
  TinyRun run;
  auto cfg = run.write_config("dev.yaml", "run", {"checkpoint.init_weights=/dev/zero"});
  check_user_error(run_app_process("pi0-train", "--config " + cfg, run.dir), "pi0-train",
                   "checkpoint.init_weights '/dev/zero': is a character device, not a regular file");
  cfg = run.write_config("dir.yaml", "run", {"checkpoint.init_weights=" + run.dir.str()});
  check_user_error(run_app_process("pi0-train", "--config " + cfg, run.dir), "pi0-train",
                   "checkpoint.init_weights '" + run.dir.str() + "': is a directory, not a regular file");

  const auto prefix = testing::permission_checked_prefix();
  if (!prefix) {
    WARN("skipped the permission-denied cases: running as root and setpriv cannot drop CAP_DAC_OVERRIDE here");
    return;
  }
  cfg = run.write_config("run.yaml", "run", {});
  // Norm stats nobody may read: "permission denied", not "file not found".
  REQUIRE(::chmod(run.norm_stats.c_str(), 0) == 0);
  auto r = run_app_process("pi0-train", "--config " + cfg, run.dir, *prefix);
  ::chmod(run.norm_stats.c_str(), 0644);
  check_user_error(r, "pi0-train", "data.norm_stats '" + run.norm_stats + "': permission denied");
  // An HDF5 episode nobody may read: "permission denied", not "not an HDF5 file".
  std::string episode;
  for (const auto& e : fs::directory_iterator(run.dir.str("data"))) episode = e.path().string();
  REQUIRE(::chmod(episode.c_str(), 0) == 0);
  r = run_app_process("pi0-train", "--config " + cfg, run.dir, *prefix);
  ::chmod(episode.c_str(), 0644);
  check_user_error(r, "pi0-train", episode + ": permission denied");
  CHECK_THAT(r.err, !Contains("not an HDF5 file"));
}

TEST_CASE("a checkpoint.asset_id that is not a plain folder name stops pi0-train before anything is written",
          "[integration][app][inputs]") {
  // A one-step run whose every other setting is valid: without the check it trains and its checkpoint's
  // assets/<asset_id>/norm_stats.json lands outside the checkpoint (run/escaped/, or the absolute folder).
  TinyRun run;
  const std::vector<std::string> ids = {"../../../escaped", run.dir.str("abs")};
  for (size_t i = 0; i < ids.size(); ++i) {
    INFO(ids[i]);
    const std::string run_dir = "run" + std::to_string(i);  // one per case: a run left behind cannot mask the next
    const auto cfg = run.write_config(run_dir + ".yaml", run_dir, {"train.num_steps=1"});
    const auto r = run_app_process("pi0-train", "--config " + cfg + " --set checkpoint.asset_id=" + ids[i], run.dir);
    check_user_error(r, "pi0-train", "checkpoint.asset_id must be a plain folder name");
    CHECK(!fs::exists(run.dir.str(run_dir)));
    CHECK(!fs::exists(run.dir.str("abs")));
  }
}

TEST_CASE("a checkpoint.run_dir with a newline stops pi0-train before anything is written",
          "[integration][app][inputs]") {
  // It would split every log line that names the run (issue 23 item 2); YAML's "\n" escape puts a real newline in.
  TinyRun run;
  const auto cfg = run.write_config("run.yaml", "unused", {"train.num_steps=1"});
  const auto r = run_app_process(
      "pi0-train", "--config " + cfg + " --set 'checkpoint.run_dir=\"" + run.dir.str("run") + "\\nsplit\"'", run.dir);
  check_user_error(r, "pi0-train", "checkpoint.run_dir must be a path without control characters");
  CHECK(!fs::exists(run.dir.str("run") + "\nsplit"));
  CHECK(!fs::exists(run.dir.str("unused")));
}

TEST_CASE("pi0-plot --out a character device exits 2 and leaves the device as it was", "[integration][app][inputs]") {
  testing::TempDir dir("pi0plot");
  const auto metrics = dir.str("metrics.jsonl");
  std::ofstream(metrics) << "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"loss\": 1.0}\n";
  const auto device = dir.str("null_device");
  if (::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    WARN("skipped: mknod of a character device is not permitted here");
    return;
  }
  const auto r = run_app_process("pi0-plot", "--metrics " + metrics + " --keys loss --out " + device, dir);
  check_user_error(r, "pi0-plot", device + ": exists and is a character device, not a regular file");
  struct stat st {};
  REQUIRE(::lstat(device.c_str(), &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}
