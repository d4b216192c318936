// data/parquet.h for builds without Apache Arrow C++: every call fails with one line saying how to get it.
#include "pi0/data/parquet.h"

namespace pi0::data::parquet {
namespace {

[[noreturn]] void missing() {
  throw_parquet_error(
      "data.dataset.format: lerobot needs Apache Arrow/Parquet C++, which this build of pi0-train lacks; run "
      "scripts/setup.sh (it installs the pinned pyarrow wheel's C++ libraries) or configure with "
      "-DPI0_ARROW_ROOT=<site-packages>/pyarrow or a system Arrow (find_package(Arrow))");
}

}  // namespace

bool available() { return false; }
std::string build_info() { return "no Apache Arrow/Parquet C++ (format: lerobot unavailable)"; }
FileInfo file_info(const std::string&) { missing(); }
NumericColumn read_numeric(const std::string&, const std::string&) { missing(); }
std::vector<NumericColumn> read_numeric(const std::string&, const std::vector<std::string>&) { missing(); }
std::vector<std::string> read_strings(const std::string&, const std::string&) { missing(); }
std::string read_image_bytes(const std::string&, const std::string&, int64_t) { missing(); }

}  // namespace pi0::data::parquet
