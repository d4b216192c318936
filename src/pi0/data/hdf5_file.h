// Thin RAII layer over the HDF5 C API for the dataset readers and the example-data writer.
// Every HDF5 call goes through Hdf5Lock: the Debian HDF5 build is not thread-safe, so calls are serialized behind
// one process-wide mutex unless H5is_library_threadsafe() reports a thread-safe library.
#pragma once
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <hdf5.h>

namespace pi0::data {

/// Holds the global HDF5 mutex for its lifetime (no-op when the library is thread-safe). Recursive, so helpers
/// may nest.
class Hdf5Lock {
 public:
  Hdf5Lock();
  ~Hdf5Lock();
  Hdf5Lock(const Hdf5Lock&) = delete;
  Hdf5Lock& operator=(const Hdf5Lock&) = delete;

 private:
  bool locked_ = false;
};

/// Owns one hid_t and closes it with the matching H5*close.
class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t id) : id_(id) {}
  ~Hid() { reset(); }
  Hid(Hid&& o) noexcept : id_(o.id_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) { reset(); id_ = o.id_; o.id_ = -1; }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();

 private:
  hid_t id_ = -1;
};

/// Shape and element class of a dataset, read without touching its data.
struct DatasetInfo {
  std::vector<int64_t> shape;
  H5T_class_t type_class = H5T_NO_CLASS;
  size_t type_size = 0;   ///< bytes per element
  bool is_signed = false; ///< integers only
  /// e.g. "float32", "uint8", "int64", "string".
  std::string dtype_name() const;
};

/// An open HDF5 file (read-only or freshly created). All methods lock the global HDF5 mutex.
class H5File {
 public:
  /// Opens `path` read-only; throws UserError naming the path if it is missing or not HDF5.
  static H5File open(const std::string& path);
  /// Creates (truncates) `path` for writing.
  static H5File create(const std::string& path);

  const std::string& path() const { return path_; }
  bool exists(const std::string& obj_path) const;  ///< link exists (all intermediate groups too)
  bool is_group(const std::string& obj_path) const;
  std::vector<std::string> list(const std::string& group_path) const;  ///< link names, HDF5 order
  DatasetInfo info(const std::string& dset_path) const;

  /// Reads rows [row0, row0+rows) along dim 0 converted to double (any integer/float dtype).
  std::vector<double> read_doubles(const std::string& dset_path, int64_t row0 = 0, int64_t rows = -1) const;
  /// Reads rows [row0, row0+rows) of a 1-byte integer dataset as raw bytes.
  std::vector<uint8_t> read_bytes(const std::string& dset_path, int64_t row0, int64_t rows) const;

  /// String attribute (fixed or variable length, any charset) on the object `obj_path` ("/" = root).
  std::optional<std::string> string_attr(const std::string& obj_path, const std::string& name) const;

  // ---- writing (example data, tests) ----
  void create_group(const std::string& path) const;
  /// Writes a dataset of shape `shape` from `data`; `type` is an H5T_NATIVE_* id.
  void write(const std::string& path, const std::vector<int64_t>& shape, hid_t mem_type, const void* data,
             hid_t file_type = -1) const;
  void write_string_attr(const std::string& obj_path, const std::string& name, const std::string& value) const;
  void write_int64_attr(const std::string& obj_path, const std::string& name, int64_t value) const;
  void write_doubles_attr(const std::string& obj_path, const std::string& name, const std::vector<double>& v) const;
  void write_bool_attr(const std::string& obj_path, const std::string& name, bool value) const;  ///< h5py enum bool

 private:
  std::string path_;
  Hid file_;
};

}  // namespace pi0::data
