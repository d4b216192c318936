// The TensorBoard event writer's pieces against published values: CRC-32C (RFC 3720's vectors), TFRecord framing
// (the bytes TensorBoard's own reader checks, taken from its pure-Python implementation), the Event encoding read
// back, and the writer's files across starts. TensorBoard's own reader reading a real run:
// tests/integration/test_tensorboard.cpp.
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <string>

#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/config/config.h"
#include "pi0/train/tensorboard.h"
#include "support/test_support.h"

using namespace pi0;
namespace fs = pi0::posix_fs;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const auto name = e.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) == 0) out.push_back(e.path().string());
  }
  return out;
}

// (step, is file_version) of every record of an event file.
std::vector<train::EventInfo> events_of(const std::string& path) {
  std::vector<train::EventInfo> out;
  for (const auto& r : train::read_tfrecords(read_bytes(path))) out.push_back(train::decode_event(r));
  return out;
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C gives RFC 3720's check values and TFRecord's masked form", "[unit][train]") {
  const std::string digits = "123456789";
  CHECK(train::crc32c(digits.data(), digits.size()) == 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(train::crc32c(zeros.data(), zeros.size()) == 0x8A9136AAu);
  CHECK(train::crc32c(ones.data(), ones.size()) == 0x62A8AB43u);
  CHECK(train::crc32c(ascending.data(), ascending.size()) == 0x46DD794Eu);
  CHECK(train::crc32c("", 0) == 0u);
  // tensorboard 2.21.0's compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c(b"123456789")
  CHECK(train::masked_crc32c(digits.data(), digits.size()) == 0xc78ab0e5u);
}

TEST_CASE("tensorboard: TFRecord framing, read back up to the first incomplete or corrupt record", "[unit][train]") {
  // The record TensorBoard's reader expects for b"abc": length, masked CRC of it, data, masked CRC of the data
  // (built with its pure-Python masked_crc32c).
  CHECK(train::tfrecord("abc") == from_hex("0300000000000000b099490e6162636e57f121"));
  const std::string two = train::tfrecord("first") + train::tfrecord(std::string(300, 'x'));
  bool complete = false;
  auto records = train::read_tfrecords(two, &complete);
  CHECK(complete);
  REQUIRE(records.size() == 2);
  CHECK(records[0] == "first");
  CHECK(records[1] == std::string(300, 'x'));
  // A killed writer: every cut inside the second record leaves the first one readable and says so.
  for (size_t cut = 1; cut < train::tfrecord(std::string(300, 'x')).size(); cut += 37) {
    INFO("cut " << cut);
    records = train::read_tfrecords(two.substr(0, two.size() - cut), &complete);
    CHECK_FALSE(complete);
    REQUIRE(records.size() == 1);
    CHECK(records[0] == "first");
  }
  // A flipped bit in the data or in the length fails its checksum: reading stops before it.
  auto corrupt = two;
  corrupt[train::tfrecord("first").size() + 20] ^= 1;
  CHECK(train::read_tfrecords(corrupt, &complete).size() == 1);
  CHECK_FALSE(complete);
  corrupt = two;
  corrupt[0] ^= 1;
  CHECK(train::read_tfrecords(corrupt, &complete).empty());
}

TEST_CASE("tensorboard: events encode their step, the file version and the values", "[unit][train]") {
  const auto version = train::event_file_version(1.7e9);
  CHECK(version.find("brain.Event:2") != std::string::npos);
  CHECK(train::decode_event(version).file_version);
  CHECK(train::decode_event(version).step == 0);
  const auto scalars = train::event_scalars(1.7e9, 123456789012LL, {{"loss", 0.25}, {"val_loss/libero", 1.5}});
  CHECK(train::decode_event(scalars).step == 123456789012LL);
  CHECK_FALSE(train::decode_event(scalars).file_version);
  // simple_value is a float32 after its tag: 0.25f little-endian, field 2 fixed32 (key 0x15).
  CHECK(scalars.find(std::string("\x0a\x04loss\x15\x00\x00\x80\x3e", 11)) != std::string::npos);
  CHECK(scalars.find("val_loss/libero") != std::string::npos);
  CHECK(train::decode_event(train::event_session_start(1.7e9, 7)).step == 7);
  CHECK(train::decode_event(train::event_images(1.7e9, 0, {{"camera_views/0", 2, 6, "PNG"}})).step == 0);
  CHECK_THROWS_AS(train::decode_event("\x12"), UserError);          // a varint cut short
  CHECK_THROWS_AS(train::decode_event("\x2a\x05" "ab"), UserError);  // a length past the end
}

TEST_CASE("tensorboard: camera views put the cameras side by side, -1..1 as 0..255, at most 5 samples",
          "[unit][train]") {
  const auto base = torch::full({7, 3, 4, 4}, -1.0f), wrist = torch::full({7, 3, 4, 4}, 1.0f);
  const auto views = train::camera_views({base, wrist, torch::zeros({7, 3, 4, 4})});
  REQUIRE(views.size() == 5);
  CHECK(views[4].tag == "camera_views/4");
  CHECK(views[0].height == 4);
  CHECK(views[0].width == 12);
  CHECK(views[0].png.substr(1, 3) == "PNG");
  CHECK(train::camera_views({base}, 2).size() == 2);
}

TEST_CASE("tensorboard: a new file per start, a resume drops the later steps of earlier files and a fresh start all of them",
          "[unit][train]") {
  testing::TempDir tmp("tb");
  const auto dir = tmp.str("run");
  std::string first;
  {
    train::TensorBoardWriter w(dir, 0);
    first = w.path();
    CHECK(fs::path(first).filename().string().rfind("events.out.tfevents.", 0) == 0);
    w.add_images(0, {{"camera_views/0", 1, 1, "PNG"}});
    for (int64_t s = 1; s <= 6; ++s) w.add_scalars(s, {{"loss", 1.0 / static_cast<double>(s)}});
  }
  CHECK(events_of(first).size() == 8);  // file version, images, 6 steps: each flushed as written
  // Resumed from the checkpoint of step 4: the first run's steps 5 and 6 go, the new file starts after 4.
  std::string second;
  {
    train::TensorBoardWriter w(dir, 4);
    second = w.path();
    CHECK(second != first);
    CHECK(second > first);  // TensorBoard reads a directory's files in name order
    w.add_scalars(5, {{"loss", 0.5}});
  }
  const auto a = events_of(first);
  REQUIRE(a.size() == 6);
  CHECK(a.front().file_version);
  CHECK(a.back().step == 4);
  const auto b = events_of(second);
  REQUIRE(b.size() == 3);  // file version, SessionLog START at 5, step 5
  CHECK(b[1].step == 5);
  CHECK(b[2].step == 5);
  // An unchanged file is not rewritten; a file cut by a kill loses only its torn tail.
  {
    std::ofstream(second, std::ios::app) << "torn";
    train::TensorBoardWriter w(dir, 5);
  }
  CHECK(events_of(first).size() == 6);
  CHECK(read_bytes(second).find("torn") == std::string::npos);
  CHECK(events_of(second).size() == 3);
  CHECK(event_files(dir).size() == 3);
  // A fresh start (step 0, no checkpoint to resume) logs everything anew: earlier files are emptied and removed.
  std::string fresh;
  {
    train::TensorBoardWriter w(dir, 0);
    fresh = w.path();
  }
  CHECK(event_files(dir) == std::vector<std::string>{fresh});
}

TEST_CASE("tensorboard: an event file that cannot be created is one line naming the key and the file",
          "[unit][train]") {
  testing::TempDir tmp("tb");
  std::ofstream(tmp.str("file")) << "x";
  CHECK_THROWS_WITH(train::TensorBoardWriter(tmp.str("file") + "/run", 0),
                    Catch::Contains("train.tensorboard") && Catch::Contains(tmp.str("file")) &&
                        !Catch::Contains("\n"));
}

TEST_CASE("train.tensorboard: a value that is not true or false is one line naming the key", "[unit][config]") {
  CHECK_THROWS_WITH(config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml", {"train.tensorboard=maybe"}),
                    Catch::Contains("train.tensorboard") && Catch::Contains("maybe") &&
                        Catch::Contains("true or false") && !Catch::Contains("\n"));
  CHECK_FALSE(config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug.yaml").train.tensorboard);
}
