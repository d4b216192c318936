// Parquet reading for the LeRobot format (data/lerobot.h), as plain C++17 types.
//
// Apache Arrow's C++ headers need C++20 (std::span, std::bit_width) while the rest of pi0-train is C++17 and shares
// one precompiled torch header; so only parquet_arrow.cpp sees Arrow, compiled as C++20 in its own object library,
// and everything else goes through this header. Builds without Arrow compile parquet_none.cpp instead, whose
// functions fail with one line telling how to get Arrow (see docs/data.md).
//
// Every error names the file and column; they are pi0::UserError (raised through throw_parquet_error, defined in a
// C++17 file, so the C++20 file need not include the torch-dependent check.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace pi0::data::parquet {

/// True when pi0-train was built with Arrow/Parquet C++.
bool available();
/// "Arrow 26.0.1 (pyarrow wheel ...)" or why it is absent; logged when a LeRobot dataset opens.
std::string build_info();

/// A top-level column: its name and Arrow type as text, e.g. "fixed_size_list<element: float>[8]".
struct ColumnInfo {
  std::string name;
  std::string type;
};

/// Schema and size of one file (reads the footer only).
struct FileInfo {
  std::vector<ColumnInfo> columns;
  int64_t num_rows = 0;
  bool has(const std::string& column) const;
};
FileInfo file_info(const std::string& path);

/// A numeric column read whole: rows × width values, row-major. Scalars (width 1), fixed_size_list, list and
/// large_list of any integer, float or bool type are accepted; lists must all have the same length.
struct NumericColumn {
  std::vector<double> values;
  int64_t rows = 0;
  int64_t width = 0;
};
NumericColumn read_numeric(const std::string& path, const std::string& column);
/// Several numeric columns of one file, opening it once.
std::vector<NumericColumn> read_numeric(const std::string& path, const std::vector<std::string>& columns);

/// A string (utf8 / large_utf8) column read whole.
std::vector<std::string> read_strings(const std::string& path, const std::string& column);

/// The bytes of one row of an `image` feature column, struct<bytes: binary, path: string> (PNG file bytes).
/// Random access: each thread keeps the last row group it decoded per column, so neighbouring rows are cheap.
std::string read_image_bytes(const std::string& path, const std::string& column, int64_t row);

/// Raises pi0::UserError(message). Defined in a C++17 file (parquet_error.cpp).
[[noreturn]] void throw_parquet_error(const std::string& message);

}  // namespace pi0::data::parquet
