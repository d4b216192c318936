// data/parquet.h through Apache Arrow C++ (parquet::arrow::FileReader). Compiled as C++20 (Arrow's headers need it)
// in the pi0_arrow object library; must not include torch or pi0 headers other than parquet.h.
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/util/config.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include <filesystem>
#include <map>
#include <memory>

#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/parquet.h"

namespace pi0::data::parquet {
namespace {

[[noreturn]] void fail(const std::string& message) { throw_parquet_error(message); }

std::unique_ptr<::parquet::arrow::FileReader> open_reader(const std::string& path) {
  if (!pi0::posix_fs::exists(path)) fail(path + ": parquet file not found");
  if (const auto problem = input_file_problem(path); !problem.empty()) fail(path + ": " + problem);
  try {
    auto file = ::arrow::io::ReadableFile::Open(path);
    if (!file.ok()) fail(path + ": cannot open (" + file.status().ToString() + ")");
    auto reader = ::parquet::arrow::OpenFile(*file, ::arrow::default_memory_pool());
    if (!reader.ok()) fail(path + ": not a readable parquet file (" + reader.status().message() + ")");
    return std::move(*reader);
  } catch (const ::parquet::ParquetException& e) {
    fail(path + ": not a readable parquet file (" + std::string(e.what()) + ")");
  }
}

std::string column_list(const ::arrow::Schema& schema) {
  std::string out;
  for (const auto& f : schema.fields()) out += (out.empty() ? "" : ", ") + f->name();
  return out;
}

int field_index(::parquet::arrow::FileReader& reader, const std::string& path, const std::string& column) {
  std::shared_ptr<::arrow::Schema> schema;
  auto st = reader.GetSchema(&schema);
  if (!st.ok()) fail(path + ": unreadable schema (" + st.message() + ")");
  const int i = schema->GetFieldIndex(column);
  if (i < 0) fail(path + ": column '" + column + "' not found; the file has: " + column_list(*schema));
  return i;
}

std::shared_ptr<::arrow::ChunkedArray> read_column(::parquet::arrow::FileReader& reader, const std::string& path,
                                                   const std::string& column) {
  const int i = field_index(reader, path, column);
  std::shared_ptr<::arrow::ChunkedArray> out;
  try {
    auto st = reader.ReadColumn(i, &out);
    if (!st.ok()) fail(path + ": column '" + column + "' is unreadable (" + st.message() + ")");
  } catch (const ::parquet::ParquetException& e) {
    fail(path + ": column '" + column + "' is unreadable (" + std::string(e.what()) + ")");
  }
  return out;
}

/// Appends values[begin, end) of a primitive numeric or bool array as doubles; false if the type is not numeric.
bool append_doubles(const ::arrow::Array& values, int64_t begin, int64_t end, std::vector<double>& out) {
  if (values.null_count() > 0) {
    for (int64_t i = begin; i < end; ++i)
      if (values.IsNull(i)) return false;
  }
  switch (values.type_id()) {
#define PI0_CASE(ID, T)                                                            \
  case ::arrow::Type::ID: {                                                        \
    const auto& a = static_cast<const ::arrow::NumericArray<::arrow::T>&>(values); \
    for (int64_t i = begin; i < end; ++i) out.push_back(static_cast<double>(a.Value(i))); \
    return true;                                                                   \
  }
    PI0_CASE(FLOAT, FloatType)
    PI0_CASE(DOUBLE, DoubleType)
    PI0_CASE(INT8, Int8Type)
    PI0_CASE(INT16, Int16Type)
    PI0_CASE(INT32, Int32Type)
    PI0_CASE(INT64, Int64Type)
    PI0_CASE(UINT8, UInt8Type)
    PI0_CASE(UINT16, UInt16Type)
    PI0_CASE(UINT32, UInt32Type)
    PI0_CASE(UINT64, UInt64Type)
#undef PI0_CASE
    case ::arrow::Type::BOOL: {
      const auto& a = static_cast<const ::arrow::BooleanArray&>(values);
      for (int64_t i = begin; i < end; ++i) out.push_back(a.Value(i) ? 1.0 : 0.0);
      return true;
    }
    default:
      return false;
  }
}

}  // namespace

bool available() { return true; }

std::string build_info() {
  return std::string("Apache Arrow/Parquet C++ ") + ARROW_VERSION_STRING + " (" + ARROW_PACKAGE_KIND + ")";
}

FileInfo file_info(const std::string& path) {
  auto reader = open_reader(path);
  std::shared_ptr<::arrow::Schema> schema;
  auto st = reader->GetSchema(&schema);
  if (!st.ok()) fail(path + ": unreadable schema (" + st.message() + ")");
  FileInfo info;
  for (const auto& f : schema->fields()) info.columns.push_back({f->name(), f->type()->ToString()});
  info.num_rows = reader->parquet_reader()->metadata()->num_rows();
  return info;
}

namespace {

NumericColumn numeric_from(::parquet::arrow::FileReader& reader, const std::string& path, const std::string& column) {
  auto chunked = read_column(reader, path, column);
  NumericColumn out;
  out.rows = chunked->length();
  out.values.reserve(static_cast<size_t>(out.rows));
  bool have_width = false;
  const std::string what = path + ": column '" + column + "' (" + chunked->type()->ToString() + ")";
  for (const auto& chunk : chunked->chunks()) {
    const ::arrow::Array& a = *chunk;
    if (a.null_count() > 0) fail(what + " holds nulls, expected a number or a vector in every row");
    const auto id = a.type_id();
    if (id == ::arrow::Type::FIXED_SIZE_LIST || id == ::arrow::Type::LIST || id == ::arrow::Type::LARGE_LIST) {
      std::shared_ptr<::arrow::Array> values;
      for (int64_t r = 0; r < a.length(); ++r) {
        int64_t begin = 0, end = 0;
        if (id == ::arrow::Type::FIXED_SIZE_LIST) {
          const auto& l = static_cast<const ::arrow::FixedSizeListArray&>(a);
          values = l.values();
          begin = l.value_offset(r);
          end = begin + l.value_length(r);
        } else if (id == ::arrow::Type::LIST) {
          const auto& l = static_cast<const ::arrow::ListArray&>(a);
          values = l.values();
          begin = l.value_offset(r);
          end = begin + l.value_length(r);
        } else {
          const auto& l = static_cast<const ::arrow::LargeListArray&>(a);
          values = l.values();
          begin = l.value_offset(r);
          end = begin + l.value_length(r);
        }
        if (!have_width) out.width = end - begin;
        have_width = true;
        if (end - begin != out.width)
          fail(what + " has rows of length " + std::to_string(out.width) + " and " + std::to_string(end - begin) +
               ", expected one length");
        if (!append_doubles(*values, begin, end, out.values))
          fail(what + " is not numeric (or holds nulls), expected numbers");
      }
    } else {
      out.width = 1;
      if (!append_doubles(a, 0, a.length(), out.values))
        fail(what + " is not numeric, expected a number or a list of numbers per row");
    }
  }
  if (out.rows == 0) out.width = 0;
  return out;
}

}  // namespace

NumericColumn read_numeric(const std::string& path, const std::string& column) {
  auto reader = open_reader(path);
  return numeric_from(*reader, path, column);
}

std::vector<NumericColumn> read_numeric(const std::string& path, const std::vector<std::string>& columns) {
  auto reader = open_reader(path);
  std::vector<NumericColumn> out;
  for (const auto& c : columns) out.push_back(numeric_from(*reader, path, c));
  return out;
}

std::vector<std::string> read_strings(const std::string& path, const std::string& column) {
  auto reader = open_reader(path);
  auto chunked = read_column(*reader, path, column);
  std::vector<std::string> out;
  for (const auto& chunk : chunked->chunks()) {
    if (chunk->type_id() == ::arrow::Type::STRING) {
      const auto& a = static_cast<const ::arrow::StringArray&>(*chunk);
      for (int64_t i = 0; i < a.length(); ++i) out.push_back(a.IsNull(i) ? std::string() : a.GetString(i));
    } else if (chunk->type_id() == ::arrow::Type::LARGE_STRING) {
      const auto& a = static_cast<const ::arrow::LargeStringArray&>(*chunk);
      for (int64_t i = 0; i < a.length(); ++i) out.push_back(a.IsNull(i) ? std::string() : a.GetString(i));
    } else {
      fail(path + ": column '" + column + "' has type " + chunk->type()->ToString() + ", expected string");
    }
  }
  return out;
}

namespace {

/// Per-thread state for random row access to image columns: open readers and the last decoded row group.
struct ImageCache {
  std::map<std::string, std::unique_ptr<::parquet::arrow::FileReader>> readers;
  std::string path, column;
  int row_group = -1;
  int64_t first_row = 0;  // file row of the cached row group's row 0
  std::shared_ptr<::arrow::ChunkedArray> bytes;
};

}  // namespace

std::string read_image_bytes(const std::string& path, const std::string& column, int64_t row) {
  thread_local ImageCache cache;
  if (cache.path != path || cache.column != column || row < cache.first_row || cache.bytes == nullptr ||
      row >= cache.first_row + cache.bytes->length()) {
    auto it = cache.readers.find(path);
    if (it == cache.readers.end()) {
      if (cache.readers.size() >= 16) cache.readers.clear();  // bounded: a worker touches few files at a time
      it = cache.readers.emplace(path, open_reader(path)).first;
    }
    auto& reader = *it->second;
    const auto meta = reader.parquet_reader()->metadata();
    int rg = 0;
    int64_t first = 0;
    while (rg < meta->num_row_groups() && first + meta->RowGroup(rg)->num_rows() <= row) {
      first += meta->RowGroup(rg)->num_rows();
      ++rg;
    }
    if (rg >= meta->num_row_groups())
      fail(path + ": row " + std::to_string(row) + " is past the end (" + std::to_string(first) + " rows)");
    const int field = field_index(reader, path, column);
    std::shared_ptr<::arrow::ChunkedArray> col;
    try {
      auto st = reader.RowGroup(rg)->Column(field)->Read(&col);
      if (!st.ok()) fail(path + ": column '" + column + "' is unreadable (" + st.message() + ")");
    } catch (const ::parquet::ParquetException& e) {
      fail(path + ": column '" + column + "' is unreadable (" + std::string(e.what()) + ")");
    }
    // An image feature is struct<bytes: binary, path: string>; take its bytes child.
    if (col->type()->id() == ::arrow::Type::STRUCT) {
      ::arrow::ArrayVector children;
      for (const auto& chunk : col->chunks()) {
        auto child = static_cast<const ::arrow::StructArray&>(*chunk).GetFieldByName("bytes");
        if (child == nullptr)
          fail(path + ": column '" + column + "' has type " + col->type()->ToString() +
               ", expected struct<bytes: binary, path: string> (an image feature)");
        children.push_back(child);
      }
      col = std::make_shared<::arrow::ChunkedArray>(children, children.empty() ? ::arrow::binary() : children[0]->type());
    }
    const auto id = col->type()->id();
    if (id != ::arrow::Type::BINARY && id != ::arrow::Type::LARGE_BINARY)
      fail(path + ": column '" + column + "' has type " + col->type()->ToString() +
           ", expected struct<bytes: binary, path: string> (an image feature)");
    cache.path = path;
    cache.column = column;
    cache.row_group = rg;
    cache.first_row = first;
    cache.bytes = col;
  }
  int64_t i = row - cache.first_row;
  for (const auto& chunk : cache.bytes->chunks()) {
    if (i < chunk->length()) {
      if (chunk->IsNull(i)) fail(path + ": column '" + column + "' row " + std::to_string(row) + " holds no image bytes");
      if (chunk->type_id() == ::arrow::Type::BINARY)
        return static_cast<const ::arrow::BinaryArray&>(*chunk).GetString(i);
      return static_cast<const ::arrow::LargeBinaryArray&>(*chunk).GetString(i);
    }
    i -= chunk->length();
  }
  fail(path + ": row " + std::to_string(row) + " not found in column '" + column + "'");
}

}  // namespace pi0::data::parquet
