// safetensors reader (mmap + validated header) and atomic writer. See safetensors.h and docs/formats.md.
#include "pi0/io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/strings.h"

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
  int fd = -1;  // kept open for read_into's pread() path
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr) ::munmap(addr, length);
    if (fd >= 0) ::close(fd);
  }
};

SafetensorsFile::SafetensorsFile(const std::string& path, AccessPattern access) : path_(path) {
  // From stat() first: open() on a FIFO blocks until a writer comes.
  if (const auto problem = input_file_problem(path); !problem.empty())
    throw UserError(path + ": cannot open safetensors file (" + problem + ")");
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
  mapping->fd = fd.fd;
  fd.fd = -1;  // owned by the mapping from here on
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
    ::posix_fadvise(mapping->fd, 0, 0, POSIX_FADV_SEQUENTIAL);    // for read_into's pread() (larger read-ahead)
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
    // The parser's message quotes the bytes it stopped at: escaped, so a damaged header puts no raw non-UTF-8
    // bytes into an error line or the --resume fallback warning.
    throw UserError(path_ + ": header is not valid JSON (" + printable(e.what()) + ")");
  }
  if (!root.is_object()) {
    throw UserError(path_ + ": header is JSON " + std::string(root.type_name()) + ", expected an object");
  }
  if (!duplicate_key.empty()) throw UserError(path_ + ": header has duplicate key " + quote_value(duplicate_key));

  const uint64_t data_len = mapping_->length - data_start_;
  for (const auto& [name, entry] : root.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        throw UserError(path_ + ": __metadata__ is JSON " + std::string(entry.type_name()) +
                        ", expected an object of strings");
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          throw UserError(path_ + ": __metadata__[" + quote_value(key) + "] is JSON " + std::string(value.type_name()) +
                          ", expected a string");
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }

    const std::string where = path_ + ": tensor " + quote_value(name);
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
  read_into_many({{name, dst}}, {}, chunk_bytes);
}

void SafetensorsFile::read_into_many(const std::vector<std::pair<std::string, torch::Tensor>>& requests,
                                     const std::function<void(const std::string&, uint64_t)>& on_done,
                                     uint64_t chunk_bytes) const {
  // Validate every request before reading anything.
  for (const auto& [name, dst] : requests) {
    const TensorInfo& ti = info(name);
    PI0_CHECK(dst.defined(), "read_into: undefined destination for '", name, "'");
    if (dst.sizes() != torch::IntArrayRef(ti.shape)) {
      throw UserError(path_ + ": tensor '" + name + "' has shape " + c10::str(torch::IntArrayRef(ti.shape)) +
                      ", but the destination has shape " + c10::str(dst.sizes()));
    }
  }
  torch::NoGradGuard no_grad;  // destinations are typically parameters that require grad
  // File order, so the disk sees one sequential stream whatever order the model lists its parameters in.
  std::vector<const std::pair<std::string, torch::Tensor>*> order;
  for (const auto& r : requests) order.push_back(&r);
  std::stable_sort(order.begin(), order.end(),
                   [&](const auto* a, const auto* b) { return info(a->first).data_begin < info(b->first).data_begin; });

  // One job per chunk of a streamed tensor: (request, first element, element count). A destination that is not
  // contiguous is copied from the mapping in one piece instead (never the case for parameters or optimizer state).
  struct Job {
    const std::pair<std::string, torch::Tensor>* request;
    int64_t begin, count;
  };
  std::vector<Job> jobs;
  uint64_t slot_bytes = 64;  // the largest streamed chunk
  const uint64_t chunk = std::max<uint64_t>(chunk_bytes, 64);
  for (const auto* r : order) {
    const TensorInfo& ti = info(r->first);
    if (ti.nbytes() == 0) continue;
    if (!r->second.is_contiguous()) {
      jobs.push_back({r, 0, -1});
      continue;
    }
    const auto elem = static_cast<int64_t>(c10::elementSize(ti.scalar_type));
    const int64_t per_chunk = std::max<int64_t>(1, static_cast<int64_t>(chunk) / elem);
    for (int64_t b = 0; b < ti.numel(); b += per_chunk) {
      jobs.push_back({r, b, std::min(per_chunk, ti.numel() - b)});
      slot_bytes = std::max<uint64_t>(slot_bytes, static_cast<uint64_t>(jobs.back().count * elem));
    }
  }

  // A reader thread pread()s the chunks, in file order, into a ring of staging buffers while this thread copies
  // (or converts) the previous ones into their destinations, so the disk never waits for the conversion and the
  // conversion never waits for page faults, and the resident set grows by the ring (kRingSlots chunks), not the
  // file. Chunks of 1 MiB and more are read with O_DIRECT (whole 4 KiB blocks around the chunk, straight from the
  // disk into the buffer): on the benchmark machine buffered reads of a cold file reached only 0.35-0.6x of the
  // disk's O_DIRECT speed, page-cache insertion being the limit (docs/benchmarks.md). Small tensors, foreign
  // files with unaligned tensors, and file systems without O_DIRECT use buffered pread() with the kernel's
  // read-ahead (POSIX_FADV_SEQUENTIAL, set by AccessPattern::kSequential).
  constexpr size_t kRingSlots = 3;
  constexpr uint64_t kBlock = 4096, kDirectMin = 1ull << 20;
  std::vector<torch::Tensor> ring;
  std::vector<char*> slots;  // 4 KiB-aligned inside each ring tensor, with a block of slack at either end
  for (size_t i = 0; i < std::min(kRingSlots, jobs.size()); ++i) {
    ring.push_back(torch::empty({static_cast<int64_t>(slot_bytes + 3 * kBlock)}, torch::kUInt8));
    const auto base = reinterpret_cast<uintptr_t>(ring.back().data_ptr());
    slots.push_back(reinterpret_cast<char*>((base + kBlock - 1) / kBlock * kBlock));
  }
  std::vector<uint64_t> staged_at(jobs.size(), 0);  // where job j's first byte lies in its slot

  std::mutex mutex;
  std::condition_variable cv;
  size_t produced = 0, consumed = 0;  // jobs read into the ring / copied out of it
  bool stop = false;
  std::exception_ptr read_error;
  const int fd = mapping_->fd;
  FdGuard direct{jobs.empty() ? -1 : ::open(path_.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC)};
  auto read_fully = [&](int from, char* out, uint64_t offset, uint64_t want, uint64_t need, const Job& job) {
    uint64_t have = 0;
    while (have < need) {
      const ssize_t n = ::pread(from, out + have, want - have, static_cast<off_t>(offset + have));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return errno;
      if (n == 0) {
        throw UserError(path_ + ": file ended early while reading '" + job.request->first + "' (truncated while open?)");
      }
      have += static_cast<uint64_t>(n);
    }
    return 0;
  };
  auto reader = [&] {
    try {
      for (size_t j = 0; j < jobs.size(); ++j) {
        {
          std::unique_lock<std::mutex> lock(mutex);
          cv.wait(lock, [&] { return stop || j - consumed < ring.size(); });
          if (stop) return;
        }
        const Job& job = jobs[j];
        if (job.count >= 0) {  // (a non-contiguous destination is copied from the mapping by the consumer)
          const TensorInfo& ti = info(job.request->first);
          const uint64_t elem = c10::elementSize(ti.scalar_type);
          char* slot = slots[j % slots.size()];
          const uint64_t offset = data_start_ + ti.data_begin + static_cast<uint64_t>(job.begin) * elem;
          const uint64_t len = static_cast<uint64_t>(job.count) * elem;
          int err = -1;
          if (direct.fd >= 0 && len >= kDirectMin && offset % elem == 0) {
            const uint64_t lo = offset / kBlock * kBlock, hi = (offset + len + kBlock - 1) / kBlock * kBlock;
            err = read_fully(direct.fd, slot, lo, hi - lo, offset + len - lo, job);
            if (err == 0) staged_at[j] = offset - lo;
            if (err == EINVAL) {  // no O_DIRECT here after all (some file systems): buffered from now on
              ::close(direct.fd);
              direct.fd = -1;
            }
          }
          if (err != 0) {
            staged_at[j] = 0;
            err = read_fully(fd, slot, offset, len, len, job);
            if (err != 0) throw UserError(path_ + ": read failed (" + errno_text(err) + ")");
          }
        }
        std::lock_guard<std::mutex> lock(mutex);
        ++produced;
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      read_error = std::current_exception();
      cv.notify_all();
    }
  };
  std::thread thread(reader);
  // Stops and joins the reader however this function exits (a failing copy_ must not leave it running).
  struct Join {
    std::thread& thread;
    std::mutex& mutex;
    std::condition_variable& cv;
    bool& stop;
    ~Join() {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
      }
      cv.notify_all();
      thread.join();
    }
  } join{thread, mutex, cv, stop};

  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (size_t j = 0; j < jobs.size(); ++j) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return produced > j || read_error; });
      if (produced <= j) std::rethrow_exception(read_error);
    }
    const Job& job = jobs[j];
    const std::string& name = job.request->first;
    const torch::Tensor& dst = job.request->second;
    const TensorInfo& ti = info(name);
    if (job.count < 0) {
      dst.copy_(get(name));
      release(name);
    } else {
      const int64_t dst_elem = static_cast<int64_t>(dst.element_size());
      char* const dst_chunk = static_cast<char*>(dst.data_ptr()) + job.begin * dst_elem;
      if (dst.device().is_cpu()) {
        // Fault the destination chunk in with one call: a freshly allocated parameter otherwise takes one
        // user-mode page fault per 4 KiB, which costs more than the copy itself (~1.7x faster measured). A hint:
        // kernels before 5.14 reject it and the copy faults the pages in as usual. Inward to whole pages.
        const uintptr_t lo = (reinterpret_cast<uintptr_t>(dst_chunk) + page - 1) / page * page;
        const uintptr_t hi = (reinterpret_cast<uintptr_t>(dst_chunk) + job.count * dst_elem) / page * page;
        if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
      }
      void* staged = slots[j % slots.size()] + staged_at[j];
      if (dst.device().is_cpu() && dst.scalar_type() == ti.scalar_type && !dst.is_conj() && !dst.is_neg()) {
        std::memcpy(dst_chunk, staged, static_cast<size_t>(job.count * dst_elem));
        if (job.begin + job.count == ti.numel()) dst.unsafeGetTensorImpl()->bump_version();  // memcpy bypassed it
      } else {
        dst.view({-1}).narrow(0, job.begin, job.count).copy_(
            torch::from_blob(staged, {job.count}, torch::TensorOptions().dtype(ti.scalar_type)));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++consumed;
    }
    cv.notify_all();
    const bool last_of_tensor = job.count < 0 || job.begin + job.count == ti.numel();
    if (last_of_tensor && on_done) on_done(name, ti.nbytes());
  }
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
  require_output_file(path);  // never rename over a device, FIFO or socket (--out /dev/null as root)
  require_output_file(tmp_path);
  create_parent_directories(path);  // pi0-infer --out results/x.safetensors: the folder is made, as every writer does
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
