// The one place the C++20 Arrow file (parquet_arrow.cpp) turns its errors into pi0::UserError.
#include "pi0/common/check.h"
#include "pi0/data/parquet.h"

namespace pi0::data::parquet {

void throw_parquet_error(const std::string& message) { throw UserError(message); }

bool FileInfo::has(const std::string& column) const {
  for (const auto& c : columns)
    if (c.name == column) return true;
  return false;
}

}  // namespace pi0::data::parquet
