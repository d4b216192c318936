// pi0::posix_fs: the file-system operations we use instead of std::filesystem's (whose copies in pip's LibTorch
// crashed, issue 22). Removal never follows a link (issue 23: a symlinked checkpoint's target stays intact).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "pi0/common/fs.h"
#include "support/skip.h"
#include "support/test_support.h"

namespace fs = pi0::posix_fs;
using Catch::Matchers::Contains;

namespace {
void write(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string read(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
template <class Listing>
std::vector<std::string> names(const fs::path& root, const Listing& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e.path().string().substr(root.string().size() + 1));
  return out;
}
}  // namespace

TEST_CASE("posix_fs remove_all removes links, never what they point to", "[unit][common]") {
  pi0::testing::TempDir dir("pi0fs");
  const fs::path outside = dir.path() / "outside";
  fs::create_directories(outside / "sub");
  write(outside / "COMPLETE", "");
  write(outside / "sub" / "model.safetensors", "weights");

  const fs::path tree = dir.path() / "tree";
  fs::create_directories(tree / "a" / "b");
  write(tree / "a" / "b" / "f", "x");
  write(tree / "g", "y");
  REQUIRE(::symlink(outside.c_str(), (tree / "a" / "link_dir").c_str()) == 0);
  REQUIRE(::symlink((outside / "COMPLETE").c_str(), (tree / "link_file").c_str()) == 0);
  REQUIRE(::symlink("/nonexistent/target", (tree / "dangling").c_str()) == 0);
  // 2 dirs + 2 files + 3 links inside, and the tree itself.
  CHECK(fs::remove_all(tree) == 8);
  CHECK_FALSE(fs::exists(tree));
  CHECK(fs::is_regular_file(outside / "COMPLETE"));
  CHECK(read(outside / "sub" / "model.safetensors") == "weights");

  // A link at the top (a symlinked checkpoint) goes as a link, also when named with a trailing separator.
  const fs::path top = dir.path() / "5";
  REQUIRE(::symlink(outside.c_str(), top.c_str()) == 0);
  CHECK(fs::is_symlink(top));
  CHECK(fs::remove_all(top) == 1);
  CHECK_FALSE(fs::is_symlink(top));
  REQUIRE(::symlink(outside.c_str(), top.c_str()) == 0);
  CHECK(fs::remove_all(top.string() + "/") == 1);
  CHECK_FALSE(fs::is_symlink(top));
  CHECK(fs::is_regular_file(outside / "COMPLETE"));
  CHECK(fs::is_regular_file(outside / "sub" / "model.safetensors"));

  // Missing: nothing to do, no error (as std). "dir/" removes the directory itself.
  std::error_code ec;
  CHECK(fs::remove_all(dir.path() / "missing", ec) == 0);
  CHECK_FALSE(ec);
  CHECK(fs::remove_all(outside.string() + "/") == 4);
  CHECK_FALSE(fs::exists(outside));
}

TEST_CASE("posix_fs remove_all reports what it cannot remove", "[unit][common]") {
  pi0::testing::TempDir dir("pi0fs");
  // A name longer than the filesystem allows fails for every user (root included): the error comes back.
  const fs::path bad = dir.path() / std::string(300, 'x');
  std::error_code ec;
  CHECK(fs::remove_all(bad, ec) == static_cast<uint64_t>(-1));
  CHECK(ec == std::errc::filename_too_long);
  CHECK_THROWS_WITH(fs::remove_all(bad), Contains("cannot remove '" + bad.string() + "'"));
}

TEST_CASE("posix_fs remove_all reports a directory it may not empty", "[unit][common]") {
  if (::geteuid() == 0) {
    pi0::testing::skip("running as root: permissions do not stop removal");
    return;
  }
  pi0::testing::TempDir dir("pi0fs");
  std::error_code ec;
  const fs::path locked = dir.path() / "locked";
  fs::create_directories(locked / "inner");
  write(locked / "inner" / "f", "x");
  REQUIRE(::chmod((locked / "inner").c_str(), 0500) == 0);
  CHECK(fs::remove_all(locked, ec) == static_cast<uint64_t>(-1));
  CHECK(ec == std::errc::permission_denied);
  CHECK_THROWS_WITH(fs::remove_all(locked), Contains("cannot remove '" + locked.string() + "'") &&
                                                Contains("Permission denied"));
  ::chmod((locked / "inner").c_str(), 0700);
}

TEST_CASE("posix_fs create_directories, remove, rename, copy_file", "[unit][common]") {
  pi0::testing::TempDir dir("pi0fs");
  const fs::path deep = dir.path() / "a" / "b" / "c";
  CHECK(fs::create_directories(deep));
  CHECK(fs::is_directory(deep));
  CHECK_FALSE(fs::create_directories(deep));  // exists: fine, nothing created
  CHECK_FALSE(fs::create_directories(dir.str("a/b/") + "/"));
  write(dir.path() / "file", "data");
  std::error_code ec;
  fs::create_directories(dir.path() / "file" / "sub", ec);
  CHECK(ec == std::errc::not_a_directory);
  fs::create_directories(dir.path() / "file", ec);
  CHECK(ec == std::errc::file_exists);
  CHECK_THROWS_AS(fs::create_directories(dir.path() / "file"), std::system_error);

  // copy_file: refuses an existing destination unless asked to overwrite; keeps the permission bits.
  REQUIRE(::chmod((dir.path() / "file").c_str(), 0640) == 0);
  CHECK(fs::copy_file(dir.path() / "file", dir.path() / "copy"));
  CHECK(read(dir.path() / "copy") == "data");
  struct stat st {};
  REQUIRE(::stat((dir.path() / "copy").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);
  write(dir.path() / "file", "newer");
  CHECK_FALSE(fs::copy_file(dir.path() / "file", dir.path() / "copy", ec));
  CHECK(ec == std::errc::file_exists);
  CHECK(fs::copy_file(dir.path() / "file", dir.path() / "copy", fs::copy_options::overwrite_existing));
  CHECK(read(dir.path() / "copy") == "newer");
  CHECK_FALSE(fs::copy_file(dir.path() / "a", dir.path() / "copy2", ec));  // a directory is not a file
  CHECK(ec);
  CHECK_FALSE(fs::exists(dir.path() / "copy2"));

  fs::rename(dir.path() / "copy", dir.path() / "renamed");
  CHECK_FALSE(fs::exists(dir.path() / "copy"));
  CHECK(read(dir.path() / "renamed") == "newer");
  fs::rename(dir.path() / "nope", dir.path() / "x", ec);
  CHECK(ec == std::errc::no_such_file_or_directory);
  try {
    fs::rename(dir.path() / "nope", dir.path() / "x");
    FAIL("expected std::system_error");
  } catch (const std::system_error& e) {
    CHECK_THAT(e.what(), Contains("cannot rename '" + dir.str("nope") + "' to '" + dir.str("x") + "'"));
  }

  CHECK(fs::remove(dir.path() / "renamed"));
  CHECK_FALSE(fs::remove(dir.path() / "renamed"));  // already gone: false, no error
  fs::remove(dir.path() / "a", ec);                 // not empty
  CHECK(ec == std::errc::directory_not_empty);
  CHECK(fs::remove(deep));  // an empty directory
}

TEST_CASE("posix_fs queries and listings", "[unit][common]") {
  pi0::testing::TempDir dir("pi0fs");
  const fs::path root = dir.path();
  fs::create_directories(root / "b" / "inner");
  fs::create_directories(root / "elsewhere");
  write(root / "elsewhere" / "hidden_from_recursion", "z");
  write(root / "c.txt", "12345");
  write(root / "a.txt", "");
  write(root / "b" / "inner" / "deep.txt", "d");
  REQUIRE(::symlink((root / "elsewhere").c_str(), (root / "b" / "link").c_str()) == 0);

  CHECK(fs::exists(root / "c.txt"));
  CHECK_FALSE(fs::exists(root / "nope"));
  CHECK_FALSE(fs::exists(root / "c.txt" / "below_a_file"));  // ENOTDIR reads as "missing", as std
  CHECK(fs::file_size(root / "c.txt") == 5);
  std::error_code ec;
  CHECK(fs::file_size(root / "nope", ec) == static_cast<uint64_t>(-1));
  CHECK(ec == std::errc::no_such_file_or_directory);
  CHECK_THROWS_WITH(fs::file_size(root / "b"), Contains("cannot get the size of '" + (root / "b").string() + "'"));
  CHECK(fs::is_empty(root / "a.txt"));
  CHECK_FALSE(fs::is_empty(root / "c.txt"));
  CHECK(fs::is_empty(root / "b" / "inner" / ".." / ".." / "elsewhere") == false);
  fs::create_directories(root / "empty");
  CHECK(fs::is_empty(root / "empty"));
  CHECK(fs::is_directory(root / "b" / "link"));  // follows the link
  CHECK(fs::is_symlink(root / "b" / "link"));
  CHECK_FALSE(fs::is_regular_file(root / "b"));

  CHECK(names(root, fs::directory_iterator(root)) ==
        std::vector<std::string>{"a.txt", "b", "c.txt", "elsewhere", "empty"});
  const fs::recursive_directory_iterator rec(root / "b");
  CHECK(names(root / "b", rec) ==
        std::vector<std::string>{"inner", "inner/deep.txt", "link"});  // the linked directory is not entered
  CHECK_THROWS_WITH(fs::directory_iterator(root / "nope"),
                    Contains("cannot list directory '" + (root / "nope").string() + "'"));
  const fs::directory_iterator none(root / "c.txt", ec);
  CHECK(ec == std::errc::not_a_directory);
  CHECK(none.begin() == none.end());

  CHECK(fs::absolute("/x/y") == "/x/y");
  char cwd[4096];
  REQUIRE(::getcwd(cwd, sizeof cwd));
  CHECK(fs::absolute("rel/p") == fs::path(cwd) / "rel/p");
  CHECK(fs::canonical(root / "b" / "link") == fs::canonical(root / "elsewhere"));
  CHECK_THROWS_AS(fs::canonical(root / "nope"), std::system_error);

  const char* old = std::getenv("TMPDIR");
  const std::string saved = old ? old : "";
  ::setenv("TMPDIR", root.c_str(), 1);
  CHECK(fs::temp_directory_path() == root);
  ::setenv("TMPDIR", (root / "nope").c_str(), 1);
  CHECK(fs::temp_directory_path() == "/tmp");
  if (old) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
}
