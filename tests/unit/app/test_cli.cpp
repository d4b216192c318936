// The command-line layer shared by every app: --help/--version, flag errors in the project's wording, and the one
// mapping from what a program throws to its exit code and its one line on stderr.
#include <catch2/catch.hpp>

#include <filesystem>
#include <iostream>
#include <sstream>
#include <system_error>

#include "pi0/app/cli.h"
#include "pi0/common/check.h"
#include "pi0/distributed/process_group.h"
#include "pi0/train/trainer.h"

using Catch::Contains;
using Catch::StartsWith;
using namespace pi0;

namespace {

// Captures std::cout or std::cerr for its lifetime.
class Capture {
 public:
  explicit Capture(std::ostream& s) : stream_(s), old_(s.rdbuf(buf_.rdbuf())) {}
  ~Capture() { stream_.rdbuf(old_); }
  std::string text() const { return buf_.str(); }

 private:
  std::ostream& stream_;
  std::ostringstream buf_;
  std::streambuf* old_;
};

struct Parsed {
  std::optional<int> done;
  std::string out;
  std::string port_text = "8000";
  int64_t port = 8000;
};

// A parser like an app's: a required path, an integer in a range, a choice.
Parsed parse_args(std::vector<const char*> args) {
  Parsed p;
  std::string path, dtype = "f32";
  auto cli = app::make_parser("pi0-demo", "A demo program.");
  cli->add_option("--path", path, "a file to read")->required()->check(app::non_empty());
  cli->add_option("--port", p.port, "TCP port")->check(app::int_in(0, 65535));
  cli->add_option("--dtype", dtype, "precision")->check(app::one_of({"bf16", "f32"}));
  args.insert(args.begin(), "pi0-demo");
  Capture out(std::cout);
  p.done = app::parse(*cli, static_cast<int>(args.size()), args.data());
  p.out = out.text();
  return p;
}

// run_app on a body that throws `e`: (exit code, stderr).
template <class E>
std::pair<int, std::string> run_throwing(const E& e) {
  Capture err(std::cerr);
  const int code = app::run_app("pi0-demo", [&]() -> int { throw e; });
  return {code, err.text()};
}

}  // namespace

TEST_CASE("cli: --help lists every flag with its default, --version names the build", "[unit][app]") {
  auto help = parse_args({"--help"});
  REQUIRE(help.done);
  CHECK(*help.done == 0);
  CHECK_THAT(help.out, Contains("A demo program.") && Contains("--path") && Contains("--port") &&
                           Contains("--dtype") && Contains("--version") && Contains("8000") &&
                           Contains("Exit codes: 0 done, 1 internal error, 2 bad input"));
  auto version = parse_args({"--version"});
  REQUIRE(version.done);
  CHECK(*version.done == 0);
  CHECK_THAT(version.out, StartsWith("pi0-demo ") && Contains("LibTorch " TORCH_VERSION));
  CHECK(app::version_text("pi0-train").find("pi0-train 0.") == 0);
}

TEST_CASE("cli: flags parse, and every mistake is a UserError naming the flag", "[unit][app]") {
  auto ok = parse_args({"--path", "x.yaml", "--port=9000", "--dtype", "bf16"});
  CHECK(!ok.done);
  CHECK(ok.port == 9000);
  REQUIRE_THROWS_AS(parse_args({"--port", "1"}), UserError);
  REQUIRE_THROWS_WITH(parse_args({"--port", "1"}), Contains("--path is required") && Contains("(see --help)"));
  REQUIRE_THROWS_WITH(parse_args({"--path", "x", "--port", "70000"}),
                      Contains("--port: got '70000', expected an integer in [0, 65535]"));
  REQUIRE_THROWS_WITH(parse_args({"--path", "x", "--port", "80a"}),
                      Contains("--port: got '80a', expected an integer in [0, 65535]"));
  REQUIRE_THROWS_WITH(parse_args({"--path", "x", "--dtype", "fp8"}),
                      Contains("--dtype: got 'fp8', expected bf16 or f32"));
  REQUIRE_THROWS_WITH(parse_args({"--path", ""}), Contains("--path: got '', expected a value"));
  REQUIRE_THROWS_WITH(parse_args({"--path", "x", "--frobnicate"}), Contains("unknown argument '--frobnicate'"));
  REQUIRE_THROWS_WITH(parse_args({"--path", "x", "stray"}), Contains("unknown argument 'stray'"));
  REQUIRE_THROWS_WITH(parse_args({"--path"}), Contains("--path"));
  CHECK_THROWS_WITH(app::parse_device("--device", "tpu"),
                    Contains("--device: got 'tpu', expected cpu, cuda or cuda:N"));
  CHECK(app::parse_device("--device", "cpu").is_cpu());
}

TEST_CASE("cli: run_app maps errors to exit codes with one line on stderr", "[unit][app]") {
  {
    Capture err(std::cerr);
    CHECK(app::run_app("pi0-demo", [] { return 0; }) == 0);
    CHECK(err.text().empty());
  }
  auto [user, user_err] = run_throwing(UserError("train.batch_size must be > 0 (got 0)"));
  CHECK(user == app::kExitUserError);
  CHECK(user_err == "pi0-demo: error: train.batch_size must be > 0 (got 0)\n");
  // A multi-line message still makes one line.
  auto [multi, multi_err] = run_throwing(UserError("first\nsecond\n"));
  CHECK(multi == 2);
  CHECK(multi_err == "pi0-demo: error: first; second\n");
  // Permission problems on the user's paths are the user's to fix: exit 2, naming the path.
  auto [perm, perm_err] = run_throwing(std::filesystem::filesystem_error(
      "cannot create directories", "/data/runs/x", std::make_error_code(std::errc::permission_denied)));
  CHECK(perm == app::kExitUserError);
  CHECK_THAT(perm_err, StartsWith("pi0-demo: error: cannot create directories") && Contains("/data/runs/x"));
  CHECK(std::count(perm_err.begin(), perm_err.end(), '\n') == 1);
  auto [fs_other, fs_other_err] = run_throwing(std::filesystem::filesystem_error(
      "cannot copy", "/a", std::make_error_code(std::errc::bad_file_descriptor)));
  CHECK(fs_other == app::kExitInternal);
  CHECK_THAT(fs_other_err, StartsWith("pi0-demo: internal error: "));
  auto [diverged, diverged_err] = run_throwing(train::TrainingError("non-finite loss at step 3 on rank 0"));
  CHECK(diverged == app::kExitDiverged);
  CHECK(diverged_err == "pi0-demo: training stopped: non-finite loss at step 3 on rank 0\n");
  auto [dist, dist_err] = run_throwing(distributed::DistError("rank 1 timed out"));
  CHECK(dist == app::kExitDistributed);
  CHECK_THAT(dist_err, StartsWith("pi0-demo: distributed failure: rank 1 timed out"));
  // A real bug: exit 1, one line, no C++ stack trace (c10::Error's what() carries one).
  int code = -1;
  std::string text;
  {
    Capture err(std::cerr);
    code = app::run_app("pi0-demo", []() -> int {
      PI0_CHECK(false, "bad loader position 0/-3");
      return 0;
    });
    text = err.text();
  }
  CHECK(code == app::kExitInternal);
  CHECK_THAT(text, StartsWith("pi0-demo: internal error: bad loader position 0/-3"));
  CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  CHECK_THAT(text, !Contains("frame #"));
}
