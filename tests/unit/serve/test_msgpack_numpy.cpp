// msgpack-numpy codec: openpi's encoding (bytes keys, dtype strings, numpy scalars), every dtype a client may send,
// the one-line errors for malformed frames, and a fuzz run of random and mutated frames through decode_frame.
#include <catch2/catch.hpp>

#include <random>

#include <msgpack.hpp>

#include "pi0/common/check.h"
#include "pi0/serve/msgpack_numpy.h"

using namespace pi0;
using serve::decode_frame;
using serve::Fields;
using Catch::Contains;

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

std::string str(const msgpack::sbuffer& b) { return std::string(b.data(), b.size()); }

void pack_bytes(Packer& pk, const std::string& s) {
  pk.pack_bin(static_cast<uint32_t>(s.size()));
  pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
}

// An ndarray exactly as openpi_client's pack_array writes it (bytes keys; `data` given raw so tests can lie).
void pack_ndarray(Packer& pk, const std::string& dtype, const std::vector<int64_t>& shape, const std::string& data) {
  pk.pack_map(4);
  pack_bytes(pk, "__ndarray__");
  pk.pack_true();
  pack_bytes(pk, "data");
  pack_bytes(pk, data);
  pack_bytes(pk, "dtype");
  pk.pack(dtype);
  pack_bytes(pk, "shape");
  pk.pack_array(static_cast<uint32_t>(shape.size()));
  for (auto d : shape) pk.pack(d);
}

// {"x": ndarray(dtype, shape, data)}
std::string one_array(const std::string& dtype, const std::vector<int64_t>& shape, const std::string& data) {
  msgpack::sbuffer b;
  Packer pk(b);
  pk.pack_map(1);
  pk.pack(std::string("x"));
  pack_ndarray(pk, dtype, shape, data);
  return str(b);
}

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

Fields decode(const std::string& s) { return decode_frame(s.data(), s.size()); }

void check_error(const std::string& frame, const std::string& text) {
  try {
    decode(frame);
    FAIL("no error for a frame expected to fail with: " << text);
  } catch (const UserError& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK_THAT(msg, Contains(text));
    CHECK(msg.find('\n') == std::string::npos);
  }
}

}  // namespace

TEST_CASE("decode_frame reads openpi's ndarrays of every dtype with bytes or str keys", "[serve][unit]") {
  struct Case {
    std::string dtype;
    torch::ScalarType type;
    torch::Tensor values;
  };
  torch::manual_seed(0);
  const std::vector<Case> cases = {
      {"<f4", torch::kFloat32, torch::randn({2, 3})},
      {"<f8", torch::kFloat64, torch::randn({5}, torch::kFloat64)},
      {"<f2", torch::kHalf, torch::randn({4}).to(torch::kHalf)},
      {"|u1", torch::kUInt8, torch::randint(0, 256, {2, 2, 3}).to(torch::kUInt8)},
      {"|i1", torch::kInt8, torch::randint(-128, 128, {3}).to(torch::kInt8)},
      {"<i2", torch::kInt16, torch::randint(-1000, 1000, {3}).to(torch::kInt16)},
      {"<i4", torch::kInt32, torch::randint(-100000, 100000, {3}).to(torch::kInt32)},
      {"<i8", torch::kInt64, torch::randint(-100000, 100000, {2, 1})},
      {"|b1", torch::kBool, torch::randint(0, 2, {6}).to(torch::kBool)},
  };
  for (const auto& c : cases) {
    INFO(c.dtype);
    const auto t = c.values.contiguous();
    const auto f = decode(one_array(c.dtype, t.sizes().vec(), bytes_of(t.data_ptr(), t.numel() * t.element_size())));
    REQUIRE(f.count("x") == 1);
    const auto& got = f.at("x").tensor;
    CHECK(got.scalar_type() == c.type);
    CHECK(got.sizes() == t.sizes());
    CHECK(torch::equal(got, t));
    CHECK(serve::numpy_dtype(c.type) == c.dtype);
  }
  // Unsigned wider types widen to LibTorch's signed ones; big-endian data is swapped.
  const uint16_t u16[2] = {65535, 7};
  CHECK(torch::equal(decode(one_array("<u2", {2}, bytes_of(u16, 4))).at("x").tensor, torch::tensor({65535, 7}, torch::kInt32)));
  const uint32_t u32[1] = {4000000000u};
  CHECK(decode(one_array("<u4", {1}, bytes_of(u32, 4))).at("x").tensor.item<int64_t>() == 4000000000LL);
  const unsigned char be[4] = {0x3f, 0x80, 0x00, 0x00};  // 1.0f big-endian
  CHECK(decode(one_array(">f4", {1}, bytes_of(be, 4))).at("x").tensor.item<float>() == 1.0f);
  CHECK(decode(one_array("float32", {1}, bytes_of(be + 0, 0) + std::string("\0\0\x80\x3f", 4))).at("x").tensor.item<float>() == 1.0f);
  // Zero-size arrays are fine.
  CHECK(decode(one_array("<f4", {0, 3}, "")).at("x").tensor.sizes() == torch::IntArrayRef({0, 3}));
}

TEST_CASE("decode_frame flattens nested maps and reads numpy scalars and Python values and lists", "[serve][unit]") {
  msgpack::sbuffer b;
  Packer pk(b);
  pk.pack_map(7);
  pk.pack(std::string("images"));  // nested map (ALOHA's images dict)
  pk.pack_map(1);
  pack_bytes(pk, "cam_high");  // a bytes key
  pack_ndarray(pk, "|u1", {3, 1, 1}, std::string("\x01\x02\x03", 3));
  pk.pack(std::string("prompt"));
  pk.pack(std::string("fold the towel"));
  pk.pack(std::string("flag"));  // np.True_
  pk.pack_map(3);
  pack_bytes(pk, "__npgeneric__");
  pk.pack_true();
  pack_bytes(pk, "data");
  pk.pack_true();
  pack_bytes(pk, "dtype");
  pk.pack(std::string("|b1"));
  pk.pack(std::string("gain"));  // np.float32(0.5)
  pk.pack_map(3);
  pack_bytes(pk, "__npgeneric__");
  pk.pack_true();
  pack_bytes(pk, "data");
  pk.pack(0.5);
  pack_bytes(pk, "dtype");
  pk.pack(std::string("<f4"));
  pk.pack(std::string("state"));  // a Python list
  pk.pack_array(3);
  pk.pack(1);
  pk.pack(2.5);
  pk.pack(-3);
  pk.pack(std::string("step"));
  pk.pack(7);
  pk.pack(std::string("unused"));
  pk.pack_nil();
  const auto f = decode(str(b));
  CHECK(f.size() == 6);  // nil is absent
  CHECK(torch::equal(f.at("images/cam_high").tensor, torch::tensor({1, 2, 3}, torch::kUInt8).reshape({3, 1, 1})));
  CHECK(*f.at("prompt").text == "fold the towel");
  CHECK(f.at("flag").tensor.scalar_type() == torch::kBool);
  CHECK(f.at("flag").tensor.item<bool>());
  CHECK(f.at("gain").tensor.scalar_type() == torch::kFloat32);
  CHECK(f.at("gain").tensor.item<float>() == 0.5f);
  CHECK(torch::equal(f.at("state").tensor, torch::tensor({1.0, 2.5, -3.0}, torch::kFloat64)));
  CHECK(f.at("step").tensor.item<int64_t>() == 7);
}

// openpi's transforms take a prompt as str, bytes (decoded as UTF-8) or a numpy text array (.item()); its client
// packs np.array("...") as an ndarray of dtype '<U<chars>' (UTF-32, NUL-padded) and b"..." as msgpack bin.
TEST_CASE("decode_frame reads text as str, bytes and one-element numpy text arrays", "[serve][unit]") {
  const std::string text = "fold the towel \xc3\xa0 \xe2\x82\xac \xf0\x9f\xa4\x96";  // à, €, 🤖: 1 to 4 UTF-8 bytes
  const std::vector<uint32_t> cps = {'f', 'o', 'l', 'd', 0xE0, 0x20AC, 0x1F916};
  // UTF-32 little-endian of `cps`, padded with NUL code points to `chars` (numpy pads shorter elements so).
  auto utf32 = [&](size_t chars, bool big_endian) {
    std::string out;
    for (size_t i = 0; i < chars; ++i) {
      const uint32_t cp = i < cps.size() ? cps[i] : 0;
      for (int b = 0; b < 4; ++b) out += static_cast<char>((cp >> (8 * (big_endian ? 3 - b : b))) & 0xFF);
    }
    return out;
  };
  const std::string want = "fold\xc3\xa0\xe2\x82\xac\xf0\x9f\xa4\x96";
  CHECK(*decode(one_array("<U7", {}, utf32(7, false))).at("x").text == want);     // np.array(s): 0-d
  CHECK(*decode(one_array("<U9", {1}, utf32(9, false))).at("x").text == want);    // np.array([s]), padded
  CHECK(*decode(one_array(">U7", {1, 1}, utf32(7, true))).at("x").text == want);  // big-endian, [1,1]
  CHECK(*decode(one_array("|S6", {}, std::string("towel\0", 6))).at("x").text == "towel");  // np.array(b"towel")
  CHECK(*decode(one_array("|S5", {1}, "towel")).at("x").text == "towel");
  CHECK(*decode(one_array("<U0", {}, "")).at("x").text == "");
  msgpack::sbuffer b;
  Packer pk(b);
  pk.pack_map(2);
  pk.pack(std::string("prompt"));  // b"..." from a client: msgpack bin
  pack_bytes(pk, text);
  pk.pack(std::string("np_bytes"));  // np.bytes_(b"...") as a numpy scalar: its data is bin
  pk.pack_map(3);
  pack_bytes(pk, "__npgeneric__");
  pk.pack_true();
  pack_bytes(pk, "data");
  pack_bytes(pk, "towel");
  pack_bytes(pk, "dtype");
  pk.pack(std::string("|S5"));
  const auto f = decode(str(b));
  CHECK(*f.at("prompt").text == text);
  CHECK(*f.at("np_bytes").text == "towel");
}

TEST_CASE("encode_fields and encode_response round-trip through decode_frame", "[serve][unit]") {
  torch::manual_seed(1);
  Fields in;
  in["a"].tensor = torch::randn({3, 4});
  in["b"].tensor = torch::randint(0, 256, {2, 2, 3}).to(torch::kUInt8);
  in["prompt"].text = "x";
  const auto enc = serve::encode_fields(in);
  const auto out = decode(enc);
  CHECK(torch::equal(out.at("a").tensor, in["a"].tensor));
  CHECK(torch::equal(out.at("b").tensor, in["b"].tensor));
  CHECK(*out.at("prompt").text == "x");

  serve::Response r;
  r.actions = torch::randn({4, 7});
  r.policy_infer_ms = 1.5;
  r.server_infer_ms = 2.5;
  auto dec = decode(serve::encode_response(r));
  CHECK(torch::equal(dec.at("actions").tensor, r.actions));
  CHECK(dec.at("policy_timing/infer_ms").tensor.item<double>() == 1.5);
  CHECK(dec.at("server_timing/infer_ms").tensor.item<double>() == 2.5);
  CHECK(dec.count("server_timing/prev_total_ms") == 0);
  r.prev_total_ms = 9.0;
  dec = decode(serve::encode_response(r));
  CHECK(dec.at("server_timing/prev_total_ms").tensor.item<double>() == 9.0);
  CHECK(dec.count("rtc/mode") == 0);  // an answer without real-time chunking holds openpi's keys only
  CHECK(dec.size() == 4);
  r.rtc = {{"mode", "trained"}, {"delay", 3}};
  dec = decode(serve::encode_response(r));
  CHECK(*dec.at("rtc/mode").text == "trained");
  CHECK(dec.at("rtc/delay").tensor.item<int64_t>() == 3);

  const auto md = decode(serve::encode_json({{"robot", "libero"}, {"action_horizon", 50}, {"ok", true}}));
  CHECK(*md.at("robot").text == "libero");
  CHECK(md.at("action_horizon").tensor.item<int64_t>() == 50);
}

TEST_CASE("decode_frame: malformed frames are one-line errors naming the key", "[serve][unit]") {
  const std::string f4 = std::string(8, '\0');  // two float32
  check_error(one_array("<f4", {3}, f4), "'x': ndarray of shape [3] and dtype '<f4' needs 12 bytes, but data holds 8");
  check_error(one_array("<f4", {1, 2}, f4.substr(0, 7)), "needs 8 bytes, but data holds 7");
  check_error(one_array("<f4", {1LL << 40, 1LL << 40}, f4), "needs more than 2^64 bytes");
  check_error(one_array("<f4", {1LL << 31, 1LL << 31, 1LL << 31}, f4), "more than 2^64");
  check_error(one_array("<c8", {1}, f4), "'x': dtype '<c8' is not supported");
  check_error(one_array("<f3", {2}, f4), "dtype '<f3' is not supported");
  check_error(one_array("", {2}, f4), "dtype '' is not supported");
  check_error(one_array("|O", {1}, f4), "not supported");
  check_error(one_array("<U1", {2}, f4), "'x': ndarray of text (dtype '<U1') of shape [2], expected numbers or a single text");
  check_error(one_array("<U2", {1}, std::string("\x00\xd8\x00\x00" "a\x00\x00\x00", 8)), "invalid code point 55296");
  {
    msgpack::sbuffer b;
    Packer pk(b);
    pk.pack_map(1);
    pk.pack(std::string("x"));
    pk.pack_map(3);
    pack_bytes(pk, "__ndarray__");
    pk.pack_true();
    pack_bytes(pk, "data");
    pack_bytes(pk, f4);
    pack_bytes(pk, "dtype");
    pk.pack(std::string("<f4"));
    check_error(str(b), "'x': ndarray without 'shape'");
  }
  {
    msgpack::sbuffer b;
    Packer pk(b);
    pk.pack_map(1);
    pk.pack(std::string("x"));
    pk.pack_map(4);
    pack_bytes(pk, "__ndarray__");
    pk.pack_true();
    pack_bytes(pk, "data");
    pack_bytes(pk, f4);
    pack_bytes(pk, "dtype");
    pk.pack(std::string("<f4"));
    pack_bytes(pk, "shape");
    pk.pack_array(1);
    pk.pack(-2);
    check_error(str(b), "shape holds a negative int");
  }
  {  // not a map
    msgpack::sbuffer b;
    Packer pk(b);
    pk.pack_array(2);
    pk.pack(1);
    pk.pack(2);
    check_error(str(b), "frame holds a list, expected a msgpack map");
  }
  {  // integer key
    msgpack::sbuffer b;
    Packer pk(b);
    pk.pack_map(1);
    pk.pack(5);
    pk.pack(1);
    check_error(str(b), "map key of type int, expected str or bytes");
  }
  {  // ragged list
    msgpack::sbuffer b;
    Packer pk(b);
    pk.pack_map(1);
    pk.pack(std::string("s"));
    pk.pack_array(2);
    pk.pack_array(1);
    pk.pack(1);
    pk.pack_array(2);
    pk.pack(1);
    pk.pack(2);
    check_error(str(b), "'s': ragged list");
  }
  check_error("", "empty frame");
  check_error(std::string("\xc1", 1), "invalid msgpack frame");
  check_error(one_array("<f4", {2}, f4).substr(0, 20), "invalid msgpack frame");
  check_error(one_array("<f4", {2}, f4) + "x", "bytes after the first object");
  check_error(std::string("\xdd\xff\xff\xff\xff", 5), "invalid msgpack frame");  // array of 2^32-1 declared
  check_error(std::string("\xdf\xff\xff\xff\xff", 5), "invalid msgpack frame");  // map of 2^32-1 declared
  check_error(std::string("\x81\xa1x\xd4\x01\x00", 6), "invalid msgpack frame");  // ext type
  {  // nesting deeper than the limit
    std::string deep;
    for (int i = 0; i < 40; ++i) deep += std::string("\x81\xa1k", 3);
    deep += std::string("\x01", 1);
    check_error(deep, "msgpack");
  }
}

TEST_CASE("decode_frame survives 100k random and mutated frames", "[serve][unit][fuzz]") {
  // Valid seeds: a LIBERO-like observation (small images), an ALOHA-like nested one, a response.
  std::vector<std::string> seeds;
  {
    torch::manual_seed(2);
    Fields f;
    f["observation/image"].tensor = torch::randint(0, 256, {4, 4, 3}).to(torch::kUInt8);
    f["observation/state"].tensor = torch::randn({8}, torch::kFloat64);
    f["prompt"].text = "do it";
    seeds.push_back(serve::encode_fields(f));
    serve::Response r;
    r.actions = torch::randn({2, 3});
    r.prev_total_ms = 1.0;
    seeds.push_back(serve::encode_response(r));
    msgpack::sbuffer b;
    Packer pk(b);
    pk.pack_map(2);
    pk.pack(std::string("images"));
    pk.pack_map(1);
    pk.pack(std::string("cam_high"));
    pack_ndarray(pk, "|u1", {3, 2, 2}, std::string(12, '\x07'));
    pk.pack(std::string("state"));
    pk.pack_array(3);
    pk.pack(1.0);
    pk.pack(true);
    pk.pack(3);
    seeds.push_back(str(b));
  }
  std::mt19937_64 rng(1234);
  auto byte = [&]() { return static_cast<char>(rng() & 0xff); };
  int64_t decoded = 0, rejected = 0;
  const int64_t n = 100000;
  for (int64_t i = 0; i < n; ++i) {
    std::string frame;
    const auto mode = rng() % 5;
    if (mode == 0) {  // random bytes, often starting with a map header
      frame.resize(rng() % 64);
      for (auto& c : frame) c = byte();
      if (!frame.empty() && rng() % 2) frame[0] = static_cast<char>(0x80 | (rng() % 16));
    } else {
      frame = seeds[rng() % seeds.size()];
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits && !frame.empty(); ++e) {
        const size_t pos = rng() % frame.size();
        switch (rng() % 4) {
          case 0: frame[pos] = byte(); break;                                   // overwrite
          case 1: frame[pos] = static_cast<char>(frame[pos] ^ (1 << (rng() % 8))); break;  // bit flip
          case 2: frame.resize(pos); break;                                     // truncate
          default: frame.insert(frame.begin() + static_cast<std::ptrdiff_t>(pos), byte()); break;  // insert
        }
      }
    }
    try {
      decode_frame(frame.data(), frame.size());
      ++decoded;
    } catch (const UserError& e) {
      ++rejected;
      const std::string msg = e.what();
      if (msg.empty() || msg.find('\n') != std::string::npos) FAIL("bad error message: '" << msg << "'");
    }
    // Any other exception type escapes and fails the test.
  }
  CHECK(decoded + rejected == n);
  CHECK(rejected > n / 2);  // the mutations do break most frames
  CHECK(decoded > 0);       // and some survive as other valid frames
}
