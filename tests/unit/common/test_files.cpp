// Hostile paths (issue 23, items 1, 5, 7, 8): every file we write refuses a destination that is not a regular file
// (a rename would replace a device, a FIFO, a socket), every file we read must be a regular file (a FIFO would block,
// /dev/zero would never end), and the errors give the true reason.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/config/config.h"
#include "pi0/data/hdf5_file.h"
#include "pi0/data/norm_stats.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/metrics.h"
#include "pi0/train/plot.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// The file type of `path` without following a link ("" if it does not exist).
std::string type_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return "";
  return file_type_name(st.st_mode);
}

// Runs `f` on a thread whose effective user is nobody (65534), so file modes apply even when the tests run as
// root (Linux credentials are per thread; the raw syscall changes only this one's). The effective uid going from
// 0 to non-zero drops the capabilities that bypass file modes. Returns false when that is impossible here.
bool run_as_nobody(const std::function<void()>& f) {
  if (::geteuid() != 0) {
    f();
    return true;
  }
  bool switched = false;
  std::exception_ptr error;
  std::thread t([&] {
    switched = ::syscall(SYS_setresuid, -1, 65534, -1) == 0;
    if (!switched) return;
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  });
  t.join();
  if (error) std::rethrow_exception(error);
  return switched;
}

}  // namespace

TEST_CASE("files: every writer refuses a destination that is a device, a FIFO or a directory", "[unit][common][inputs]") {
  testing::TempDir dir("pi0files");
  const std::string fifo = dir.str("fifo"), device = dir.str("null_device"), folder = dir.str("folder");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  REQUIRE(fs::create_directory(folder));
  // A character device like /dev/null (1, 3): writing to it works, so a writer that does not check replaces it.
  const bool have_device = ::mknod(device.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0;
  if (!have_device) WARN("mknod of a character device is not permitted here: only the FIFO and directory cases run");
  std::vector<std::string> targets = {fifo, folder};
  if (have_device) targets.push_back(device);

  const auto tensors = std::vector<std::pair<std::string, torch::Tensor>>{{"actions", torch::zeros({2, 3})}};
  data::NormStats stats;
  stats.keys["state"].mean = {0.0};
  stats.keys["state"].std = {1.0};
  struct Writer {
    std::string name;
    std::function<void(const std::string&)> write;
    bool blocks_on_fifo_before;  // wrote without a temporary file: opening a FIFO blocked (no reader)
  };
  const std::vector<Writer> writers = {
      {"save_safetensors (pi0-infer --out, checkpoints, bundles)",
       [&](const std::string& p) { io::save_safetensors(p, tensors); }, false},
      {"write_file_atomic (config.yaml, trainer_state.json, manifests)",
       [&](const std::string& p) { write_file_atomic(p, "text\n"); }, false},
      {"save_norm_stats (pi0-norm-stats --out)", [&](const std::string& p) { data::save_norm_stats(stats, p); }, true},
      {"write_png (pi0-plot --out)", [&](const std::string& p) { train::write_png(p, train::Canvas(4, 4)); }, true},
      {"MetricsWriter (metrics.jsonl)", [&](const std::string& p) { train::MetricsWriter w(p); }, true},
  };
  for (const auto& w : writers) {
    for (const auto& target : targets) {
      if (target == fifo && w.blocks_on_fifo_before) continue;  // the device case covers these without hanging
      INFO(w.name << " -> " << target);
      const auto type = type_of(target);
      CHECK_THROWS_WITH(w.write(target), Contains(target + ": exists and is " + type) &&
                                             Contains("not a regular file; refusing to write over it"));
      CHECK(type_of(target) == type);  // still what it was
      CHECK(!fs::exists(target + ".tmp"));
    }
  }
  // A regular file (and a missing one) is written as before.
  CHECK_NOTHROW(io::save_safetensors(dir.str("actions.safetensors"), tensors));
  CHECK_NOTHROW(io::save_safetensors(dir.str("actions.safetensors"), tensors));
  CHECK(type_of(dir.str("actions.safetensors")) == "a regular file");
  // The manifest writer goes through write_file_atomic too: manifest.json a FIFO in the directory.
  const std::string mdir = dir.str("ckpt");
  fs::create_directory(mdir);
  REQUIRE(::mkfifo((mdir + "/" + io::kManifestFile).c_str(), 0644) == 0);
  CHECK_THROWS_WITH(io::write_manifest(mdir, 1, {}), Contains("manifest.json: exists and is a FIFO (named pipe)"));
}

TEST_CASE("files: inputs must be regular files: a FIFO, /dev/zero or a directory is refused at once, naming why",
          "[unit][common][inputs]") {
  testing::TempDir dir("pi0files");
  const std::string fifo = dir.str("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  CHECK(input_file_problem(fifo) == "is a FIFO (named pipe), not a regular file");
  CHECK(input_file_problem("/dev/zero") == "is a character device, not a regular file");
  CHECK(input_file_problem(dir.str()) == "is a directory, not a regular file");
  CHECK(input_file_problem(dir.str("missing")) == "file not found");
  std::ofstream(dir.str("ok.txt")) << "x";
  CHECK(input_file_problem(dir.str("ok.txt")).empty());
  // A symlink loop says so.
  fs::create_symlink(dir.str("loop"), dir.str("loop"));
  CHECK_THAT(input_file_problem(dir.str("loop")), Contains("symbolic links"));
  CHECK_THROWS_WITH(require_input_file(fifo, "data.tokenizer", "a sentencepiece model file"),
                    "data.tokenizer '" + fifo + "': is a FIFO (named pipe), not a regular file; expected a "
                    "sentencepiece model file");

  // The readers (each used to block on the FIFO, or read /dev/zero until memory ran out).
  CHECK_THROWS_WITH(config::load_config(fifo), Contains("config file '" + fifo + "': is a FIFO"));
  CHECK_THROWS_WITH(data::Tokenizer(fifo), Contains(fifo + ": is a FIFO"));
  CHECK_THROWS_WITH(data::Tokenizer("/dev/zero"), Contains("/dev/zero: is a character device"));
  CHECK_THROWS_WITH(data::load_norm_stats(fifo), Contains(fifo + ": is a FIFO"));
  CHECK_THROWS_WITH(data::load_norm_stats(dir.str()), Contains(": is a directory"));
  CHECK_THROWS_WITH(data::H5File::open(fifo), Contains(fifo + ": is a FIFO"));
  CHECK_THROWS_WITH(io::SafetensorsFile(fifo), Contains(fifo + ": cannot open safetensors file (is a FIFO"));
  CHECK_THROWS_WITH(io::SafetensorsFile("/dev/zero"), Contains("is a character device"));
}

TEST_CASE("files: an unreadable file is reported as permission denied, not as missing or malformed",
          "[unit][common][inputs]") {
  testing::TempDir dir("pi0files");
  ::chmod(dir.str().c_str(), 0755);  // nobody may enter the directory, not read the files
  // An HDF5 file and norm stats nobody may read.
  const std::string h5 = dir.str("episode.hdf5"), stats = dir.str("norm_stats.json");
  { data::H5File::create(h5); }
  data::NormStats s;
  s.keys["state"].mean = {0.0};
  s.keys["state"].std = {1.0};
  data::save_norm_stats(s, stats);
  REQUIRE(::chmod(h5.c_str(), 0) == 0);
  REQUIRE(::chmod(stats.c_str(), 0) == 0);
  std::string h5_error, stats_error, problem;
  const bool ran = run_as_nobody([&] {
    problem = input_file_problem(h5);
    try {
      data::H5File::open(h5);
    } catch (const UserError& e) {
      h5_error = e.what();
    }
    try {
      data::load_norm_stats(stats);
    } catch (const UserError& e) {
      stats_error = e.what();
    }
  });
  if (!ran) {
    WARN("skipped: running as root and a thread cannot switch to the user nobody here");
    return;
  }
  CHECK(problem == "permission denied");
  CHECK_THAT(h5_error, Contains(h5 + ": permission denied") && !Contains("not an HDF5 file"));
  CHECK_THAT(stats_error, Contains(stats + ": permission denied") && !Contains("not found"));
}

TEST_CASE("files: create_directories_or_throw names the directory, the component in the way and the reason",
          "[unit][common][inputs]") {
  testing::TempDir dir("pi0files");
  std::ofstream(dir.str("file")) << "x";
  CHECK_THROWS_WITH(create_directories_or_throw(dir.str("file/runs/a"), "checkpoint.run_dir"),
                    "checkpoint.run_dir '" + dir.str("file/runs/a") + "': cannot create directories ('" +
                        dir.str("file") + "' is a regular file)");
  CHECK_NOTHROW(create_directories_or_throw(dir.str("x/y/z"), "checkpoint.run_dir"));
  CHECK(fs::is_directory(dir.str("x/y/z")));
  CHECK_NOTHROW(create_directories_or_throw(dir.str("x/y/z"), "checkpoint.run_dir"));  // exists: fine
  // Permission denied, named as such (as nobody: root may write anywhere).
  ::chmod(dir.str().c_str(), 0755);
  std::string error;
  const bool ran = run_as_nobody([&] {
    try {
      create_directories_or_throw(dir.str("p/q"), "--out");
    } catch (const UserError& e) {
      error = e.what();
    }
  });
  if (!ran) {
    WARN("skipped the permission case: a thread cannot switch to the user nobody here");
    return;
  }
  CHECK(error == "--out '" + dir.str("p/q") + "': cannot create directories ('" + dir.str("p") +
                     "': permission denied)");
}
