// Damaged checkpoints at resume (issue 11, items 1-4 and 15): a relabelled dtype, a flipped bit, a file from an
// older step, an edited trainer_state.json, NaN in the weights or optimizer state; a newest checkpoint that is a
// symlink loop or unreadable (mode 000); falling back to the newest checkpoint that verifies while leaving the bad
// one untouched, strict mode, keep_last rotation, checkpoints from before manifests, and a save that fails on a full
// disk.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "pi0/common/check.h"
#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/corrupt.h"
#include "support/log_capture.h"
#include "support/skip.h"
#include "support/test_support.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::TinyRun;
namespace fs = std::filesystem;

namespace {

// A tiny run trained to step 6 with complete checkpoints at steps 3 and 6, made once; each test works on a copy.
struct Finished {
  TinyRun run;
  Finished() {
    train::Trainer t(run.config("base", {"train.num_steps=6", "checkpoint.save_interval=3", "checkpoint.keep_last=2"}));
    REQUIRE(t.run() == 6);
  }
  // A copy of the finished run as run_dir `name`; returns its checkpoints/ directory.
  std::string copy(const std::string& name) const {
    fs::copy(run.dir.str("base"), run.dir.str(name), fs::copy_options::recursive);
    return run.dir.str(name) + "/checkpoints";
  }
  // Resumes run `name` to `num_steps`; returns the step reached.
  int64_t resume(const std::string& name, int64_t num_steps, std::vector<std::string> extra = {}) const {
    extra.push_back("train.num_steps=" + std::to_string(num_steps));
    train::RunOptions o;
    o.resume = true;
    train::Trainer t(run.config(name, extra), o);
    return t.run();
  }
  // The error of resuming run `name` in strict mode ("" if it resumes).
  std::string strict_error(const std::string& name) const {
    try {
      resume(name, 6, {"checkpoint.resume_policy=strict"});
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  }
};

const Finished& finished() {
  static Finished f;
  return f;
}

// A float parameter of the tiny model and a same-size dtype label of the other kind or type.
std::pair<std::string, std::string> relabel_of(const std::string& file, const std::string& name) {
  const auto dtype = io::SafetensorsFile(file).info(name).dtype;
  if (dtype == "F32") return {"F32", "I32"};
  REQUIRE(dtype == "BF16");
  return {"BF16", "F16"};
}

void check_verifies(const std::string& dir) {
  const auto m = io::read_manifest(dir);
  REQUIRE(m);
  io::check_manifest(dir, *m);
  io::verify_contents(dir, m);
}

}  // namespace

TEST_CASE("resume: a dtype relabelled in the newest model.safetensors is named, and falls back to the previous one",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("relabel");
  const auto model = ck + "/6/model.safetensors";
  const std::string name = "action_in_proj.weight";
  const auto [from, to] = relabel_of(model, name);
  testing::relabel_dtype(model, name, from, to);
  CHECK_THAT(f.strict_error("relabel"), Contains(model) && Contains("'" + name + "'") && Contains("stored as") &&
                                            Contains("resume_policy=strict"));
  // With the manifest re-hashed after the relabel (or without one), only the dtype rule can catch it: the
  // checkpoint is skipped with the same warning as any other that does not verify (it used to stop the run).
  for (const bool rehash : {true, false}) {
    INFO((rehash ? "manifest re-hashed" : "no manifest"));
    const auto ck2 = f.copy(rehash ? "relabel_rehashed" : "relabel_unlisted");
    const auto model2 = ck2 + "/6/model.safetensors";
    testing::relabel_dtype(model2, name, from, to);
    if (rehash) io::write_manifest(ck2 + "/6", 6, {});
    else fs::remove(ck2 + "/6/manifest.json");
    testing::LogCapture log;
    CHECK(f.resume(rehash ? "relabel_rehashed" : "relabel_unlisted", 3) == 3);  // resumed at step 3
    CHECK_THAT(log.text(), Contains("checkpoint " + ck2 + "/6 does not verify and is skipped (left untouched): " +
                                    model2) && Contains("'" + name + "'") && Contains("stored as") &&
                               Contains("falling back to " + ck2 + "/3"));
    CHECK(io::SafetensorsFile(model2).info(name).dtype == to);  // left as it was
  }
}

TEST_CASE("resume: a checkpoint this run cannot continue (another batch size) falls back with a warning",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("batch");
  // As a checkpoint of a run with a smaller batch size: its loader position lies beyond this run's epoch. The
  // manifest is re-hashed, so the contents verify; only this run's settings rule it out.
  const auto state = ck + "/6/trainer_state.json";
  std::string text = testing::read_bytes(state);
  size_t edited = 0;  // every rank's position (and any legacy copy)
  for (auto at = text.find("\"batch_index\": "); at != std::string::npos; at = text.find("\"batch_index\": ", at + 1)) {
    text.replace(at, text.find_first_of(",\n}", at) - at, "\"batch_index\": 999");
    ++edited;
  }
  REQUIRE(edited > 0);
  testing::write_bytes(state, text);
  io::write_manifest(ck + "/6", 6, {});
  testing::LogCapture log;
  CHECK(f.resume("batch", 3) == 3);
  CHECK_THAT(log.text(), Contains("checkpoint " + ck + "/6 does not verify and is skipped (left untouched)") &&
                             Contains("batch_index") && Contains("train.batch_size changed"));
  CHECK(testing::read_bytes(state) == text);
}

// Issue 32 item 4: the check that this run can continue a checkpoint (world size, epoch length, batch size) ran on
// the first checkpoint picked only. When that one turned out unusable at load (here a flipped bit, found by the
// checksums read alongside the load), the fallback was restored unchecked: step 3, whose loader position lies
// beyond this run's epoch, was loaded and stopped the run with an internal "bad loader position" error.
TEST_CASE("resume: a fallback past a checkpoint found unusable at load is checked against this run too",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("fallback_checked");
  testing::flip_data_bit(ck + "/6/model.safetensors", "action_in_proj.weight");
  const auto state = ck + "/3/trainer_state.json";
  std::string text = testing::read_bytes(state);
  for (auto at = text.find("\"batch_index\": "); at != std::string::npos; at = text.find("\"batch_index\": ", at + 1))
    text.replace(at, text.find_first_of(",\n}", at) - at, "\"batch_index\": 999");
  testing::write_bytes(state, text);
  io::write_manifest(ck + "/3", 3, {});  // its contents verify: only this run's settings rule it out
  testing::LogCapture log;
  std::string error;
  try {
    f.resume("fallback_checked", 6);
  } catch (const UserError& e) {
    error = e.what();
  }
  INFO(log.text());
  CHECK_THAT(error, Contains("none of its 2 complete checkpoints verifies") && Contains(ck + "/6/model.safetensors"));
  CHECK(std::count(error.begin(), error.end(), '\n') == 0);
  CHECK_THAT(log.text(), Contains("checkpoint " + ck + "/6 does not verify and is skipped") &&
                             Contains("checkpoint " + ck + "/3 does not verify and is skipped (left untouched): " +
                                      state + ": field 'rank_loaders[0].batch_index' is 999 but an epoch now has"));
  CHECK_THAT(log.text(), !Contains("falling back to " + ck + "/3"));
  // Strict mode stops at the first one, naming it.
  CHECK_THAT(f.strict_error("fallback_checked"), Contains(ck + "/6") && Contains("not falling back"));
}

TEST_CASE("resume: a newest checkpoint that is a symlink loop is skipped with a warning, not a 'status:' error",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("loop");
  fs::create_symlink("9", ck + "/9");  // checkpoints/9 -> checkpoints/9
  testing::LogCapture log;
  CHECK(f.resume("loop", 6) == 6);  // resumed from step 6: nothing left to do
  CHECK_THAT(log.text(), Contains("checkpoint " + ck + "/9 cannot be read (too many levels of symbolic links") &&
                             Contains("skipped (left untouched)"));
  CHECK(fs::is_symlink(ck + "/9"));
  CHECK(io::complete_checkpoints(fs::path(ck).parent_path().string()) == std::vector<int64_t>{3, 6});
}

TEST_CASE("pi0-train --resume: an unreadable newest checkpoint (mode 000) is skipped with a warning naming it, the "
          "run resumes from the older one and sets it aside when it saves that step again",
          "[integration][app][checkpoint]") {
  if (!testing::apps_built({"pi0-train"})) return;
  // As root (here and in CI) file modes do not bite; the prefix drops the capabilities that bypass them.
  const auto prefix = testing::permission_checked_prefix();
  if (!prefix) {
    testing::skip("running as root and setpriv cannot drop CAP_DAC_OVERRIDE here, so mode 000 cannot be tested");
    return;
  }
  const auto& f = finished();
  const auto ck = f.copy("denied");
  const auto newest = ck + "/6";
  std::map<std::string, std::string> before;  // file → bytes, to check that it is left as it was
  for (const auto& e : fs::recursive_directory_iterator(newest))
    if (e.is_regular_file()) before[e.path().lexically_relative(newest).string()] = testing::read_bytes(e.path().string());
  REQUIRE(!before.empty());
  // The same command as the run that wrote the checkpoints (train.num_steps=6): it trains steps 4-6 again and saves
  // step 6, where the unreadable checkpoint is (swapping it out used to fail: 'cannot remove .tmp_6_<pid>').
  const auto cfg = f.run.write_config("denied.yaml", "denied",
                                      {"train.num_steps=6", "checkpoint.save_interval=3", "checkpoint.keep_last=2"});
  REQUIRE(::chmod(newest.c_str(), 0) == 0);
  const auto r = testing::run_app_process("pi0-train", "--config " + cfg + " --resume", f.run.dir, *prefix);
  const auto aside = newest + ".unverified";
  for (const auto& dir : {newest, aside}) ::chmod(dir.c_str(), 0755);  // whichever holds it now, for the checks
  const auto log = r.out + r.err;
  INFO("exit " << r.code << ", output:\n" << log);
  CHECK(r.code == 0);
  CHECK_THAT(log, Contains("checkpoint " + newest + " cannot be read (permission denied) and is skipped (left "
                           "untouched)"));
  CHECK_THAT(log, Contains("resumed from " + ck + "/3 at step 3"));
  CHECK_THAT(log, Contains("checkpoint of step 6 could not be read (permission denied) at resume; moved to " + aside));
  CHECK_THAT(log, !Contains("pi0-train: error"));
  // Steps 4-6 trained and saved; the unreadable checkpoint kept, byte for byte, under another name.
  CHECK(io::complete_checkpoints(fs::path(ck).parent_path().string()) == std::vector<int64_t>{3, 6});
  CHECK_NOTHROW(check_verifies(newest));
  std::map<std::string, std::string> after;
  for (const auto& e : fs::recursive_directory_iterator(aside))
    if (e.is_regular_file()) after[e.path().lexically_relative(aside).string()] = testing::read_bytes(e.path().string());
  CHECK(after == before);
}

TEST_CASE("resume: a flipped bit, an older model file, an edited trainer_state.json are named (strict)",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  SECTION("flipped data bit") {
    const auto ck = f.copy("bit");
    io::SafetensorsFile opt(ck + "/6/optimizer.safetensors");
    const auto tensor = opt.names().back();
    testing::flip_data_bit(ck + "/6/optimizer.safetensors", tensor);
    CHECK_THAT(f.strict_error("bit"), Contains(ck + "/6/optimizer.safetensors") && Contains("contents differ"));
  }
  SECTION("model.safetensors copied from an older step") {
    const auto ck = f.copy("older");
    fs::copy_file(ck + "/3/model.safetensors", ck + "/6/model.safetensors", fs::copy_options::overwrite_existing);
    CHECK_THAT(f.strict_error("older"),
               Contains(ck + "/6/model.safetensors") && Contains("holds the state of step 3"));
  }
  SECTION("trainer_state.json claiming step 999") {
    const auto ck = f.copy("state");
    std::string text = testing::read_bytes(ck + "/6/trainer_state.json");
    const auto at = text.find("\"step\": 6");
    REQUIRE(at != std::string::npos);
    text.replace(at, 9, "\"step\": 999");
    testing::write_bytes(ck + "/6/trainer_state.json", text);
    CHECK_THAT(f.strict_error("state"), Contains("trainer_state.json") && Contains("says step 999"));
  }
}

TEST_CASE("resume: NaN in the weights or the optimizer state is named at load, not at the first step",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  SECTION("weights") {
    const auto ck = f.copy("nan_w");
    testing::write_nan(ck + "/6/model.safetensors", "action_out_proj.weight", 1);
    CHECK_THAT(f.strict_error("nan_w"), Contains(ck + "/6/model.safetensors") &&
                                            Contains("'action_out_proj.weight'") && Contains("non-finite"));
  }
  SECTION("optimizer state, in a checkpoint from before manifests") {
    const auto ck = f.copy("nan_o");
    fs::remove(ck + "/6/manifest.json");
    const std::string key = "action_out_proj.weight.exp_avg_sq";
    testing::write_nan(ck + "/6/optimizer.safetensors", key);
    try {
      f.resume("nan_o", 6, {"checkpoint.resume_policy=newest_verified"});
    } catch (const UserError&) {
      FAIL("expected a fallback to step 3");
    }
    // Fell back to step 3, trained to 6 again; the NaN checkpoint was set aside, not overwritten.
    CHECK(fs::exists(ck + "/6.unverified/optimizer.safetensors"));
    CHECK_THROWS_WITH(io::verify_contents(ck + "/6.unverified", std::nullopt),
                      Contains("'" + key + "'") && Contains("non-finite"));
    CHECK_NOTHROW(check_verifies(ck + "/6"));
  }
}

TEST_CASE("resume falls back to the newest checkpoint that verifies and leaves the bad one untouched",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("fallback");
  testing::flip_data_bit(ck + "/6/model.safetensors", "action_in_proj.weight");
  std::map<std::string, std::string> before;
  for (const auto& e : fs::recursive_directory_iterator(ck + "/6"))
    if (e.is_regular_file()) before[e.path().string()] = testing::read_bytes(e.path().string());
  CHECK(f.resume("fallback", 3) == 3);  // resumed at step 3: nothing left to do
  std::map<std::string, std::string> after;
  for (const auto& e : fs::recursive_directory_iterator(ck + "/6"))
    if (e.is_regular_file()) after[e.path().string()] = testing::read_bytes(e.path().string());
  CHECK(before == after);
  CHECK(io::complete_checkpoints(fs::path(ck).parent_path().string()) == std::vector<int64_t>{3, 6});
  // Strict mode refuses instead.
  CHECK_THAT(f.strict_error("fallback"), Contains(ck + "/6") && Contains("does not verify") &&
                                             Contains("not falling back"));
}

TEST_CASE("keep_last rotation keeps a verified checkpoint, and a bad one is never overwritten",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("rotate");
  const auto run_dir = fs::path(ck).parent_path().string();
  testing::flip_data_bit(ck + "/6/optimizer.safetensors", io::SafetensorsFile(ck + "/6/optimizer.safetensors").names()[0]);
  const auto bad_bytes = testing::read_bytes(ck + "/6/optimizer.safetensors");
  // keep_last=1 used to keep only the newest (the bad step 6) and delete every checkpoint this run wrote.
  CHECK(f.resume("rotate", 5, {"checkpoint.save_interval=1", "checkpoint.keep_last=1"}) == 5);
  CHECK(io::complete_checkpoints(run_dir) == std::vector<int64_t>{5, 6});
  CHECK_NOTHROW(check_verifies(ck + "/5"));
  CHECK(testing::read_bytes(ck + "/6/optimizer.safetensors") == bad_bytes);
  // Reaching step 6 again: the new checkpoint does not replace the bad one, which is kept aside.
  CHECK(f.resume("rotate", 6, {"checkpoint.save_interval=1", "checkpoint.keep_last=1"}) == 6);
  CHECK(testing::read_bytes(ck + "/6.unverified/optimizer.safetensors") == bad_bytes);
  CHECK_NOTHROW(check_verifies(ck + "/6"));
  CHECK(io::complete_checkpoints(run_dir) == std::vector<int64_t>{6});
}

TEST_CASE("a checkpoint from before manifests resumes with a warning, strict mode refuses it",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("legacy");
  fs::remove(ck + "/6/manifest.json");
  CHECK_THAT(f.strict_error("legacy"), Contains(ck + "/6/manifest.json") && Contains("cannot be verified") &&
                                           Contains("resume_policy"));
  CHECK(f.resume("legacy", 6) == 6);  // resumed at step 6, unverified
}

TEST_CASE("a save that fails (disk full) leaves no .tmp directory and the older checkpoints intact",
          "[integration][train][checkpoint]") {
  const auto& f = finished();
  const auto ck = f.copy("full");
  train::RunOptions o;
  o.resume = true;
  train::Trainer t(f.run.config("full", {"train.num_steps=6"}), o);
  REQUIRE(t.run() == 6);
  // A file size limit makes write() fail with EFBIG, as a full disk fails it with ENOSPC.
  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  auto* old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 16 << 10;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string error;
  try {
    t.save_checkpoint();
  } catch (const std::exception& e) {
    error = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  CHECK_THAT(error, Contains("write failed"));
  for (const auto& e : fs::directory_iterator(ck)) CHECK(e.path().filename().string().rfind(".tmp", 0) != 0);
  CHECK(io::complete_checkpoints(fs::path(ck).parent_path().string()) == std::vector<int64_t>{3, 6});
  CHECK_NOTHROW(check_verifies(ck + "/6"));
}
