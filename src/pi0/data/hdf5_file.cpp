#include "pi0/data/hdf5_file.h"

#include <sys/stat.h>

#include "pi0/common/check.h"
#include "pi0/common/files.h"

namespace pi0::data {
namespace {

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex m;
  return m;
}

bool library_threadsafe() {
  static const bool safe = [] {
    hbool_t ts = 0;
    H5is_library_threadsafe(&ts);
    // Silence HDF5's own error stack printing: every failure is reported through our exceptions.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return ts != 0;
  }();
  return safe;
}

/// Splits "a/b/c" into prefixes "a", "a/b", "a/b/c" so H5Lexists can be asked level by level.
std::vector<std::string> prefixes(const std::string& path) {
  std::vector<std::string> out;
  std::string cur;
  size_t i = 0;
  while (i < path.size()) {
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (!part.empty()) {
      cur += (cur.empty() && path[0] != '/') ? part : "/" + part;
      out.push_back(cur);
    }
    i = j + 1;
  }
  return out;
}

}  // namespace

Hdf5Lock::Hdf5Lock() {
  if (!library_threadsafe()) {
    hdf5_mutex().lock();
    locked_ = true;
  }
}

Hdf5Lock::~Hdf5Lock() {
  if (locked_) hdf5_mutex().unlock();
}

void Hid::reset() {
  if (id_ < 0) return;
  Hdf5Lock lock;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    default: break;
  }
  id_ = -1;
}

std::string DatasetInfo::dtype_name() const {
  switch (type_class) {
    case H5T_FLOAT: return "float" + std::to_string(8 * type_size);
    case H5T_INTEGER: return std::string(is_signed ? "int" : "uint") + std::to_string(8 * type_size);
    case H5T_STRING: return "string";
    case H5T_ENUM: return "enum";
    case H5T_COMPOUND: return "compound";
    default: return "class" + std::to_string(static_cast<int>(type_class));
  }
}

H5File H5File::open(const std::string& path) {
  // The true reason first (missing, permission denied, a directory or FIFO): H5Fis_hdf5 says "not HDF5" to all.
  require_input_file(path, "", "an HDF5 file");
  Hdf5Lock lock;
  if (H5Fis_hdf5(path.c_str()) <= 0) throw UserError(path + ": not an HDF5 file");
  H5File f;
  f.path_ = path;
  f.file_ = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!f.file_.valid()) throw UserError(path + ": cannot open HDF5 file");
  return f;
}

H5File H5File::create(const std::string& path) {
  require_output_file(path);
  Hdf5Lock lock;
  H5File f;
  f.path_ = path;
  f.file_ = Hid(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  if (!f.file_.valid()) throw UserError(path + ": cannot create HDF5 file");
  return f;
}

bool H5File::exists(const std::string& obj_path) const {
  Hdf5Lock lock;
  for (const auto& p : prefixes(obj_path)) {
    if (H5Lexists(file_.get(), p.c_str(), H5P_DEFAULT) <= 0) return false;
  }
  return true;
}

bool H5File::is_group(const std::string& obj_path) const {
  Hdf5Lock lock;
  if (obj_path != "/" && !exists(obj_path)) return false;
  H5O_info_t oi;
  if (H5Oget_info_by_name(file_.get(), obj_path.c_str(), &oi, H5P_DEFAULT) < 0) return false;
  return oi.type == H5O_TYPE_GROUP;
}

std::vector<std::string> H5File::list(const std::string& group_path) const {
  Hdf5Lock lock;
  Hid g(H5Gopen2(file_.get(), group_path.c_str(), H5P_DEFAULT));
  if (!g.valid()) throw UserError(path_ + ": " + group_path + ": group not found");
  H5G_info_t gi;
  H5Gget_info(g.get(), &gi);
  std::vector<std::string> names;
  for (hsize_t i = 0; i < gi.nlinks; ++i) {
    ssize_t n = H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, nullptr, 0, H5P_DEFAULT);
    std::string name(static_cast<size_t>(n), '\0');
    H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(), n + 1, H5P_DEFAULT);
    names.push_back(name);
  }
  return names;
}

DatasetInfo H5File::info(const std::string& dset_path) const {
  Hdf5Lock lock;
  if (!exists(dset_path)) throw UserError(path_ + ": key " + dset_path + " not found");
  Hid d(H5Dopen2(file_.get(), dset_path.c_str(), H5P_DEFAULT));
  if (!d.valid()) throw UserError(path_ + ": key " + dset_path + " is not a dataset");
  Hid space(H5Dget_space(d.get()));
  Hid type(H5Dget_type(d.get()));
  DatasetInfo out;
  int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  for (auto d0 : dims) out.shape.push_back(static_cast<int64_t>(d0));
  out.type_class = H5Tget_class(type.get());
  out.type_size = H5Tget_size(type.get());
  if (out.type_class == H5T_INTEGER) out.is_signed = H5Tget_sign(type.get()) == H5T_SGN_2;
  return out;
}

namespace {

// Reads a hyperslab of whole rows [row0, row0+rows) into `buf` with memory type `mem_type`.
void read_rows(hid_t file, const std::string& fpath, const std::string& dset_path, int64_t row0, int64_t rows,
               hid_t mem_type, void* buf) {
  Hid d(H5Dopen2(file, dset_path.c_str(), H5P_DEFAULT));
  if (!d.valid()) throw UserError(fpath + ": key " + dset_path + " not found");
  Hid fspace(H5Dget_space(d.get()));
  int rank = H5Sget_simple_extent_ndims(fspace.get());
  if (rank == 0) {
    if (H5Dread(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
      throw UserError(fpath + ": key " + dset_path + ": read failed");
    return;
  }
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(fspace.get(), dims.data(), nullptr);
  std::vector<hsize_t> start(dims.size(), 0), count = dims;
  start[0] = static_cast<hsize_t>(row0);
  count[0] = static_cast<hsize_t>(rows);
  H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
  Hid mspace(H5Screate_simple(rank, count.data(), nullptr));
  if (H5Dread(d.get(), mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, buf) < 0)
    throw UserError(fpath + ": key " + dset_path + ": read failed (rows " + std::to_string(row0) + ".." +
                    std::to_string(row0 + rows) + ")");
}

int64_t row_elems(const DatasetInfo& info) {
  int64_t n = 1;
  for (size_t i = 1; i < info.shape.size(); ++i) n *= info.shape[i];
  return n;
}

}  // namespace

std::vector<double> H5File::read_doubles(const std::string& dset_path, int64_t row0, int64_t rows) const {
  Hdf5Lock lock;
  DatasetInfo di = info(dset_path);
  if (di.type_class != H5T_FLOAT && di.type_class != H5T_INTEGER)
    throw UserError(path_ + ": key " + dset_path + " has dtype " + di.dtype_name() + ", expected a numeric array");
  int64_t total_rows = di.shape.empty() ? 1 : di.shape[0];
  if (rows < 0) rows = total_rows - row0;
  std::vector<double> out(static_cast<size_t>(rows * row_elems(di)));
  if (!out.empty()) read_rows(file_.get(), path_, dset_path, row0, rows, H5T_NATIVE_DOUBLE, out.data());
  return out;
}

std::vector<uint8_t> H5File::read_bytes(const std::string& dset_path, int64_t row0, int64_t rows) const {
  Hdf5Lock lock;
  DatasetInfo di = info(dset_path);
  std::vector<uint8_t> out(static_cast<size_t>(rows * row_elems(di)));
  if (!out.empty()) read_rows(file_.get(), path_, dset_path, row0, rows, H5T_NATIVE_UINT8, out.data());
  return out;
}

std::optional<std::string> H5File::string_attr(const std::string& obj_path, const std::string& name) const {
  Hdf5Lock lock;
  if (obj_path != "/" && !exists(obj_path)) return std::nullopt;
  if (H5Aexists_by_name(file_.get(), obj_path.c_str(), name.c_str(), H5P_DEFAULT) <= 0) return std::nullopt;
  Hid a(H5Aopen_by_name(file_.get(), obj_path.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  Hid ftype(H5Aget_type(a.get()));
  if (H5Tget_class(ftype.get()) != H5T_STRING) return std::nullopt;
  Hid space(H5Aget_space(a.get()));
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Hid mtype(H5Tcopy(H5T_C_S1));
    H5Tset_size(mtype.get(), H5T_VARIABLE);
    H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get()));
    char* s = nullptr;
    if (H5Aread(a.get(), mtype.get(), &s) < 0) return std::nullopt;
    std::string out = s ? s : "";
    H5free_memory(s);
    return out;
  }
  size_t n = H5Tget_size(ftype.get());
  std::string buf(n, '\0');
  if (H5Aread(a.get(), ftype.get(), buf.data()) < 0) return std::nullopt;
  buf.resize(strnlen(buf.data(), n));
  return buf;
}

void H5File::create_group(const std::string& path) const {
  Hdf5Lock lock;
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Hid g(H5Gcreate2(file_.get(), path.c_str(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT));
  PI0_CHECK(g.valid(), "cannot create group ", path, " in ", path_);
}

void H5File::write(const std::string& path, const std::vector<int64_t>& shape, hid_t mem_type, const void* data,
                   hid_t file_type) const {
  Hdf5Lock lock;
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  Hid lcpl(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(lcpl.get(), 1);
  Hid d(H5Dcreate2(file_.get(), path.c_str(), file_type >= 0 ? file_type : mem_type, space.get(), lcpl.get(),
                   H5P_DEFAULT, H5P_DEFAULT));
  PI0_CHECK(d.valid(), "cannot create dataset ", path, " in ", path_);
  PI0_CHECK(H5Dwrite(d.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0, "write failed: ", path);
}

void H5File::write_string_attr(const std::string& obj_path, const std::string& name, const std::string& value) const {
  Hdf5Lock lock;
  // As h5py writes a Python str: scalar, variable-length, UTF-8.
  Hid type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Hid space(H5Screate(H5S_SCALAR));
  Hid a(H5Acreate_by_name(file_.get(), obj_path.c_str(), name.c_str(), type.get(), space.get(), H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT));
  const char* s = value.c_str();
  PI0_CHECK(a.valid() && H5Awrite(a.get(), type.get(), &s) >= 0, "cannot write attribute ", name);
}

void H5File::write_int64_attr(const std::string& obj_path, const std::string& name, int64_t value) const {
  Hdf5Lock lock;
  Hid space(H5Screate(H5S_SCALAR));
  Hid a(H5Acreate_by_name(file_.get(), obj_path.c_str(), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT));
  PI0_CHECK(a.valid() && H5Awrite(a.get(), H5T_NATIVE_INT64, &value) >= 0, "cannot write attribute ", name);
}

void H5File::write_doubles_attr(const std::string& obj_path, const std::string& name,
                                const std::vector<double>& v) const {
  Hdf5Lock lock;
  hsize_t n = v.size();
  Hid space(H5Screate_simple(1, &n, nullptr));
  Hid a(H5Acreate_by_name(file_.get(), obj_path.c_str(), name.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT));
  PI0_CHECK(a.valid() && H5Awrite(a.get(), H5T_NATIVE_DOUBLE, v.data()) >= 0, "cannot write attribute ", name);
}

void H5File::write_bool_attr(const std::string& obj_path, const std::string& name, bool value) const {
  Hdf5Lock lock;
  // h5py stores numpy bool as an enum {FALSE=0, TRUE=1} over int8.
  Hid type(H5Tenum_create(H5T_NATIVE_INT8));
  int8_t f = 0, t = 1;
  H5Tenum_insert(type.get(), "FALSE", &f);
  H5Tenum_insert(type.get(), "TRUE", &t);
  Hid space(H5Screate(H5S_SCALAR));
  Hid a(H5Acreate_by_name(file_.get(), obj_path.c_str(), name.c_str(), type.get(), space.get(), H5P_DEFAULT,
                          H5P_DEFAULT, H5P_DEFAULT));
  int8_t v = value ? 1 : 0;
  PI0_CHECK(a.valid() && H5Awrite(a.get(), type.get(), &v) >= 0, "cannot write attribute ", name);
}

}  // namespace pi0::data
