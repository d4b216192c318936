// Helpers shared by the data tests: a per-test temporary directory and the tiny tokenizer.
#pragma once
#include <atomic>
#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

#include "pi0/common/fs.h"
#include "pi0/data/tokenizer.h"

namespace pi0::test {

/// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = pi0::posix_fs::temp_directory_path() /
            ("pi0_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    pi0::posix_fs::remove_all(path_);
    pi0::posix_fs::create_directories(path_);
  }
  ~TempDir() { pi0::posix_fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string tiny_tokenizer_path() { return std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model"; }

inline std::shared_ptr<const data::Tokenizer> tiny_tokenizer() {
  static auto tok = std::make_shared<const data::Tokenizer>(tiny_tokenizer_path());
  return tok;
}

}  // namespace pi0::test
