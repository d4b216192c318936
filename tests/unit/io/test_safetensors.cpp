// Tests for pi0::io safetensors reading and writing: bit-exact round trips, header layout, zero-copy views, every
// validation error by its text, and the atomic-write guarantee.
#include <catch2/catch.hpp>

#include <torch/version.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/io/safetensors.h"

namespace fs = std::filesystem;
using pi0::UserError;
using pi0::io::SafetensorsFile;
using pi0::io::save_safetensors;

namespace {

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto stamp = std::chrono::steady_clock::now().time_since_epoch().count();
    path_ = fs::temp_directory_path() / ("pi0_test_safetensors_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(stamp) + "_" + std::to_string(counter++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// A safetensors image from a header text and a data buffer; `header_len` overrides the length field.
std::string make_image(const std::string& header, const std::string& data,
                       std::optional<uint64_t> header_len = std::nullopt) {
  const uint64_t len = header_len.value_or(header.size());
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + header + data;
}

bool same_bytes(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const torch::Tensor ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

/// Random bit patterns of `dtype` (every bit pattern is legal except for bool), with special values at the front
/// for floating types: NaN with payload, negative NaN, +-Inf, -0, a subnormal.
torch::Tensor random_tensor(torch::ScalarType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  if (dtype == torch::kBool) {
    auto* p = t.data_ptr<bool>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = (rng() & 1) != 0;
    return t;
  }
  auto* bytes = static_cast<uint8_t*>(t.data_ptr());
  for (int64_t i = 0; i < t.numel() * t.element_size(); ++i) bytes[i] = static_cast<uint8_t>(rng());
  auto put = [&](int64_t index, uint64_t bits) {
    if (index < t.numel()) std::memcpy(bytes + index * t.element_size(), &bits, t.element_size());
  };
  std::vector<uint64_t> specials;
  if (dtype == torch::kFloat64) {
    specials = {0x7ff0000000000001ull, 0xfff8000000000123ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
                0x8000000000000000ull, 0x0000000000000001ull};
  } else if (dtype == torch::kFloat32) {
    specials = {0x7fa00001u, 0xffc00123u, 0x7f800000u, 0xff800000u, 0x80000000u, 0x00000001u};
  } else if (dtype == torch::kFloat16) {
    specials = {0x7d01u, 0xfe23u, 0x7c00u, 0xfc00u, 0x8000u, 0x0001u};
  } else if (dtype == torch::kBFloat16) {
    specials = {0x7f81u, 0xffc3u, 0x7f80u, 0xff80u, 0x8000u, 0x0001u};
  }
  for (size_t i = 0; i < specials.size(); ++i) put(static_cast<int64_t>(i), specials[i]);
  return t;
}

const std::vector<std::pair<std::string, torch::ScalarType>> kAllDtypes = {
    {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
    {"I64", torch::kInt64},   {"I32", torch::kInt32},   {"I16", torch::kInt16},   {"I8", torch::kInt8},
    {"U8", torch::kUInt8},    {"BOOL", torch::kBool}};

/// Address range of the mapping of `path` in this process that contains `ptr`, from /proc/self/maps; {0, 0} if none.
std::pair<uintptr_t, uintptr_t> mapping_containing(const void* ptr, const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  // weakly_canonical: the kernel shows a deleted file as "<path> (deleted)", which does not exist on disk.
  const std::string canonical = fs::weakly_canonical(path).string();
  std::string line;
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    if (p >= lo && p < hi && line.size() >= canonical.size() &&
        line.compare(line.size() - canonical.size(), canonical.size(), canonical) == 0) {
      return {lo, hi};
    }
  }
  return {0, 0};
}

}  // namespace

TEST_CASE("safetensors dtype names map to torch scalar types", "[unit][safetensors]") {
  for (const auto& [name, type] : kAllDtypes) {
    REQUIRE(pi0::io::scalar_type_from_dtype(name) == type);
    REQUIRE(pi0::io::dtype_from_scalar_type(type) == name);
  }
  REQUIRE_FALSE(pi0::io::scalar_type_from_dtype("F31").has_value());
  REQUIRE_FALSE(pi0::io::dtype_from_scalar_type(torch::kComplexFloat).has_value());
}

TEST_CASE("safetensors round trip is bit-exact for every dtype, 0-dim and empty tensors", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  std::mt19937 rng(1234);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& [name, type] : kAllDtypes) {
    tensors.emplace_back("t_" + name, random_tensor(type, {3, 5, 7}, rng));
    tensors.emplace_back("scalar_" + name, random_tensor(type, {}, rng));
    tensors.emplace_back("empty_" + name, random_tensor(type, {0, 4}, rng));
    tensors.emplace_back("odd_" + name, random_tensor(type, {13}, rng));  // odd byte counts exercise the layout
  }
  // A non-contiguous input is written in logical (row-major) order.
  tensors.emplace_back("transposed", torch::arange(12, torch::kFloat32).reshape({3, 4}).t());
  save_safetensors(path, tensors);

  SafetensorsFile file(path);
  REQUIRE(file.size() == tensors.size());
  REQUIRE(std::is_sorted(file.names().begin(), file.names().end()));
  for (const auto& [name, expected] : tensors) {
    INFO(name);
    REQUIRE(file.contains(name));
    const auto& info = file.info(name);
    REQUIRE(info.scalar_type == expected.scalar_type());
    REQUIRE(info.shape == expected.sizes().vec());
    REQUIRE(info.nbytes() == static_cast<uint64_t>(expected.numel() * expected.element_size()));
    REQUIRE(same_bytes(file.get(name), expected));
    REQUIRE(same_bytes(file.get_copy(name), expected));
  }
  REQUIRE(file.get("scalar_F32").dim() == 0);
  REQUIRE(file.get("empty_BF16").sizes() == torch::IntArrayRef({0, 4}));
  REQUIRE(file.metadata().empty());
  REQUIRE_FALSE(file.contains("missing"));
}

TEST_CASE("safetensors metadata round trips", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("meta.safetensors");
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"model", "pi0"}, {"quote \"and\" newline\n", "utf-8: \xc3\xa9"}, {"empty", ""}};
  save_safetensors(path, {{"w", torch::ones({2})}}, metadata);
  SafetensorsFile file(path);
  REQUIRE(file.metadata() == metadata);

  // Metadata only, no tensors, is a valid file too.
  save_safetensors(path, {}, {{"only", "metadata"}});
  SafetensorsFile empty(path);
  REQUIRE(empty.size() == 0);
  REQUIRE(empty.metadata().at("only") == "metadata");
}

TEST_CASE("safetensors reader and writer close their file descriptors", "[unit][safetensors][inputs]") {
  // Found by fuzz/safetensors.cpp: the descriptor guard never closed, so a long-running process (a server, the
  // fuzzer) ran out of descriptors after ~1000 files.
  TempDir dir;
  const std::string path = dir.file("fd.safetensors");
  auto open_fds = [] {
    return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{});
  };
  save_safetensors(path, {{"w", torch::ones({2})}});
  write_bytes(dir.file("bad.safetensors"), std::string("\x10\0\0\0\0\0\0\0{\"a\":1}", 15));
  const auto before = open_fds();
  for (int i = 0; i < 50; ++i) {
    save_safetensors(path, {{"w", torch::ones({2})}});
    SafetensorsFile file(path);
    CHECK(file.get_copy("w").sum().item<float>() == 2.0f);
    CHECK_THROWS_AS(SafetensorsFile(dir.file("bad.safetensors")), UserError);
  }
  CHECK(open_fds() == before);
}

TEST_CASE("safetensors writer pads the header and lays out aligned, gap-free data", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  // Names chosen so name order alone would misalign: a 3-byte tensor sorts before the float64 one.
  save_safetensors(path, {{"a_u8", torch::ones({3}, torch::kUInt8)},
                          {"b_f64", torch::ones({5}, torch::kFloat64)},
                          {"c_bf16", torch::ones({3}, torch::kBFloat16)},
                          {"d_f32", torch::ones({1}, torch::kFloat32)}},
                   {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  REQUIRE(header_len % 8 == 0);
  const std::string header = bytes.substr(8, header_len);
  // Keys appear in sorted order in the header text.
  REQUIRE(header.find("\"__metadata__\"") < header.find("\"a_u8\""));
  REQUIRE(header.find("\"a_u8\"") < header.find("\"b_f64\""));
  REQUIRE(header.find("\"b_f64\"") < header.find("\"c_bf16\""));
  REQUIRE(header.find("\"c_bf16\"") < header.find("\"d_f32\""));
  REQUIRE(header.find_last_not_of(' ') == header.find_last_of('}'));  // only spaces after the JSON

  SafetensorsFile file(path);
  REQUIRE(file.data_start() == 8 + header_len);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& name : file.names()) {
    const auto& info = file.info(name);
    REQUIRE(info.data_begin % c10::elementSize(info.scalar_type) == 0);
    ranges.emplace_back(info.data_begin, info.data_end);
  }
  std::sort(ranges.begin(), ranges.end());
  REQUIRE(ranges.front().first == 0);
  for (size_t i = 1; i < ranges.size(); ++i) REQUIRE(ranges[i].first == ranges[i - 1].second);
  REQUIRE(ranges.back().second == file.file_size() - file.data_start());  // the data buffer is covered exactly
}

TEST_CASE("safetensors get() views the mapping without copying and outlives the file object",
          "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("view.safetensors");
  const torch::Tensor a = torch::arange(1000, torch::kFloat32).reshape({10, 100});
  const torch::Tensor b = torch::arange(64, torch::kInt64);
  save_safetensors(path, {{"a", a}, {"b", b}});

  torch::Tensor view_a, view_b;
  {
    SafetensorsFile file(path, pi0::io::AccessPattern::kSequential);
    view_a = file.get("a");
    view_b = file.get("b");
    // Both views lie inside this process's mapping of the file, at exactly their offsets in the data buffer.
    const auto [lo, hi] = mapping_containing(view_a.data_ptr(), path);
    REQUIRE(lo != 0);
    const auto pa = reinterpret_cast<uintptr_t>(view_a.data_ptr());
    const auto pb = reinterpret_cast<uintptr_t>(view_b.data_ptr());
    REQUIRE(pa + a.nbytes() <= hi);
    REQUIRE(pa - lo == file.data_start() + file.info("a").data_begin);
    REQUIRE(pb - lo == file.data_start() + file.info("b").data_begin);
    REQUIRE(reinterpret_cast<uintptr_t>(view_a.data_ptr()) % alignof(float) == 0);

    // get_copy is an owned copy, outside the mapping; with a dtype it converts.
    const torch::Tensor copy = file.get_copy("a");
    REQUIRE(mapping_containing(copy.data_ptr(), path).first == 0);
    REQUIRE(torch::equal(copy, a));
    copy.add_(1);  // writable
    const torch::Tensor as_bf16 = file.get_copy("a", torch::kBFloat16);
    REQUIRE(as_bf16.scalar_type() == torch::kBFloat16);
    REQUIRE(torch::equal(as_bf16, a.to(torch::kBFloat16)));

    // release() drops the pages from the resident set but the view still reads the same data.
    file.release("a");
    REQUIRE(torch::equal(view_a, a));
  }
  // The file object is gone and the file unlinked; the views keep the mapping alive.
  fs::remove(path);
  REQUIRE(torch::equal(view_a, a));
  REQUIRE(torch::equal(view_b, b));
  const void* ptr = view_a.data_ptr();
  REQUIRE(mapping_containing(ptr, path + " (deleted)").first != 0);
  view_a = torch::Tensor();
  view_b = torch::Tensor();
  REQUIRE(mapping_containing(ptr, path + " (deleted)").first == 0);  // last view gone: unmapped
}

TEST_CASE("safetensors reader returns an aligned copy for a misaligned tensor", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("misaligned.safetensors");
  const float values[2] = {1.5f, -2.25f};
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  // Header of 8-multiple length so only the tensor offset (1) is misaligned.
  std::string header = R"({"pad":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                       R"("x":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  write_bytes(path, make_image(header, data));
  SafetensorsFile file(path);
  const torch::Tensor x = file.get("x");
  REQUIRE(reinterpret_cast<uintptr_t>(x.data_ptr()) % alignof(float) == 0);
  REQUIRE(x[0].item<float>() == 1.5f);
  REQUIRE(x[1].item<float>() == -2.25f);
  REQUIRE(file.get("pad").item<uint8_t>() == 7);
}

TEST_CASE("safetensors reader tolerates gaps and trailing bytes", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("gaps.safetensors");
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},)"
                             R"("z":{"dtype":"U8","shape":[0],"data_offsets":[5,5]}}   )";
  write_bytes(path, make_image(header, std::string("\0\0\0\0\x01\x02\0\0\0", 9)));
  SafetensorsFile file(path);
  REQUIRE(file.get("a")[1].item<uint8_t>() == 2);
  REQUIRE(file.get("z").numel() == 0);  // an empty tensor inside another tensor's range is not an overlap
}

TEST_CASE("safetensors reader rejects corrupt files with a specific message", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string data16(16, '\0');
  struct Case {
    const char* label;
    std::string image;
    const char* message;
  };
  auto entry = [](const std::string& body) { return "{\"t\":" + body + "}"; };
  const std::vector<Case> cases = {
      {"empty file", "", "file is 0 bytes, shorter than the 8-byte header length"},
      {"7 bytes", std::string(7, '\0'), "file is 7 bytes, shorter than the 8-byte header length"},
      {"header length beyond the file", make_image("{}", "", 100), "header length 100 exceeds the 2 bytes"},
      {"header length near 2^64", make_image("{}", "", ~uint64_t{1}), "exceeds the 2 bytes after the length field"},
      {"not JSON", make_image("{\"t\": nope}", ""), "header is not valid JSON"},
      {"truncated JSON", make_image("{\"t\": {", ""), "header is not valid JSON"},
      {"JSON array", make_image("[1, 2]", ""), "header is JSON array, expected an object"},
      {"duplicate key",
       make_image(R"({"t":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                  R"("t":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                  data16),
       "header has duplicate key 't'"},
      {"entry not an object", make_image(entry("3"), ""), "tensor 't' is JSON number, expected an object"},
      {"missing dtype", make_image(entry(R"({"shape":[1],"data_offsets":[0,4]})"), data16), "tensor 't' has no 'dtype'"},
      {"missing shape", make_image(entry(R"({"dtype":"F32","data_offsets":[0,4]})"), data16),
       "tensor 't' has no 'shape'"},
      {"missing offsets", make_image(entry(R"({"dtype":"F32","shape":[1]})"), data16),
       "tensor 't' has no 'data_offsets'"},
      {"dtype not a string", make_image(entry(R"({"dtype":1,"shape":[1],"data_offsets":[0,4]})"), data16),
       "tensor 't': dtype is JSON number"},
      {"unknown dtype", make_image(entry(R"({"dtype":"F31","shape":[1],"data_offsets":[0,4]})"), data16),
       "tensor 't': unknown dtype 'F31'; expected one of F64, F32, F16, BF16"},
#if !(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3))
      // U16/U32/U64 exist in LibTorch >= 2.3 (read there as kUInt16/32/64; see safetensors.h); before, a clear error.
      {"unsupported dtype", make_image(entry(R"({"dtype":"U32","shape":[1],"data_offsets":[0,4]})"), data16),
       "tensor 't': dtype U32 is not supported by LibTorch"},
#endif
      {"shape not an array", make_image(entry(R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})"), data16),
       "tensor 't': shape is JSON number"},
      {"negative shape", make_image(entry(R"({"dtype":"F32","shape":[2,-1],"data_offsets":[0,4]})"), data16),
       "shape [2,-1] has a negative dimension"},
      {"fractional shape", make_image(entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), data16),
       "shape [1.5] has a non-integer dimension"},
      {"overflowing shape",
       make_image(entry(R"({"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,4]})"), data16),
       "is too large (byte size overflows 64 bits)"},
      {"offsets not a pair", make_image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), data16),
       "data_offsets [0] must be [begin, end] with non-negative integers"},
      {"negative offset", make_image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[-4,0]})"), data16),
       "data_offsets [-4,0] must be [begin, end]"},
      {"begin > end", make_image(entry(R"({"dtype":"U8","shape":[0],"data_offsets":[8,4]})"), data16),
       "data_offsets [8,4] have begin > end"},
      {"offsets outside the buffer", make_image(entry(R"({"dtype":"F32","shape":[4],"data_offsets":[8,24]})"), data16),
       "data_offsets [8,24] lie outside the data buffer of 16 bytes"},
      {"size mismatch", make_image(entry(R"({"dtype":"F32","shape":[4],"data_offsets":[0,12]})"), data16),
       "data_offsets [0,12] span 12 bytes, but dtype F32 and shape [4] need 16"},
      {"overlap",
       make_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                  data16),
       "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
      {"metadata not an object", make_image(R"({"__metadata__":[1]})", ""),
       "__metadata__ is JSON array, expected an object of strings"},
      {"metadata value not a string", make_image(R"({"__metadata__":{"step":5}})", ""),
       "__metadata__['step'] is JSON number, expected a string"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.label) {
      write_bytes(path, c.image);
      REQUIRE_THROWS_AS(SafetensorsFile(path), UserError);
      REQUIRE_THROWS_WITH(SafetensorsFile(path), Catch::StartsWith(path + ": ") && Catch::Contains(c.message));
    }
  }
  SECTION("missing file") {
    REQUIRE_THROWS_WITH(SafetensorsFile(dir.file("nope.safetensors")),
                        Catch::Contains("nope.safetensors: cannot open safetensors file (file not found)"));
  }
  SECTION("a directory") {
    fs::create_directories(dir.file("a_dir"));
    REQUIRE_THROWS_WITH(SafetensorsFile(dir.file("a_dir")),
                        Catch::EndsWith("a_dir: cannot open safetensors file (is a directory, not a regular file)"));
  }
  SECTION("raw bytes of a damaged header are escaped in the message (issue 23 item 8)") {
    // Not valid JSON, with bytes that are not UTF-8: the parser's message quotes them, the message escapes them.
    write_bytes(path, make_image("{\"t\xff\xfe\x87\": nope}", ""));
    std::string what;
    try {
      SafetensorsFile file(path);
    } catch (const UserError& e) {
      what = e.what();
    }
    CHECK_THAT(what, Catch::Contains("header is not valid JSON") && Catch::Contains("\\x"));
    CHECK(what.find('\xff') == std::string::npos);
    CHECK(what.find('\x87') == std::string::npos);
  }
  SECTION("unknown tensor name") {
    save_safetensors(path, {{"w", torch::ones({1})}});
    SafetensorsFile file(path);
    REQUIRE_THROWS_WITH(file.get("v"), path + ": no tensor named 'v' (file has 1 tensors)");
    REQUIRE_THROWS_AS(file.info("v"), UserError);
  }
}

TEST_CASE("safetensors reader never crashes on truncated or corrupted files", "[unit][safetensors]") {
  TempDir dir;
  const std::string good = dir.file("good.safetensors");
  const std::string bad = dir.file("bad.safetensors");
  save_safetensors(good, {{"a", torch::arange(6, torch::kFloat32)}, {"b", torch::ones({2, 2}, torch::kInt16)}},
                   {{"k", "v"}});
  const std::string bytes = read_bytes(good);
  // Every truncation loses data the header points at (the writer leaves no trailing bytes), so each must fail.
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(bad, bytes.substr(0, len));
    INFO("length " << len);
    REQUIRE_THROWS_AS(SafetensorsFile(bad), UserError);
  }
  // Random byte changes in the length field and header: either a clean UserError or a file that loads and reads.
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    std::string corrupt = bytes;
    const size_t flips = 1 + rng() % 3;
    for (size_t i = 0; i < flips; ++i) corrupt[rng() % (8 + header_len)] = static_cast<char>(rng());
    write_bytes(bad, corrupt);
    try {
      SafetensorsFile file(bad);
      for (const auto& name : file.names()) (void)file.get(name).sum();
    } catch (const UserError&) {
    }
  }
}

TEST_CASE("save_safetensors rejects bad input and leaves the old file intact", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"old", torch::ones({4})}});
  const std::string old_bytes = read_bytes(path);
  auto expect_old_file_intact = [&]() {
    REQUIRE(read_bytes(path) == old_bytes);
    REQUIRE_FALSE(fs::exists(path + ".tmp"));
    REQUIRE(SafetensorsFile(path).contains("old"));
  };

  SECTION("duplicate names") {
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", torch::ones({1})}, {"w", torch::zeros({1})}}),
                        path + ": tensor 'w' appears twice; tensor names must be unique");
    expect_old_file_intact();
  }
  SECTION("reserved name") {
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"__metadata__", torch::ones({1})}}),
                        Catch::Contains("the name __metadata__ is reserved"));
    expect_old_file_intact();
  }
  SECTION("dtype safetensors cannot store") {
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"c", torch::ones({2}, torch::kComplexFloat)}}),
                        Catch::StartsWith(path + ": tensor 'c' has dtype ComplexFloat, which safetensors cannot store"));
    expect_old_file_intact();
  }
  SECTION("undefined tensor") {
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"u", torch::Tensor()}}), path + ": tensor 'u' is an undefined tensor");
    expect_old_file_intact();
  }
  SECTION("sparse tensor") {
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"s", torch::eye(3).to_sparse()}}),
                        Catch::Contains("tensor 's' has a non-strided layout"));
    expect_old_file_intact();
  }
  SECTION("failure in the middle of writing the data") {
    // Meta tensors pass validation but have no data to copy out: the failure happens after "a" was written.
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"a", torch::ones({1000})},
                                                {"z", torch::empty({4}, torch::TensorOptions().device(torch::kMeta))}}),
                        Catch::StartsWith(path + ": tensor 'z' cannot be copied to CPU"));
    expect_old_file_intact();
  }
  SECTION("temporary file cannot be created") {
    fs::create_directories(path + ".tmp");  // the .tmp path is taken by a directory: never replaced
    REQUIRE_THROWS_WITH(save_safetensors(path, {{"w", torch::ones({1})}}),
                        path + ".tmp: exists and is a directory, not a regular file; refusing to write over it "
                        "(give a file path)");
    REQUIRE(read_bytes(path) == old_bytes);
    fs::remove(path + ".tmp");
  }
  SECTION("a folder that does not exist is created; one that cannot be is named, not the temporary") {
    const std::string missing = dir.file("no_such_dir/deeper/model.safetensors");
    save_safetensors(missing, {{"w", torch::ones({1})}});
    REQUIRE(SafetensorsFile(missing).contains("w"));
    std::ofstream(dir.file("a_file")) << "x";
    const std::string blocked = dir.file("a_file/sub/model.safetensors");
    REQUIRE_THROWS_WITH(save_safetensors(blocked, {{"w", torch::ones({1})}}),
                        blocked + ": cannot create its folder '" + dir.file("a_file/sub") + "' ('" + dir.file("a_file") +
                            "' is a regular file)");
  }
  SECTION("a successful save replaces the old file and leaves no temporary") {
    save_safetensors(path, {{"new", torch::zeros({2})}});
    REQUIRE_FALSE(fs::exists(path + ".tmp"));
    SafetensorsFile file(path);
    REQUIRE(file.contains("new"));
    REQUIRE_FALSE(file.contains("old"));
  }
}

TEST_CASE("a view survives the file being replaced by an atomic save", "[unit][safetensors]") {
  // Training overwrites checkpoints in place while a loaded view may still exist: rename() gives the path a new
  // inode, so the old mapping keeps the old contents.
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  save_safetensors(path, {{"w", torch::full({256}, 3.0f)}});
  torch::Tensor view = SafetensorsFile(path).get("w");
  save_safetensors(path, {{"w", torch::full({256}, 4.0f)}});
  REQUIRE(torch::equal(view, torch::full({256}, 3.0f)));
  REQUIRE(torch::equal(SafetensorsFile(path).get("w"), torch::full({256}, 4.0f)));
}

TEST_CASE("safetensors read_into copies into parameters chunk by chunk", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("params.safetensors");
  // 25,003 floats: several 4 KiB chunks with a ragged tail, so chunk edges never line up with pages.
  const torch::Tensor w = torch::randn({25003});
  const torch::Tensor m = torch::randn({37, 53}).to(torch::kBFloat16);
  save_safetensors(path, {{"w", w}, {"m", m}});
  SafetensorsFile file(path);

  // Same dtype, contiguous CPU: raw chunk copies. Works on a parameter that requires grad and bumps its version.
  const torch::Tensor dst_w = torch::empty({25003}).requires_grad_();
  const auto version = dst_w._version();
  file.read_into("w", dst_w, 4096);
  REQUIRE(same_bytes(dst_w.detach(), w));
  REQUIRE(dst_w._version() > version);
  const torch::Tensor dst_one_chunk = torch::empty({25003});
  file.read_into("w", dst_one_chunk);
  REQUIRE(same_bytes(dst_one_chunk, w));

  // Conversion: the chunked copy out of the mapping, with chunks that straddle pages.
  const torch::Tensor dst_f64 = torch::empty({25003}, torch::kFloat64).requires_grad_();
  file.read_into("w", dst_f64, 4096);
  REQUIRE(torch::equal(dst_f64.detach(), w.to(torch::kFloat64)));

  // Conversion on the way (bf16 checkpoint into float32 parameters) and a non-contiguous destination.
  const torch::Tensor dst_f32 = torch::empty({37, 53});
  file.read_into("m", dst_f32, 1000);
  REQUIRE(torch::equal(dst_f32, m.to(torch::kFloat32)));
  const torch::Tensor dst_t = torch::empty({53, 37}, torch::kBFloat16).t();
  file.read_into("m", dst_t, 1000);
  REQUIRE(same_bytes(dst_t, m));

  REQUIRE_THROWS_WITH(file.read_into("m", torch::empty({53, 37})),
                      path + ": tensor 'm' has shape [37, 53], but the destination has shape [53, 37]");
  // Views handed out earlier still read correctly after their pages were released.
  REQUIRE(same_bytes(file.get("w"), w));
}

TEST_CASE("safetensors read_into_many reads in file order with large chunks straight from the disk", "[unit][safetensors]") {
  TempDir dir;
  const std::string path = dir.file("many.safetensors");
  // 'big' spans several 1 MiB chunks (the O_DIRECT path) with a ragged end; 'odd' and 'small' take the buffered
  // path; bf16 after float32 puts 'half' at an offset that is not a multiple of 4 KiB.
  const torch::Tensor big = torch::randn({3 * 262144 + 1001});
  const torch::Tensor odd = torch::randn({7, 5});
  const torch::Tensor half = torch::randn({600000}).to(torch::kBFloat16);
  save_safetensors(path, {{"big", big}, {"odd", odd}, {"half", half}});
  SafetensorsFile file(path, pi0::io::AccessPattern::kSequential);

  const torch::Tensor dst_big = torch::empty_like(big), dst_odd = torch::empty({7, 5}, torch::kFloat64);
  const torch::Tensor dst_half = torch::empty({600000});
  std::vector<std::string> done;
  // Requested out of file order, with 1 MiB chunks so 'big' and 'half' take several.
  file.read_into_many({{"half", dst_half}, {"odd", dst_odd}, {"big", dst_big}},
                      [&](const std::string& name, uint64_t) { done.push_back(name); }, 1ull << 20);
  REQUIRE(same_bytes(dst_big, big));
  REQUIRE(torch::equal(dst_odd, odd.to(torch::kFloat64)));
  REQUIRE(torch::equal(dst_half, half.to(torch::kFloat32)));
  std::vector<std::string> file_order = {"big", "odd", "half"};
  std::sort(file_order.begin(), file_order.end(),
            [&](const auto& a, const auto& b) { return file.info(a).data_begin < file.info(b).data_begin; });
  REQUIRE(done == file_order);

  // Shapes are all checked before anything is read: a bad request leaves the good one untouched.
  const torch::Tensor untouched = torch::zeros_like(big);
  REQUIRE_THROWS_WITH(file.read_into_many({{"big", untouched}, {"odd", torch::empty({5, 7})}}),
                      path + ": tensor 'odd' has shape [7, 5], but the destination has shape [5, 7]");
  REQUIRE(torch::count_nonzero(untouched).item<int64_t>() == 0);
}
