// safetensors reader (mmap + validated header) and atomic writer. See safetensors.h and docs/formats.md.
#include "pi0/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"

// The format and torch's CPU tensors are both little-endian byte images; on a big-endian host every element would
// need swapping, which nothing here does.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

namespace pi0::io {
namespace {

using json = nlohmann::json;

/// Headers larger than this are refused before parsing: a corrupt length field must not make us parse gigabytes of
/// tensor data as JSON. The reference implementation uses the same bound; a real checkpoint header is < 1 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeEntry {
  const char* name;
  std::optional<torch::ScalarType> scalar_type;  // nullopt: a safetensors dtype this LibTorch cannot represent
};

// Every dtype the safetensors spec defines, so an unsupported-but-valid file gets a clearer message than a typo.
const std::vector<DtypeEntry>& dtype_table() {
  static const std::vector<DtypeEntry> table = {
      {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
      {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
      {"U8", torch::kUInt8},    {"BOOL", torch::kBool},
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
      {"U16", torch::kUInt16},  {"U32", torch::kUInt32},  {"U64", torch::kUInt64},
#else
      {"U16", std::nullopt},    {"U32", std::nullopt},    {"U64", std::nullopt},
#endif
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
      {"F8_E4M3", torch::kFloat8_e4m3fn}, {"F8_E5M2", torch::kFloat8_e5m2},
#else
      {"F8_E4M3", std::nullopt}, {"F8_E5M2", std::nullopt},
#endif
  };
  return table;
}

std::string supported_dtype_list() {
  std::string out;
  for (const auto& e : dtype_table()) {
    if (!e.scalar_type) continue;
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

std::string errno_text(int err) { return std::string(std::strerror(err)); }

/// Closes a file descriptor on scope exit (the mapping outlives the descriptor).
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);  // found by fuzz/safetensors.cpp: every file read leaked its descriptor
  }
};

/// Writes all `n` bytes, retrying short writes and EINTR (a single write() moves at most ~2 GB on Linux).
/// The bytes are hashed as they go (they are in cache anyway), giving the file's checksum at no extra pass.
void write_all(int fd, const char* data, size_t n, const std::string& tmp_path, Xxh3& hash) {
  hash.update(data, n);
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw UserError(tmp_path + ": write failed (" + errno_text(errno) + ")");
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::optional<torch::ScalarType> scalar_type_from_dtype(const std::string& dtype) {
  for (const auto& e : dtype_table()) {
    if (dtype == e.name) return e.scalar_type;
  }
  return std::nullopt;
}

std::optional<std::string> dtype_from_scalar_type(torch::ScalarType scalar_type) {
  for (const auto& e : dtype_table()) {
    if (e.scalar_type && *e.scalar_type == scalar_type) return std::string(e.name);
  }
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated not to overflow when the header was parsed
  return n;
}

// ---------------------------------------------------------------------------------------------------------------
// Reader

struct SafetensorsFile::Mapping {
  char* addr = nullptr;
  size_t length = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) ::munmap(addr, length);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path, AccessPattern access) : path_(path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) throw UserError(path + ": cannot open safetensors file (" + errno_text(errno) + ")");
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw UserError(path + ": cannot stat (" + errno_text(errno) + ")");
  if (!S_ISREG(st.st_mode)) throw UserError(path + ": not a regular file; expected a .safetensors file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    throw UserError(path + ": file is " + std::to_string(size) +
                    " bytes, shorter than the 8-byte header length; not a safetensors file");
  }

  auto mapping = std::make_shared<Mapping>();
  // PROT_READ + MAP_PRIVATE: nothing can ever write through to the checkpoint, and unlike a writable private
  // mapping it is not charged against the commit limit, so a 13 GB file maps under strict overcommit too.
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (addr == MAP_FAILED) throw UserError(path + ": mmap failed (" + errno_text(errno) + ")");
  mapping->addr = static_cast<char*>(addr);
  mapping->length = size;
  mapping_ = mapping;

  uint64_t header_len = 0;
  std::memcpy(&header_len, mapping->addr, 8);  // little-endian u64 (host order, see static_assert)
  if (header_len > size - 8) {
    throw UserError(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                    std::to_string(size - 8) + " bytes after the length field; file truncated or not safetensors");
  }
  if (header_len > kMaxHeaderBytes) {
    throw UserError(path + ": header length " + std::to_string(header_len) + " exceeds the " +
                    std::to_string(kMaxHeaderBytes) + "-byte limit; file corrupt or not safetensors");
  }
  data_start_ = 8 + header_len;
  parse_header(mapping->addr + 8, header_len);

  // Read-ahead hint for the tensor data only; the header has already been read.
  if (access == AccessPattern::kSequential) {
    ::madvise(mapping->addr, mapping->length, MADV_SEQUENTIAL);  // a hint: failure changes nothing but speed
  }
}

void SafetensorsFile::parse_header(const char* header, uint64_t header_len) {
  // nlohmann keeps the last of duplicate keys silently; a duplicated tensor name would hide a tensor, so record
  // top-level keys while parsing (depth 1 = keys of the outermost object).
  std::set<std::string> seen_keys;
  std::string duplicate_key;
  const json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!seen_keys.insert(key).second && duplicate_key.empty()) duplicate_key = key;
    }
    return true;
  };
  json root;
  try {
    root = json::parse(header, header + header_len, on_event);
  } catch (const json::exception& e) {
    throw UserError(path_ + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!root.is_object()) {
    throw UserError(path_ + ": header is JSON " + std::string(root.type_name()) + ", expected an object");
  }
  if (!duplicate_key.empty()) throw UserError(path_ + ": header has duplicate key '" + duplicate_key + "'");

  const uint64_t data_len = mapping_->length - data_start_;
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        throw UserError(path_ + ": __metadata__ is JSON " + std::string(entry.type_name()) +
                        ", expected an object of strings");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          throw UserError(path_ + ": __metadata__['" + key + "'] is JSON " + std::string(value.type_name()) +
                          ", expected a string");
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }

    const std::string where = path_ + ": tensor '" + name + "'";
    if (!entry.is_object()) {
      throw UserError(where + " is JSON " + std::string(entry.type_name()) +
                      ", expected an object with dtype, shape, data_offsets");
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!entry.contains(field)) throw UserError(where + " has no '" + field + "'");
    }

    TensorInfo ti;
    const json& dtype = entry["dtype"];
    if (!dtype.is_string()) throw UserError(where + ": dtype is JSON " + std::string(dtype.type_name()));
    ti.dtype = dtype.get<std::string>();
    const auto scalar_type = scalar_type_from_dtype(ti.dtype);
    if (!scalar_type) {
      const bool known = std::any_of(dtype_table().begin(), dtype_table().end(),
                                     [&](const DtypeEntry& e) { return ti.dtype == e.name; });
      throw UserError(where + ": " + (known ? "dtype " + ti.dtype + " is not supported by LibTorch " TORCH_VERSION
                                            : "unknown dtype '" + ti.dtype + "'") +
                      "; expected one of " + supported_dtype_list());
    }
    ti.scalar_type = *scalar_type;

    const json& shape = entry["shape"];
    if (!shape.is_array()) throw UserError(where + ": shape is JSON " + std::string(shape.type_name()));
    uint64_t numel = 1;
    bool overflow = false;
    for (const json& dim : shape) {
      if (!dim.is_number_integer()) {
        throw UserError(where + ": shape " + shape.dump() + " has a non-integer dimension");
      }
      if (!dim.is_number_unsigned()) {
        throw UserError(where + ": shape " + shape.dump() + " has a negative dimension");
      }
      const auto d = dim.get<uint64_t>();
      if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) overflow = true;
      overflow |= __builtin_mul_overflow(numel, d, &numel);
      ti.shape.push_back(static_cast<int64_t>(d));
    }
    const auto elem_size = static_cast<uint64_t>(c10::elementSize(ti.scalar_type));
    uint64_t expected_bytes = 0;
    overflow |= __builtin_mul_overflow(numel, elem_size, &expected_bytes);
    if (overflow || numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw UserError(where + ": shape " + shape.dump() + " is too large (byte size overflows 64 bits)");
    }

    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      throw UserError(where + ": data_offsets " + offsets.dump() + " must be [begin, end] with non-negative integers");
    }
    ti.data_begin = offsets[0].get<uint64_t>();
    ti.data_end = offsets[1].get<uint64_t>();
    if (ti.data_begin > ti.data_end) {
      throw UserError(where + ": data_offsets " + offsets.dump() + " have begin > end");
    }
    if (ti.data_end > data_len) {
      throw UserError(where + ": data_offsets " + offsets.dump() + " lie outside the data buffer of " +
                      std::to_string(data_len) + " bytes; file truncated?");
    }
    if (ti.nbytes() != expected_bytes) {
      throw UserError(where + ": data_offsets " + offsets.dump() + " span " + std::to_string(ti.nbytes()) +
                      " bytes, but dtype " + ti.dtype + " and shape " + shape.dump() + " need " +
                      std::to_string(expected_bytes));
    }
    infos_.emplace(name, std::move(ti));
    names_.push_back(name);
  }
  std::sort(names_.begin(), names_.end());

  // Overlapping tensors would alias each other's memory. Gaps and trailing bytes are tolerated (the spec forbids
  // them, but they cannot make a read wrong); empty tensors occupy no bytes and never overlap.
  std::vector<const std::pair<const std::string, TensorInfo>*> by_offset;
  for (const auto& kv : infos_) {
    if (kv.second.nbytes() > 0) by_offset.push_back(&kv);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->second.data_begin < b->second.data_begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const auto& prev = *by_offset[i - 1];
    const auto& cur = *by_offset[i];
    if (cur.second.data_begin < prev.second.data_end) {
      throw UserError(path_ + ": tensors '" + prev.first + "' [" + std::to_string(prev.second.data_begin) + ", " +
                      std::to_string(prev.second.data_end) + ") and '" + cur.first + "' [" +
                      std::to_string(cur.second.data_begin) + ", " + std::to_string(cur.second.data_end) +
                      ") overlap");
    }
  }
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto it = infos_.find(name);
  if (it == infos_.end()) {
    throw UserError(path_ + ": no tensor named '" + name + "' (file has " + std::to_string(names_.size()) +
                    " tensors)");
  }
  return it->second;
}

uint64_t SafetensorsFile::file_size() const { return mapping_->length; }

torch::Tensor SafetensorsFile::get(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const auto options = torch::TensorOptions().dtype(ti.scalar_type);
  if (ti.nbytes() == 0) return torch::empty(ti.shape, options);  // nothing to view; also avoids a null blob

  char* src = mapping_->addr + data_start_ + ti.data_begin;
  if (reinterpret_cast<uintptr_t>(src) % c10::elementSize(ti.scalar_type) != 0) {
    torch::Tensor out = torch::empty(ti.shape, options);
    std::memcpy(out.data_ptr(), src, ti.nbytes());
    return out;
  }
  // The deleter owns a reference to the mapping: the view keeps the file mapped however long it lives.
  std::shared_ptr<const Mapping> keep_alive = mapping_;
  return torch::from_blob(
      src, ti.shape, [keep_alive](void*) {}, options);
}

torch::Tensor SafetensorsFile::get_copy(const std::string& name, std::optional<torch::ScalarType> dtype) const {
  const TensorInfo& ti = info(name);
  const torch::Tensor view = get(name);
  const torch::ScalarType target = dtype.value_or(ti.scalar_type);
  // One pass over the source either way: the conversion itself allocates fresh memory.
  if (target != ti.scalar_type) return view.to(target);
  return view.clone(at::MemoryFormat::Contiguous);
}

void SafetensorsFile::read_into(const std::string& name, const torch::Tensor& dst, uint64_t chunk_bytes) const {
  const TensorInfo& ti = info(name);
  PI0_CHECK(dst.defined(), "read_into: undefined destination for '", name, "'");
  if (dst.sizes() != torch::IntArrayRef(ti.shape)) {
    throw UserError(path_ + ": tensor '" + name + "' has shape " + c10::str(torch::IntArrayRef(ti.shape)) +
                    ", but the destination has shape " + c10::str(dst.sizes()));
  }
  if (ti.nbytes() == 0) return;

  // Copy out of the mapping in chunks of the flat element range and release each chunk once copied, so the mapped
  // part of the resident set stays near chunk_bytes however large the tensor (an embedding table is ~0.5 GB).
  // NOTE: pread() straight into the destination was measured too (bench/bench_safetensors_load.cpp): it never maps
  // the pages, but its in-kernel copy runs at ~5 GB/s against ~9 GB/s for memcpy from the mapping when the
  // destination already exists, which is the model-loading case.
  torch::NoGradGuard no_grad;  // dst is typically a parameter that requires grad
  const torch::Tensor src = get(name);
  if (!dst.is_contiguous() || chunk_bytes == 0) {
    dst.copy_(src);
    release(name);
    return;
  }
  const bool raw_copy = dst.device().is_cpu() && dst.scalar_type() == ti.scalar_type && !dst.is_conj() &&
                        !dst.is_neg();
  const int64_t numel = src.numel();
  const auto src_elem = static_cast<int64_t>(src.element_size());
  const auto dst_elem = static_cast<int64_t>(dst.element_size());
  const int64_t chunk_elems = std::max<int64_t>(1, static_cast<int64_t>(chunk_bytes) / src_elem);
  const torch::Tensor src_flat = src.view({-1});
  const torch::Tensor dst_flat = dst.view({-1});
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  // Whole pages inside [lo, hi): rounding inward never touches memory outside the range.
  auto inner_pages = [page](const char* lo, const char* hi) -> std::pair<void*, size_t> {
    const uintptr_t a = (reinterpret_cast<uintptr_t>(lo) + page - 1) / page * page;
    const uintptr_t b = reinterpret_cast<uintptr_t>(hi) / page * page;
    return {reinterpret_cast<void*>(a), b > a ? b - a : 0};
  };
  char* const src_base = static_cast<char*>(src.data_ptr());
  char* const dst_base = static_cast<char*>(dst.data_ptr());
  const bool src_is_mapping = src_base == mapping_->addr + data_start_ + ti.data_begin;  // else an aligned copy
  // Ask the kernel to read a chunk ahead (asynchronously) while the current one is copied or converted: page
  // faults on a cold mapping otherwise read 128 KiB at a time, in the copying thread, far below the disk's speed.
  auto read_ahead = [&](int64_t begin) {
    if (!src_is_mapping || begin >= numel) return;
    const int64_t n = std::min(chunk_elems, numel - begin);
    const auto [addr, len] = inner_pages(src_base + begin * src_elem, src_base + (begin + n) * src_elem);
    if (len > 0) ::madvise(addr, len, MADV_WILLNEED);
  };
  read_ahead(0);
  for (int64_t begin = 0; begin < numel; begin += chunk_elems) {
    const int64_t n = std::min(chunk_elems, numel - begin);
    read_ahead(begin + chunk_elems);
    if (dst.device().is_cpu()) {
      // Fault the destination chunk in with one call: a freshly allocated parameter otherwise takes one user-mode
      // page fault per 4 KiB, which costs more than the copy itself (~1.7x faster measured). A hint: kernels
      // before 5.14 reject it and the copy faults the pages in as usual.
      const auto [addr, len] = inner_pages(dst_base + begin * dst_elem, dst_base + (begin + n) * dst_elem);
      if (len > 0) ::madvise(addr, len, MADV_POPULATE_WRITE);
    }
    if (raw_copy) {
      std::memcpy(dst_base + begin * dst_elem, src_base + begin * src_elem, static_cast<size_t>(n * src_elem));
    } else {
      dst_flat.narrow(0, begin, n).copy_(src_flat.narrow(0, begin, n));
    }
    if (src_is_mapping) {
      // Inward, so the page straddling into the next chunk, still to be read, stays mapped.
      const auto [addr, len] = inner_pages(src_base + begin * src_elem, src_base + (begin + n) * src_elem);
      if (len > 0) ::madvise(addr, len, MADV_DONTNEED);
    }
  }
  if (raw_copy) dst.unsafeGetTensorImpl()->bump_version();  // memcpy bypassed copy_'s version bump
  release(name);  // the pages at the tensor's edges
}

void SafetensorsFile::release(const std::string& name) const {
  const TensorInfo& ti = info(name);
  if (ti.nbytes() == 0) return;
  // Round outward to whole pages. That may also drop a page shared with a neighbouring tensor, which is harmless:
  // the mapping is read-only, so its pages are clean page-cache pages and the next touch just maps them back in.
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = (data_start_ + ti.data_begin) / page * page;
  const uint64_t end = std::min<uint64_t>((data_start_ + ti.data_end + page - 1) / page * page, mapping_->length);
  ::madvise(mapping_->addr + begin, end - begin, MADV_DONTNEED);  // a hint: on failure the pages just stay mapped
}

// ---------------------------------------------------------------------------------------------------------------
// Writer

FileDigest save_safetensors(const std::string& path,
                            const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                            const std::map<std::string, std::string>& metadata) {
  std::vector<LazyTensor> lazy;
  lazy.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    const std::string where = path + ": tensor '" + name + "'";
    if (!tensor.defined()) throw UserError(where + " is an undefined tensor");
    if (tensor.layout() != torch::kStrided) {
      throw UserError(where + " has a non-strided layout; convert it with to_dense() first");
    }
    const torch::Tensor* t = &tensor;
    lazy.push_back({name, tensor.scalar_type(), tensor.sizes().vec(), [t] { return *t; }});
  }
  return save_safetensors_lazy(path, lazy, metadata);
}

FileDigest save_safetensors_lazy(const std::string& path, const std::vector<LazyTensor>& tensors,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::function<void(uint64_t, uint64_t)>& progress) {
  struct Entry {
    const LazyTensor* tensor;
    std::string dtype;
    size_t elem_size;
    uint64_t nbytes;
  };
  // Validate everything before creating any file, so bad input never leaves a partial file behind.
  std::vector<Entry> entries;
  entries.reserve(tensors.size());
  std::set<std::string> seen;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    const std::string where = path + ": tensor '" + t.name + "'";
    if (t.name == kMetadataKey) throw UserError(where + ": the name __metadata__ is reserved by the format");
    if (!seen.insert(t.name).second) throw UserError(where + " appears twice; tensor names must be unique");
    const auto dtype = dtype_from_scalar_type(t.dtype);
    if (!dtype) {
      throw UserError(where + " has dtype " + std::string(c10::toString(t.dtype)) +
                      ", which safetensors cannot store; expected one of " + supported_dtype_list());
    }
    const size_t elem_size = c10::elementSize(t.dtype);
    int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    entries.push_back({&t, *dtype, elem_size, static_cast<uint64_t>(numel) * elem_size});
    total += entries.back().nbytes;
  }
  // Decreasing element size keeps every tensor aligned to its element size, given the 8-aligned data start;
  // the name breaks ties so the layout is deterministic.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.elem_size != b.elem_size ? a.elem_size > b.elem_size : a.tensor->name < b.tensor->name;
  });

  json header = json::object();  // std::map-backed: keys come out sorted
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    header[e.tensor->name] = {{"dtype", e.dtype},
                              {"shape", e.tensor->shape},
                              {"data_offsets", {offset, offset + e.nbytes}}};
    offset += e.nbytes;
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const json::exception& e) {  // e.g. a name or metadata string that is not valid UTF-8
    throw UserError(path + ": cannot encode the header (" + e.what() + ")");
  }
  // Pad with spaces (valid JSON whitespace) so the data buffer starts 8-byte aligned in the file and in a mapping.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_len = header_text.size();

  const std::string tmp_path = path + ".tmp";
  FdGuard fd{::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (fd.fd < 0) throw UserError(tmp_path + ": cannot create (" + errno_text(errno) + ")");
  Xxh3 hash;
  try {
    char len_bytes[8];
    std::memcpy(len_bytes, &header_len, 8);
    write_all(fd.fd, len_bytes, 8, tmp_path, hash);
    write_all(fd.fd, header_text.data(), header_text.size(), tmp_path, hash);
    uint64_t written = 0, flushed = 0;
    for (const Entry& e : entries) {
      if (e.nbytes == 0) continue;
      torch::Tensor cpu;
      const std::string where = path + ": tensor '" + e.tensor->name + "'";
      try {
        // One tensor at a time, so a GPU model is never fully duplicated in host memory.
        cpu = e.tensor->produce().contiguous().to(torch::kCPU);
      } catch (const c10::Error& err) {
        throw UserError(where + " cannot be copied to CPU (" + err.what_without_backtrace() + ")");
      }
      if (cpu.scalar_type() != e.tensor->dtype || cpu.sizes() != torch::IntArrayRef(e.tensor->shape)) {
        throw UserError(where + ": produced " + std::string(c10::toString(cpu.scalar_type())) + " " +
                        c10::str(cpu.sizes()) + ", expected " + std::string(c10::toString(e.tensor->dtype)) + " " +
                        c10::str(torch::IntArrayRef(e.tensor->shape)));
      }
      write_all(fd.fd, static_cast<const char*>(cpu.data_ptr()), e.nbytes, tmp_path, hash);
      written += e.nbytes;
      // Start write-back of what is written every 256 MiB and let the page cache drop it once on disk: a
      // multi-GB file otherwise piles up as dirty pages and the final fsync writes it all in one stall.
      if (written - flushed >= (256ull << 20)) {
        const uint64_t base = 8 + header_len;
        ::sync_file_range(fd.fd, static_cast<off_t>(base + flushed), static_cast<off_t>(written - flushed),
                          SYNC_FILE_RANGE_WRITE);
        flushed = written;
      }
      if (progress) progress(written, total);
    }
    // fsync before rename: otherwise a crash can leave the new name pointing at a file whose data never hit disk.
    if (::fsync(fd.fd) != 0) throw UserError(tmp_path + ": fsync failed (" + errno_text(errno) + ")");
    ::posix_fadvise(fd.fd, 0, 0, POSIX_FADV_DONTNEED);  // written and synced: no need to keep it cached
    const int fd_value = fd.fd;
    fd.fd = -1;
    if (::close(fd_value) != 0) throw UserError(tmp_path + ": close failed (" + errno_text(errno) + ")");
    if (::rename(tmp_path.c_str(), path.c_str()) != 0) {
      throw UserError(path + ": cannot rename " + tmp_path + " over it (" + errno_text(errno) + ")");
    }
  } catch (...) {
    ::unlink(tmp_path.c_str());
    throw;
  }
  // Make the rename itself durable. Best effort: the file is complete and in place even if this fails.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  FdGuard dir_fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir_fd.fd >= 0) ::fsync(dir_fd.fd);
  return {8 + header_len + total, hash.hex()};
}

std::map<std::string, torch::Tensor> read_safetensors(const std::string& path) {
  SafetensorsFile file(path);
  std::map<std::string, torch::Tensor> out;
  for (const auto& name : file.names()) out[name] = file.get_copy(name);
  return out;
}

}  // namespace pi0::io
