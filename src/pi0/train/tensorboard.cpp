#include "pi0/train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iterator>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/train/plot.h"

namespace pi0::train {
namespace fs = pi0::posix_fs;

namespace {

constexpr char kFilePrefix[] = "events.out.tfevents.";

// ---- CRC-32C ---------------------------------------------------------------------------------------------------

std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

// ---- protobuf wire format (only what Event needs) ----------------------------------------------------------------

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }
// Little-endian whatever the host's byte order (protobuf's fixed-width fields and TFRecord's header both are).
void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}
void put_int(std::string& out, uint32_t field, int64_t v) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(v));  // two's complement, as protobuf encodes a negative int64 or int32
}
void put_double(std::string& out, uint32_t field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed64);
  put_le(out, bits, 8);
}
void put_float(std::string& out, uint32_t field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  put_key(out, field, kFixed32);
  put_le(out, bits, 4);
}

// Event fields (tensorboard/compat/proto/event.proto, summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5,
                   kEventSessionLog = 7;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueImage = 4;
constexpr uint32_t kImageHeight = 1, kImageWidth = 2, kImageColorspace = 3, kImageEncoded = 4;
constexpr uint32_t kSessionLogStatus = 1;
constexpr int64_t kSessionStart = 1, kColorspaceRgb = 3;

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_double(e, kEventWallTime, wall_time);
  put_int(e, kEventStep, step);
  return e;
}

std::string event_with_summary(double wall_time, int64_t step, const std::vector<std::string>& values) {
  std::string summary;
  for (const auto& v : values) put_bytes(summary, kSummaryValue, v);
  auto e = event_header(wall_time, step);
  put_bytes(e, kEventSummary, summary);
  return e;
}

// Reads a varint at `pos`; false when the buffer ends inside it or it is longer than 10 bytes.
bool get_varint(const std::string& s, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 70 && pos < s.size(); shift += 7) {
    const auto byte = static_cast<uint8_t>(s[pos++]);
    v |= uint64_t{byte & 0x7Fu} << shift;
    if (!(byte & 0x80)) return true;
  }
  return false;
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("train.tensorboard: cannot read the event file '" + path + "'");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  std::string h(buf);
  for (auto& c : h)
    if (c == '/') c = '_';  // a file name component
  return h;
}

// Earlier starts' event files keep only the records of steps up to `step` (the file_version record always); a file
// left with nothing else is removed. Files that need no change are not touched.
void prune_event_files(const fs::path& dir, int64_t step) {
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    const bool temporary = name.size() >= 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;  // write_file_atomic's
    if (name.rfind(kFilePrefix, 0) != 0 || temporary || !entry.is_regular_file())
      continue;
    const auto path = entry.path().string();
    bool complete = true;
    const auto records = read_tfrecords(read_whole_file(path), &complete);
    std::string kept;
    size_t kept_events = 0, dropped = 0;
    for (const auto& r : records) {
      EventInfo info;
      try {
        info = decode_event(r);
      } catch (const UserError&) {
        ++dropped;  // a record with a valid checksum but not an Event: not ours to keep
        continue;
      }
      // At step 0 the run starts afresh and logs step 0 (its camera views) itself.
      const bool keep = info.file_version || (step > 0 && info.step <= step);
      if (!keep) {
        ++dropped;
        continue;
      }
      kept += tfrecord(r);
      if (!info.file_version) ++kept_events;
    }
    if (dropped == 0 && complete) continue;
    if (kept_events == 0) {
      fs::remove(path);
    } else {
      write_file_atomic(path, kept);
    }
  }
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const auto table = make_crc32c_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  put_le(out, data.size(), 8);
  put_le(out, masked_crc32c(out.data(), 8), 4);
  out += data;
  put_le(out, masked_crc32c(data.data(), data.size()), 4);
  return out;
}

std::vector<std::string> read_tfrecords(const std::string& bytes, bool* complete) {
  std::vector<std::string> records;
  size_t pos = 0;
  bool ok = true;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) {
      ok = false;
      break;
    }
    const char* head = bytes.data() + pos;
    const uint64_t length = get_le(head, 8);
    if (get_le(head + 8, 4) != masked_crc32c(head, 8) || length > bytes.size() - pos - 12 ||
        bytes.size() - pos - 12 - length < 4) {
      ok = false;
      break;
    }
    const char* data = head + 12;
    if (get_le(data + length, 4) != masked_crc32c(data, length)) {
      ok = false;
      break;
    }
    records.emplace_back(data, length);
    pos += 12 + length + 4;
  }
  if (complete) *complete = ok;
  return records;
}

std::string event_file_version(double wall_time) {
  auto e = event_header(wall_time, 0);
  put_bytes(e, kEventFileVersion, "brain.Event:2");
  return e;
}

std::string event_scalars(double wall_time, int64_t step, const std::map<std::string, double>& values) {
  std::vector<std::string> encoded;
  for (const auto& [tag, v] : values) {
    std::string value;
    put_bytes(value, kValueTag, tag);
    put_float(value, kValueSimpleValue, static_cast<float>(v));
    encoded.push_back(std::move(value));
  }
  return event_with_summary(wall_time, step, encoded);
}

std::string event_images(double wall_time, int64_t step, const std::vector<EventImage>& images) {
  std::vector<std::string> encoded;
  for (const auto& im : images) {
    std::string image;
    put_int(image, kImageHeight, im.height);
    put_int(image, kImageWidth, im.width);
    put_int(image, kImageColorspace, kColorspaceRgb);
    put_bytes(image, kImageEncoded, im.png);
    std::string value;
    put_bytes(value, kValueTag, im.tag);
    put_bytes(value, kValueImage, image);
    encoded.push_back(std::move(value));
  }
  return event_with_summary(wall_time, step, encoded);
}

std::string event_session_start(double wall_time, int64_t step) {
  std::string session_log;
  put_int(session_log, kSessionLogStatus, kSessionStart);
  auto e = event_header(wall_time, step);
  put_bytes(e, kEventSessionLog, session_log);
  return e;
}

EventInfo decode_event(const std::string& event) {
  EventInfo info;
  size_t pos = 0;
  const auto bad = [] { return UserError("train.tensorboard: an event record is not a valid Event protobuf"); };
  while (pos < event.size()) {
    uint64_t key = 0, v = 0;
    if (!get_varint(event, pos, key)) throw bad();
    const auto field = static_cast<uint32_t>(key >> 3);
    switch (static_cast<uint32_t>(key & 7)) {
      case kVarint:
        if (!get_varint(event, pos, v)) throw bad();
        if (field == kEventStep) info.step = static_cast<int64_t>(v);
        break;
      case kFixed64:
        if (event.size() - pos < 8) throw bad();
        pos += 8;
        break;
      case kFixed32:
        if (event.size() - pos < 4) throw bad();
        pos += 4;
        break;
      case kLengthDelimited:
        if (!get_varint(event, pos, v) || v > event.size() - pos) throw bad();
        if (field == kEventFileVersion) info.file_version = true;
        pos += static_cast<size_t>(v);
        break;
      default:
        throw bad();
    }
  }
  return info;
}

std::vector<EventImage> camera_views(const std::vector<torch::Tensor>& images, int64_t max_samples) {
  PI0_CHECK(!images.empty(), "camera_views: no camera images");
  std::vector<torch::Tensor> hwc;  // [B,S,S,3] uint8 per slot
  for (const auto& im : images)
    hwc.push_back(((im.detach().to(torch::kCPU, torch::kFloat32) + 1) * 127.5).round().clamp(0, 255)
                      .to(torch::kUInt8).permute({0, 2, 3, 1}));
  // Side by side, as openpi's np.concatenate(..., axis=1) over the slots.
  const auto row = torch::cat(hwc, /*dim=*/2).contiguous();
  std::vector<EventImage> out;
  for (int64_t b = 0; b < std::min(max_samples, row.size(0)); ++b) {
    const auto img = row[b].contiguous();
    const int h = static_cast<int>(img.size(0)), w = static_cast<int>(img.size(1));
    Canvas c(w, h);
    const auto* p = img.data_ptr<uint8_t>();
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x, p += 3) c.set(x, y, {p[0], p[1], p[2]});
    const auto png = encode_png(c);
    out.push_back({"camera_views/" + std::to_string(b), h, w, std::string(png.begin(), png.end())});
  }
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t step) {
  create_directories_or_throw(dir, "train.tensorboard: run directory");
  prune_event_files(dir, step);
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string base = (fs::path(dir) / (kFilePrefix + std::to_string(seconds) + "." + host_name())).string();
  // "x": never opens an existing file (a second start in the same second gets the next suffix). TensorBoard reads
  // a directory's files in name order, and base.1 sorts after base.
  for (int n = 0; !file_; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    file_ = std::fopen(path_.c_str(), "wbx");
    if (!file_ && (errno != EEXIST || n >= 1000))
      throw UserError("train.tensorboard: cannot create the event file '" + path_ + "' (" + errno_reason(errno) + ")");
  }
  append(event_file_version(now_seconds()));
  if (step > 0) append(event_session_start(now_seconds(), step + 1));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::append(const std::string& event) {
  const auto record = tfrecord(event);
  // Flushed per record: the kernel holds it even if the process is killed right after.
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    throw UserError("train.tensorboard: cannot write the event file '" + path_ + "' (" + errno_reason(errno) + ")");
}

void TensorBoardWriter::add_scalars(int64_t step, const std::map<std::string, double>& values) {
  append(event_scalars(now_seconds(), step, values));
}

void TensorBoardWriter::add_images(int64_t step, const std::vector<EventImage>& images) {
  append(event_images(now_seconds(), step, images));
}

}  // namespace pi0::train
