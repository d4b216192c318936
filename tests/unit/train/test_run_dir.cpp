// Checkpoint directories (incomplete ones ignored, pruning, crash safety), stop signals, metrics JSONL and the
// PNG plot (valid signature/IHDR, non-blank pixels, the pi0-plot app end to end).
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "pi0/common/check.h"
#include "pi0/io/checkpoint_dir.h"
#include "pi0/train/checkpointer.h"
#include "pi0/train/metrics.h"
#include "pi0/train/plot.h"
#include "pi0/train/signals.h"
#include "support/app_process.h"
#include "support/log_capture.h"
#include "support/test_support.h"

using namespace pi0;
using namespace pi0::train;
using namespace pi0::io;  // checkpoint_dir.h
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {
void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p) << text;
}
std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
std::string save(const std::string& run, int64_t step, const std::string& payload) {
  auto tmp = begin_checkpoint(run, step);
  write_file(fs::path(tmp) / "model.safetensors", payload);
  fs::create_directories(fs::path(tmp) / "assets");
  write_file(fs::path(tmp) / "assets" / "norm_stats.json", "{}");
  return commit_checkpoint(tmp, run, step);
}
}  // namespace

TEST_CASE("checkpoint commit, newest complete, incomplete dirs ignored", "[unit][train]") {
  testing::TempDir dir("pi0ckpt");
  const auto run = dir.str();
  CHECK_FALSE(newest_complete_checkpoint(run).has_value());
  const auto path = save(run, 100, "a");
  CHECK(path == (fs::path(run) / "checkpoints" / "100").string());
  CHECK(fs::exists(fs::path(path) / kCompleteMarker));
  CHECK(read_file(fs::path(path) / "model.safetensors") == "a");
  // A numeric dir without COMPLETE (crash inside a non-atomic writer) and a later tmp dir are both ignored.
  fs::create_directories(fs::path(run) / "checkpoints" / "300");
  write_file(fs::path(run) / "checkpoints" / "300" / "model.safetensors", "partial");
  auto tmp = begin_checkpoint(run, 400);
  CHECK(fs::path(tmp).filename().string().rfind(".tmp_400_", 0) == 0);
  auto newest = newest_complete_checkpoint(run);
  REQUIRE(newest.has_value());
  CHECK(newest->first == 100);
  CHECK(newest->second == path);
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{100});
}

TEST_CASE("a crash between writing and renaming leaves the previous checkpoint usable", "[unit][train]") {
  testing::TempDir dir("pi0ckpt");
  const auto run = dir.str();
  save(run, 100, "old");
  // Crash while writing step 200: files written, never committed.
  auto tmp = begin_checkpoint(run, 200);
  write_file(fs::path(tmp) / "model.safetensors", "new but unfinished");
  CHECK(newest_complete_checkpoint(run)->first == 100);
  // Crash after COMPLETE was written but before the rename: still a dot-directory, still ignored.
  write_file(fs::path(tmp) / kCompleteMarker, "step 200\n");
  CHECK(newest_complete_checkpoint(run)->first == 100);
  CHECK(read_file(fs::path(newest_complete_checkpoint(run)->second) / "model.safetensors") == "old");
  // Restart (another pid in reality): stale temp dirs are cleaned up, except this process's own.
  fs::create_directories(fs::path(run) / "checkpoints" / ".tmp_200_999999999");
  auto removed = remove_stale_temp_checkpoints(run);
  CHECK(removed == std::vector<std::string>{".tmp_200_999999999"});
  CHECK(fs::exists(tmp));
}

TEST_CASE("re-saving the same step replaces it", "[unit][train]") {
  testing::TempDir dir("pi0ckpt");
  const auto run = dir.str();
  save(run, 100, "first");
  const auto path = save(run, 100, "second");
  CHECK(read_file(fs::path(path) / "model.safetensors") == "second");
  std::set<std::string> entries;
  for (const auto& e : fs::directory_iterator(fs::path(run) / "checkpoints")) entries.insert(e.path().filename());
  CHECK(entries == std::set<std::string>{"100"});
}

TEST_CASE("pruning keeps the newest keep_last and every keep_period multiple", "[unit][train]") {
  testing::TempDir dir("pi0ckpt");
  const auto run = dir.str();
  for (int64_t s : {1000, 2000, 3000, 4000, 5000, 6000, 7000}) save(run, s, "x");
  fs::create_directories(fs::path(run) / "checkpoints" / "1500");  // incomplete: never touched
  auto deleted = prune_checkpoints(run, 2, 5000);
  CHECK(deleted == std::vector<int64_t>{1000, 2000, 3000, 4000});
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{5000, 6000, 7000});
  CHECK(fs::exists(fs::path(run) / "checkpoints" / "1500"));
  // keep_last 0 and no period: only the newest complete one survives.
  CHECK(prune_checkpoints(run, 0, 0) == std::vector<int64_t>{5000, 6000});
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{7000});
}

TEST_CASE("pruning a symlinked checkpoint removes the link, never what it points to", "[unit][train]") {
  testing::TempDir dir("pi0ckpt");
  const auto run = dir.str("run");
  // Step 5 lives elsewhere (a copy kept on another disk) and is linked into the run's checkpoints.
  save(dir.str("other"), 5, "kept");
  const auto target = fs::path(dir.str("other")) / "checkpoints" / "5";
  fs::create_directories(fs::path(run) / "checkpoints");
  fs::create_directory_symlink(target, fs::path(run) / "checkpoints" / "5");
  for (int64_t s : {10, 20}) save(run, s, "x");
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{5, 10, 20});
  CHECK(prune_checkpoints(run, 1, 0) == std::vector<int64_t>{5, 10});
  CHECK_FALSE(fs::exists(fs::path(run) / "checkpoints" / "5"));
  CHECK_FALSE(fs::is_symlink(fs::path(run) / "checkpoints" / "5"));
  // The copy is whole: its marker, its weights and its assets.
  CHECK(fs::is_regular_file(target / kCompleteMarker));
  CHECK(read_file(target / "model.safetensors") == "kept");
  CHECK(fs::is_regular_file(target / "assets" / "norm_stats.json"));
  CHECK(complete_checkpoints(dir.str("other")) == std::vector<int64_t>{5});
}

TEST_CASE("pruning never deletes or counts checkpoints that failed verification and keeps the newest verified",
          "[unit][train]") {
  testing::TempDir dir("pi0ckpt");
  const auto run = dir.str();
  for (int64_t s : {10, 20, 30, 40}) save(run, s, "x");
  // 40 failed verification; 10 was resumed from (verified) and 20, 30 were written since.
  CHECK(prune_checkpoints(run, 1, 0, /*bad=*/{40}, /*verified=*/{10, 20, 30}) == std::vector<int64_t>{10, 20});
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{30, 40});
  // Only the verified one is kept besides the bad one, even with newer checkpoints of unknown state.
  save(run, 35, "x");
  CHECK(prune_checkpoints(run, 1, 0, {40}, {30}) == std::vector<int64_t>{});
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{30, 35, 40});
  // A bad checkpoint is moved aside, never overwritten, when its step is saved again.
  const auto aside = set_aside_checkpoint(run, 40);
  CHECK(aside == (fs::path(run) / "checkpoints" / "40.unverified").string());
  CHECK(read_file(fs::path(aside) / "model.safetensors") == "x");
  save(run, 40, "y");
  CHECK(set_aside_checkpoint(run, 40) == (fs::path(run) / "checkpoints" / "40.unverified_1").string());
  CHECK(complete_checkpoints(run) == std::vector<int64_t>{30, 35});
  CHECK(remove_stale_temp_checkpoints(run).empty());  // set-aside directories are not temporary
  CHECK(fs::exists(aside));
}

// Issue 32 item 9: rotation deleted a checkpoint by removing COMPLETE first; a kill -9 before the files went left a
// <step>/ without the marker, which every later start leaves alone (it may be foreign): a whole checkpoint leaked
// for good. Here a child process runs the rotation and dies (_exit, as a kill would) at the k-th deletion point, for
// every k; the next start (Checkpointer::open_run_dir) and the next rotation must leave exactly the kept checkpoint
// and the foreign directory. Before the fix, a death after the marker's removal left checkpoints/2/ forever.
TEST_CASE("a kill at any point of a rotation's deletion leaks no checkpoint, and foreign directories stay",
          "[unit][train][checkpoint]") {
  int points = 0;  // deletion points the rotation passes when nothing kills it
  for (int k = 1;; ++k) {
    INFO("killed at deletion point " << k);
    testing::TempDir dir("pi0ckpt");
    const auto run = dir.str("run");
    save(run, 2, "old");
    save(run, 4, "new");
    const auto ckpts = fs::path(run) / "checkpoints";
    fs::create_directories(ckpts / "7");  // foreign: no COMPLETE, not ours
    write_file(ckpts / "7" / "notes.txt", "keep me");
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      set_deletion_fault_hook([k, n = 0](DeletionPoint) mutable {
        if (++n == k) ::_exit(0);
      });
      prune_checkpoints(run, /*keep_last=*/1, /*keep_period=*/0);
      ::_exit(3);  // the deletion passed fewer than k points
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    const bool finished = WEXITSTATUS(status) == 3;
    if (!finished) REQUIRE(WEXITSTATUS(status) == 0);
    // The next start, then its first rotation.
    const bool was_renamed = fs::exists(ckpts / ".deleting_2");
    testing::LogCapture log;
    train::Checkpointer(config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml",
                                            {"checkpoint.run_dir=" + run}),
                        0, 1, nullptr)
        .open_run_dir();
    CHECK_FALSE(fs::exists(ckpts / ".deleting_2"));
    if (was_renamed) {
      CHECK_THAT(log.text(), Contains("removed 1 checkpoint(s) whose deletion an earlier run did not finish: .deleting_2"));
    }
    prune_checkpoints(run, 1, 0);
    std::set<std::string> entries;
    for (const auto& e : fs::directory_iterator(ckpts)) entries.insert(e.path().filename().string());
    CHECK(entries == std::set<std::string>{"4", "7"});
    CHECK(read_file(ckpts / "7" / "notes.txt") == "keep me");
    CHECK(read_file(ckpts / "4" / "model.safetensors") == "new");
    if (finished) {
      points = k - 1;
      break;
    }
  }
  set_deletion_fault_hook({});
  // Before the rename, after it, once it is on disk, and after each of the checkpoint's 3 entries.
  CHECK(points == 6);
}

TEST_CASE("SIGTERM sets the stop flag and re-arms the default action", "[unit][train]") {
  reset_stop_request();
  install_stop_signal_handlers();
  CHECK_FALSE(stop_requested());
  ::raise(SIGTERM);
  CHECK(stop_requested());
  CHECK(stop_signal() == SIGTERM);
  struct sigaction now;
  sigaction(SIGINT, nullptr, &now);
  CHECK(now.sa_handler == SIG_DFL);  // a second signal would terminate the process
  sigaction(SIGTERM, nullptr, &now);
  CHECK(now.sa_handler == SIG_DFL);
  uninstall_stop_signal_handlers();
  reset_stop_request();
  CHECK_FALSE(stop_requested());
}

TEST_CASE("metrics JSONL: one object per line, resume drops later steps, truncated lines skipped",
          "[unit][train]") {
  testing::TempDir dir("pi0metrics");
  const auto path = dir.str("run/metrics.jsonl");
  {
    MetricsWriter w(path);
    for (int64_t s = 0; s < 5; ++s) w.write(s, {{"loss", 1.0 / (s + 1)}, {"lr", 1e-4}});
  }
  std::ofstream(path, std::ios::app) << "{\"step\": 5, \"loss\"";  // crash mid-line
  auto records = read_metrics(path);
  REQUIRE(records.size() == 5);
  CHECK(records[2]["loss"].get<double>() == Approx(1.0 / 3));
  {
    MetricsWriter w(path, 3);  // resumed from the checkpoint at step 3
    w.write(nlohmann::json{{"step", 3}, {"loss", 0.1}});
  }
  records = read_metrics(path);
  REQUIRE(records.size() == 4);
  CHECK(records[3]["loss"].get<double>() == Approx(0.1));
  CHECK_THROWS_WITH(read_metrics(dir.str("missing.jsonl")), Contains("cannot read metrics file"));
}

namespace {
uint32_t be32(const std::vector<uint8_t>& b, size_t i) {
  return (uint32_t(b[i]) << 24) | (uint32_t(b[i + 1]) << 16) | (uint32_t(b[i + 2]) << 8) | b[i + 3];
}
// Checks signature, IHDR and CRCs; returns the decoded RGB pixels (filter bytes removed).
std::vector<uint8_t> decode_png(const std::vector<uint8_t>& png, uint32_t& w, uint32_t& h) {
  const std::vector<uint8_t> sig = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  REQUIRE(png.size() > 33);
  REQUIRE(std::equal(sig.begin(), sig.end(), png.begin()));
  REQUIRE(std::string(png.begin() + 12, png.begin() + 16) == "IHDR");
  w = be32(png, 16), h = be32(png, 20);
  CHECK(png[24] == 8);
  CHECK(png[25] == 2);
  std::vector<uint8_t> idat;
  size_t pos = 8;
  bool end = false;
  while (pos + 12 <= png.size()) {
    const uint32_t len = be32(png, pos);
    const std::string type(png.begin() + pos + 4, png.begin() + pos + 8);
    CHECK(crc32(0, png.data() + pos + 4, len + 4) == be32(png, pos + 8 + len));
    if (type == "IDAT") idat.insert(idat.end(), png.begin() + pos + 8, png.begin() + pos + 8 + len);
    if (type == "IEND") end = true;
    pos += 12 + len;
  }
  CHECK(end);
  std::vector<uint8_t> raw(size_t(h) * (1 + 3 * w));
  uLongf raw_size = raw.size();
  REQUIRE(uncompress(raw.data(), &raw_size, idat.data(), idat.size()) == Z_OK);
  REQUIRE(raw_size == raw.size());
  std::vector<uint8_t> rgb;
  for (uint32_t y = 0; y < h; ++y) {
    CHECK(raw[y * (1 + 3 * w)] == 0);
    rgb.insert(rgb.end(), raw.begin() + y * (1 + 3 * w) + 1, raw.begin() + (y + 1) * (1 + 3 * w));
  }
  return rgb;
}
size_t count_color(const std::vector<uint8_t>& rgb, Rgb c) {
  size_t n = 0;
  for (size_t i = 0; i + 2 < rgb.size(); i += 3) n += rgb[i] == c.r && rgb[i + 1] == c.g && rgb[i + 2] == c.b;
  return n;
}
// Panels drawn: each frame's top and bottom edge is a row with a run of the axis colour over half the width.
int count_panels(const std::vector<uint8_t>& rgb, uint32_t w) {
  int edges = 0;
  for (size_t y = 0; y < rgb.size() / (3 * w); ++y) {
    uint32_t run = 0, longest = 0;
    for (uint32_t x = 0; x < w; ++x) {
      const uint8_t* p = rgb.data() + (y * w + x) * 3;
      run = (p[0] == 40 && p[1] == 40 && p[2] == 40) ? run + 1 : 0;
      longest = std::max(longest, run);
    }
    edges += longest > w / 2;
  }
  return edges / 2;
}
// Runs pi0-plot on `metrics` with `flags` into a PNG; its decoded pixels.
std::vector<uint8_t> run_pi0_plot(const testing::TempDir& dir, const std::string& metrics, const std::string& flags,
                                  uint32_t& w, uint32_t& h) {
  const std::string cmd = testing::app_dir() + "/pi0-plot --metrics " + metrics + " --out " + dir.str("plot.png") +
                          " " + flags + " > /dev/null";
  REQUIRE(std::system(cmd.c_str()) == 0);
  std::ifstream in(dir.str("plot.png"), std::ios::binary);
  return decode_png(std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), {}), w, h);
}
}  // namespace

TEST_CASE("plot: valid, non-blank PNG with both curves", "[unit][train]") {
  PlotSeries loss{"loss", {}, {}, {31, 119, 180}}, lr{"learning rate", {}, {}, {214, 39, 40}};
  for (int s = 0; s <= 200; s += 10) {
    loss.x.push_back(s), loss.y.push_back(1.0 / (1 + 0.05 * s));
    lr.x.push_back(s), lr.y.push_back(2.5e-5 * std::min(1.0, s / 50.0));
  }
  const auto png = encode_png(plot_panels({loss, lr}, 640, 480, "step"));
  uint32_t w = 0, h = 0;
  const auto rgb = decode_png(png, w, h);
  CHECK(w == 640);
  CHECK(h == 480);
  CHECK(count_color(rgb, {255, 255, 255}) < size_t(w) * h);  // not blank
  CHECK(count_color(rgb, loss.color) > 200);
  CHECK(count_color(rgb, lr.color) > 200);
  CHECK(nice_ticks(0, 1, 5) == std::vector<double>{0, 0.25, 0.5, 0.75, 1.0});
}

TEST_CASE("pi0-plot draws a metrics file", "[unit][train]") {
  testing::TempDir dir("pi0plot");
  {
    MetricsWriter w(dir.str("metrics.jsonl"));
    for (int64_t s = 0; s < 50; ++s) w.write(s, {{"loss", 1.0 / (s + 1)}, {"lr", 1e-4 * s}});
  }
  uint32_t w = 0, h = 0;
  const auto rgb = run_pi0_plot(dir, dir.str("metrics.jsonl"), "--width 500 --height 400", w, h);
  CHECK(w == 500);
  CHECK(h == 400);
  CHECK(count_color(rgb, {31, 119, 180}) > 100);
  CHECK(count_panels(rgb, w) == 2);  // loss and lr; no validation records, no validation panel
  const std::string bad = testing::app_dir() + "/pi0-plot --metrics x --out y --bogus 1 2> /dev/null";
  CHECK(std::system(bad.c_str()) != 0);
}

TEST_CASE("pi0-plot draws validation records: val_loss over the loss, val_action_mse in a panel", "[unit][train]") {
  // What a run with data.validation_split writes: training records every step, validation records (separate lines)
  // every train.val_interval steps.
  testing::TempDir dir("pi0plot");
  const std::string metrics = dir.str("metrics.jsonl");
  {
    MetricsWriter w(metrics);
    for (int64_t s = 1; s <= 100; ++s) {
      w.write(s, {{"loss", 1.0 / s}, {"lr", 1e-4}});
      if (s % 25 == 0) w.write(s, {{"val_loss", 2.0 / s}, {"val_action_mse", 0.5 / s}});
    }
  }
  const Rgb val_color{255, 127, 14};
  uint32_t w = 0, h = 0;
  const auto rgb = run_pi0_plot(dir, metrics, "--width 600 --height 700", w, h);
  CHECK(count_panels(rgb, w) == 3);  // loss with val_loss over it, val_action_mse, lr
  CHECK(count_color(rgb, val_color) > 100);
  // --keys draws what it names, nothing more.
  const auto chosen = run_pi0_plot(dir, metrics, "--width 600 --height 700 --keys loss,lr", w, h);
  CHECK(count_panels(chosen, w) == 2);
  CHECK(count_color(chosen, val_color) == 0);
}

TEST_CASE("pi0-plot draws a mixture's per-dataset validation lines beside the aggregate, a colour per dataset",
          "[unit][train]") {
  testing::TempDir dir("pi0plot");
  const std::string metrics = dir.str("metrics.jsonl");
  {
    MetricsWriter w(metrics);
    for (int64_t s = 1; s <= 100; ++s) {
      w.write(s, {{"loss", 1.0 / s}, {"lr", 1e-4}});
      if (s % 25 == 0) {
        w.write(s, {{"val_loss", 2.0 / s}, {"val_action_mse", 0.5 / s}, {"val_loss/near", 1.5 / s},
                    {"val_loss/far", 3.0 / s}, {"val_action_mse/near", 0.4 / s}, {"val_action_mse/far", 0.7 / s}});
      }
    }
  }
  // pi0-plot's dataset colours, in the order the datasets first appear in the file (keys sorted: far, near).
  const Rgb first{23, 190, 207}, second{188, 189, 34};
  uint32_t w = 0, h = 0;
  const auto rgb = run_pi0_plot(dir, metrics, "--width 600 --height 700", w, h);
  CHECK(count_panels(rgb, w) == 3);  // no panel of their own: lines in the val_loss and val_action_mse panels
  CHECK(count_color(rgb, first) > 100);
  CHECK(count_color(rgb, second) > 100);
  const auto chosen = run_pi0_plot(dir, metrics, "--width 600 --height 700 --keys loss,lr", w, h);
  CHECK(count_color(chosen, first) == 0);
  CHECK(count_color(chosen, second) == 0);
}

TEST_CASE("pi0-plot draws a knowledge-insulation run's loss parts, each in a panel", "[unit][train][ki]") {
  // What a train.ki run writes (MetricsProcessor::add_ki): ce_fast, flow_loss and fast_acc beside the loss.
  testing::TempDir dir("pi0plot");
  const std::string metrics = dir.str("metrics.jsonl");
  {
    MetricsWriter w(metrics);
    for (int64_t s = 1; s <= 100; ++s) {
      w.write(s, {{"loss", 11.0 / s}, {"ce_fast", 1.0 / s}, {"flow_loss", 1.0 / s}, {"fast_acc", 0.01 * s},
                  {"lr", 1e-4}});
    }
  }
  uint32_t w = 0, h = 0;
  const auto rgb = run_pi0_plot(dir, metrics, "--width 600 --height 900", w, h);
  CHECK(count_panels(rgb, w) == 5);  // loss, ce_fast, flow_loss, fast_acc, lr
  const auto chosen = run_pi0_plot(dir, metrics, "--width 600 --height 900 --keys loss,lr", w, h);
  CHECK(count_panels(chosen, w) == 2);
}
