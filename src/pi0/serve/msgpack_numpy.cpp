#include "pi0/serve/msgpack_numpy.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include <msgpack.hpp>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"

namespace pi0::serve {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

std::string type_name(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "bool";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: return "int";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "float";
    case msgpack::type::STR: return "str";
    case msgpack::type::BIN: return "bytes";
    case msgpack::type::ARRAY: return "list";
    case msgpack::type::MAP: return "map";
    default: return "ext";
  }
}

// A map key: str or bytes (openpi's packer writes bytes keys, clients write str keys).
bool key_string(const msgpack::object& k, std::string* out) {
  if (k.type == msgpack::type::STR) {
    out->assign(k.via.str.ptr, k.via.str.size);
    return true;
  }
  if (k.type == msgpack::type::BIN) {
    out->assign(k.via.bin.ptr, k.via.bin.size);
    return true;
  }
  return false;
}

// Looks up a str-or-bytes key in a map; nullptr when absent.
const msgpack::object* find_key(const msgpack::object_map& m, const char* key) {
  const size_t n = std::strlen(key);
  for (uint32_t i = 0; i < m.size; ++i) {
    const auto& k = m.ptr[i].key;
    if ((k.type == msgpack::type::STR && k.via.str.size == n && std::memcmp(k.via.str.ptr, key, n) == 0) ||
        (k.type == msgpack::type::BIN && k.via.bin.size == n && std::memcmp(k.via.bin.ptr, key, n) == 0))
      return &m.ptr[i].val;
  }
  return nullptr;
}

// numpy dtype: how the bytes are stored and what tensor type they become.
struct Dtype {
  std::string str;            // as received, for messages
  char kind = 0;              // 'b' bool, 'u' unsigned, 'i' signed, 'f' float, 'U'/'S' text (scalars only)
  int itemsize = 0;
  bool swap = false;          // big-endian on the wire
  torch::ScalarType tensor_type = torch::kFloat32;
};

constexpr const char* kDtypesExpected =
    "expected a numpy dtype string such as '<f4', '<f8', '|u1', '|b1', '<i8' (bool, int8-64, uint8-64, float16-64)";

Dtype parse_dtype(const std::string& key, const msgpack::object& o) {
  Dtype d;
  if (o.type == msgpack::type::STR) d.str.assign(o.via.str.ptr, o.via.str.size);
  else if (o.type == msgpack::type::BIN) d.str.assign(o.via.bin.ptr, o.via.bin.size);
  else throw UserError("'" + key + "': dtype is a " + type_name(o) + ", " + kDtypesExpected);
  static const std::map<std::string, std::string> kNames = {
      {"bool", "|b1"},    {"uint8", "|u1"},   {"int8", "|i1"},    {"int16", "<i2"},   {"int32", "<i4"},
      {"int64", "<i8"},   {"uint16", "<u2"},  {"uint32", "<u4"},  {"uint64", "<u8"},  {"float16", "<f2"},
      {"float32", "<f4"}, {"float64", "<f8"}};
  std::string s = d.str;
  if (auto it = kNames.find(s); it != kNames.end()) s = it->second;
  size_t pos = 0;
  if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
    d.swap = s[0] == '>';
    pos = 1;
  }
  const std::string body = s.substr(pos);
  auto bad = [&]() { return UserError("'" + key + "': dtype '" + d.str + "' is not supported, " + kDtypesExpected); };
  const bool text = !body.empty() && (body[0] == 'U' || body[0] == 'S');
  // Text dtypes count characters ('<U1000': a prompt of 1000 code points); numbers are 1 to 8 bytes.
  if (body.size() < 2 || body.size() > (text ? 9 : 4)) throw bad();
  d.kind = body[0];
  for (size_t i = 1; i < body.size(); ++i)
    if (body[i] < '0' || body[i] > '9') throw bad();
  d.itemsize = std::stoi(body.substr(1));
  if (text) {
    if (d.kind == 'U') d.itemsize *= 4;  // UTF-32 code units
    return d;                            // text: a one-element ndarray or a numpy scalar (the caller checks)
  }
  const std::string ks = body;
  if (ks == "b1") d.tensor_type = torch::kBool;
  else if (ks == "u1") d.tensor_type = torch::kUInt8;
  else if (ks == "i1") d.tensor_type = torch::kInt8;
  else if (ks == "i2") d.tensor_type = torch::kInt16;
  else if (ks == "i4" || ks == "u2") d.tensor_type = torch::kInt32;  // LibTorch has no uint16/32/64: widened
  else if (ks == "i8" || ks == "u4" || ks == "u8") d.tensor_type = torch::kInt64;
  else if (ks == "f2") d.tensor_type = torch::kHalf;
  else if (ks == "f4") d.tensor_type = torch::kFloat32;
  else if (ks == "f8") d.tensor_type = torch::kFloat64;
  else throw bad();
  if (d.itemsize == 1) d.swap = false;
  return d;
}

// Little-endian value of `n` bytes at p (after an optional swap), as an unsigned integer.
uint64_t load_uint(const uint8_t* p, int n, bool swap) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[swap ? n - 1 - i : i]) << (8 * i);
  return v;
}

// Raw bytes of `numel` elements of dtype `d` → a tensor of `shape`.
torch::Tensor tensor_from_bytes(const std::string& key, const Dtype& d, const std::vector<int64_t>& shape,
                                const uint8_t* bytes, int64_t numel) {
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(d.tensor_type));
  const int64_t out_size = static_cast<int64_t>(t.element_size());
  auto* out = static_cast<uint8_t*>(t.data_ptr());
  if (d.kind == 'b') {
    for (int64_t i = 0; i < numel; ++i) out[i] = bytes[i] != 0;  // any non-zero byte is true, as numpy reads it
  } else if (d.kind == 'u' && d.itemsize > 1) {
    for (int64_t i = 0; i < numel; ++i) {
      const uint64_t v = load_uint(bytes + i * d.itemsize, d.itemsize, d.swap);
      if (d.itemsize == 8 && v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw UserError("'" + key + "': uint64 value " + std::to_string(v) + " does not fit int64");
      if (out_size == 4) {
        const auto w = static_cast<int32_t>(v);
        std::memcpy(out + i * 4, &w, 4);
      } else {
        const auto w = static_cast<int64_t>(v);
        std::memcpy(out + i * 8, &w, 8);
      }
    }
  } else if (d.swap) {
    for (int64_t i = 0; i < numel; ++i)
      for (int b = 0; b < d.itemsize; ++b) out[i * d.itemsize + b] = bytes[i * d.itemsize + d.itemsize - 1 - b];
  } else if (numel > 0) {
    std::memcpy(out, bytes, static_cast<size_t>(numel * d.itemsize));
  }
  return t;
}

// One numpy text element → UTF-8: 'S' is bytes as they are, 'U' UTF-32 code points; trailing NULs are padding
// (numpy strips them too, in .item()).
std::string text_from_bytes(const std::string& key, const Dtype& d, const uint8_t* bytes) {
  std::string out;
  if (d.kind == 'S') {
    out.assign(reinterpret_cast<const char*>(bytes), static_cast<size_t>(d.itemsize));
  } else {
    for (int i = 0; i < d.itemsize; i += 4) {
      const auto cp = static_cast<uint32_t>(load_uint(bytes + i, 4, d.swap));
      if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        throw UserError("'" + key + "': numpy text holds the invalid code point " + std::to_string(cp) +
                        ", expected Unicode text");
      append_utf8(out, static_cast<char32_t>(cp));
    }
  }
  while (!out.empty() && out.back() == '\0') out.pop_back();
  return out;
}

Field decode_ndarray(const std::string& key, const msgpack::object_map& m, const DecodeLimits& limits) {
  const msgpack::object* data = find_key(m, "data");
  const msgpack::object* dtype = find_key(m, "dtype");
  const msgpack::object* shape = find_key(m, "shape");
  if (!data || !dtype || !shape)
    throw UserError("'" + key + "': ndarray without '" + std::string(!data ? "data" : !dtype ? "dtype" : "shape") +
                    "', expected __ndarray__, data, dtype and shape");
  if (data->type != msgpack::type::BIN)
    throw UserError("'" + key + "': ndarray data is a " + type_name(*data) + ", expected bytes");
  const Dtype d = parse_dtype(key, *dtype);
  if (shape->type != msgpack::type::ARRAY)
    throw UserError("'" + key + "': ndarray shape is a " + type_name(*shape) + ", expected a list of ints");
  const auto& sa = shape->via.array;
  if (sa.size > limits.max_dims)
    throw UserError("'" + key + "': ndarray has " + std::to_string(sa.size) + " dims, expected at most " +
                    std::to_string(limits.max_dims));
  std::vector<int64_t> dims;
  uint64_t numel = 1;
  bool overflow = false;
  for (uint32_t i = 0; i < sa.size; ++i) {
    const auto& e = sa.ptr[i];
    if (e.type != msgpack::type::POSITIVE_INTEGER) {
      const bool neg = e.type == msgpack::type::NEGATIVE_INTEGER;
      throw UserError("'" + key + "': ndarray shape holds " + (neg ? std::string("a negative int") : "a " + type_name(e)) +
                      ", expected non-negative ints");
    }
    const uint64_t v = e.via.u64;
    if (v > (uint64_t{1} << 40)) overflow = true;
    dims.push_back(static_cast<int64_t>(std::min<uint64_t>(v, uint64_t{1} << 40)));
    if (!overflow && __builtin_mul_overflow(numel, v, &numel)) overflow = true;
  }
  uint64_t nbytes = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(d.itemsize), &nbytes) ||
      nbytes != data->via.bin.size) {
    throw UserError("'" + key + "': ndarray of shape " + shape_str(dims) + " and dtype '" + d.str + "' needs " +
                    (overflow ? std::string("more than 2^64") : std::to_string(nbytes)) + " bytes, but data holds " +
                    std::to_string(data->via.bin.size));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(data->via.bin.ptr);
  Field f;
  if (d.kind == 'U' || d.kind == 'S') {
    // A prompt sent as np.array("...") (0-d) or np.array(["..."]): openpi takes .item() of it.
    if (numel != 1)
      throw UserError("'" + key + "': ndarray of text (dtype '" + d.str + "') of shape " + shape_str(dims) +
                      ", expected numbers or a single text element (0-d or 1 element)");
    f.text = text_from_bytes(key, d, bytes);
    return f;
  }
  f.tensor = tensor_from_bytes(key, d, dims, bytes, static_cast<int64_t>(numel));
  return f;
}

Field decode_npgeneric(const std::string& key, const msgpack::object_map& m) {
  const msgpack::object* data = find_key(m, "data");
  const msgpack::object* dtype = find_key(m, "dtype");
  if (!data || !dtype)
    throw UserError("'" + key + "': numpy scalar without '" + std::string(!data ? "data" : "dtype") +
                    "', expected __npgeneric__, data and dtype");
  const Dtype d = parse_dtype(key, *dtype);
  Field f;
  if (d.kind == 'U' || d.kind == 'S') {
    if (data->type == msgpack::type::STR) f.text = std::string(data->via.str.ptr, data->via.str.size);
    else if (data->type == msgpack::type::BIN) f.text = std::string(data->via.bin.ptr, data->via.bin.size);
    else throw UserError("'" + key + "': numpy text scalar holds a " + type_name(*data) + ", expected str");
    return f;
  }
  torch::Tensor v;
  switch (data->type) {
    case msgpack::type::BOOLEAN: v = torch::scalar_tensor(data->via.boolean, torch::kBool); break;
    case msgpack::type::POSITIVE_INTEGER:
      v = torch::scalar_tensor(static_cast<int64_t>(std::min<uint64_t>(data->via.u64, INT64_MAX)), torch::kLong);
      break;
    case msgpack::type::NEGATIVE_INTEGER: v = torch::scalar_tensor(data->via.i64, torch::kLong); break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: v = torch::scalar_tensor(data->via.f64, torch::kDouble); break;
    default: throw UserError("'" + key + "': numpy scalar holds a " + type_name(*data) + ", expected a number or bool");
  }
  f.tensor = v.to(d.tensor_type);
  return f;
}

// A (nested) list of numbers or bools → tensor (bool if all bools, int64 if all ints, else float64).
torch::Tensor decode_list(const std::string& key, const msgpack::object& o, const DecodeLimits& limits) {
  std::vector<int64_t> shape;
  const msgpack::object* cur = &o;
  while (cur->type == msgpack::type::ARRAY) {
    if (shape.size() >= limits.max_dims)
      throw UserError("'" + key + "': list nested deeper than " + std::to_string(limits.max_dims) + " levels");
    shape.push_back(cur->via.array.size);
    if (cur->via.array.size == 0) break;
    cur = &cur->via.array.ptr[0];
  }
  std::vector<double> values;
  bool all_bool = true, all_int = true;
  // Walks the list checking that every sub-list has the shape of the first one.
  std::function<void(const msgpack::object&, size_t)> walk = [&](const msgpack::object& e, size_t depth) {
    if (depth < shape.size()) {
      if (e.type != msgpack::type::ARRAY || static_cast<int64_t>(e.via.array.size) != shape[depth])
        throw UserError("'" + key + "': ragged list, expected a regular nested list of numbers of shape " +
                        shape_str(shape));
      for (uint32_t i = 0; i < e.via.array.size; ++i) walk(e.via.array.ptr[i], depth + 1);
      return;
    }
    switch (e.type) {
      case msgpack::type::BOOLEAN: values.push_back(e.via.boolean); all_int = false; break;
      case msgpack::type::POSITIVE_INTEGER: values.push_back(static_cast<double>(e.via.u64)); all_bool = false; break;
      case msgpack::type::NEGATIVE_INTEGER: values.push_back(static_cast<double>(e.via.i64)); all_bool = false; break;
      case msgpack::type::FLOAT32:
      case msgpack::type::FLOAT64: values.push_back(e.via.f64); all_bool = all_int = false; break;
      default:
        throw UserError("'" + key + "': list holds a " + type_name(e) + ", expected numbers or bools");
    }
  };
  walk(o, 0);
  torch::Tensor t = torch::tensor(values, torch::kDouble).reshape(shape);
  if (values.empty()) return t.to(torch::kFloat64);
  return t.to(all_bool ? torch::kBool : all_int ? torch::kLong : torch::kDouble);
}

void decode_value(const std::string& key, const msgpack::object& o, size_t depth, const DecodeLimits& limits,
                  Fields& out);

void decode_map(const std::string& prefix, const msgpack::object_map& m, size_t depth, const DecodeLimits& limits,
                Fields& out) {
  for (uint32_t i = 0; i < m.size; ++i) {
    std::string k;
    if (!key_string(m.ptr[i].key, &k))
      throw UserError("'" + (prefix.empty() ? std::string("<frame>") : prefix) + "': map key of type " +
                      type_name(m.ptr[i].key) + ", expected str or bytes keys");
    decode_value(prefix.empty() ? k : prefix + "/" + k, m.ptr[i].val, depth + 1, limits, out);
  }
}

void decode_value(const std::string& key, const msgpack::object& o, size_t depth, const DecodeLimits& limits,
                  Fields& out) {
  if (depth > limits.max_depth)
    throw UserError("'" + key + "': nested deeper than " + std::to_string(limits.max_depth) + " levels");
  Field f;
  switch (o.type) {
    case msgpack::type::NIL: return;
    case msgpack::type::MAP:
      if (find_key(o.via.map, "__ndarray__")) f = decode_ndarray(key, o.via.map, limits);
      else if (find_key(o.via.map, "__npgeneric__")) f = decode_npgeneric(key, o.via.map);
      else return decode_map(key, o.via.map, depth, limits, out);
      break;
    case msgpack::type::BOOLEAN: f.tensor = torch::scalar_tensor(o.via.boolean, torch::kBool); break;
    case msgpack::type::POSITIVE_INTEGER:
      if (o.via.u64 > static_cast<uint64_t>(INT64_MAX)) throw UserError("'" + key + "': int too large for int64");
      f.tensor = torch::scalar_tensor(static_cast<int64_t>(o.via.u64), torch::kLong);
      break;
    case msgpack::type::NEGATIVE_INTEGER: f.tensor = torch::scalar_tensor(o.via.i64, torch::kLong); break;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: f.tensor = torch::scalar_tensor(o.via.f64, torch::kDouble); break;
    case msgpack::type::STR: f.text = std::string(o.via.str.ptr, o.via.str.size); break;
    case msgpack::type::BIN: f.text = std::string(o.via.bin.ptr, o.via.bin.size); break;  // bytes: text, as openpi decodes a bytes prompt
    case msgpack::type::ARRAY: f.tensor = decode_list(key, o, limits); break;
    default:
      throw UserError("'" + key + "': value of type " + type_name(o) +
                      ", expected an ndarray, a numpy scalar, a number, a bool, a str, bytes or a list of numbers");
  }
  if (!out.emplace(key, std::move(f)).second)
    throw UserError("'" + key + "': given twice (as a nested map and as a '/'-joined key)");
}

// Strings and binaries are read in place (the frame outlives the decoded object): no copies of image bytes.
bool reference_in_place(msgpack::type::object_type, std::size_t, void*) { return true; }

void pack_tensor(Packer& pk, const torch::Tensor& tensor) {
  const torch::Tensor t = tensor.to(torch::kCPU).contiguous();
  const std::string dtype = numpy_dtype(t.scalar_type());
  pk.pack_map(4);
  pk.pack_bin(11);
  pk.pack_bin_body("__ndarray__", 11);
  pk.pack_true();
  pk.pack_bin(4);
  pk.pack_bin_body("data", 4);
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  pk.pack_bin(static_cast<uint32_t>(nbytes));
  pk.pack_bin_body(static_cast<const char*>(t.data_ptr()), static_cast<uint32_t>(nbytes));
  pk.pack_bin(5);
  pk.pack_bin_body("dtype", 5);
  pk.pack(dtype);
  pk.pack_bin(5);
  pk.pack_bin_body("shape", 5);
  pk.pack_array(static_cast<uint32_t>(t.dim()));
  for (int64_t d : t.sizes()) pk.pack(d);
}

void pack_json(Packer& pk, const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: pk.pack_nil(); break;
    case nlohmann::json::value_t::boolean: v.get<bool>() ? pk.pack_true() : pk.pack_false(); break;
    case nlohmann::json::value_t::number_integer: pk.pack(v.get<int64_t>()); break;
    case nlohmann::json::value_t::number_unsigned: pk.pack(v.get<uint64_t>()); break;
    case nlohmann::json::value_t::number_float: pk.pack(v.get<double>()); break;
    case nlohmann::json::value_t::string: pk.pack(v.get<std::string>()); break;
    case nlohmann::json::value_t::array:
      pk.pack_array(static_cast<uint32_t>(v.size()));
      for (const auto& e : v) pack_json(pk, e);
      break;
    case nlohmann::json::value_t::object:
      pk.pack_map(static_cast<uint32_t>(v.size()));
      for (auto it = v.begin(); it != v.end(); ++it) {
        pk.pack(it.key());
        pack_json(pk, it.value());
      }
      break;
    default: PI0_CHECK(false, "encode_json: unsupported JSON value ", v.dump());
  }
}

}  // namespace

Fields decode_frame(const void* data, size_t size, const DecodeLimits& limits) {
  if (size == 0) throw UserError("empty frame, expected a msgpack map of the observation");
  // Every element takes at least one byte of the frame, so no count may exceed the frame's size: this bounds what
  // the parser allocates before it has read the elements.
  const auto cap = [&](size_t limit) { return static_cast<std::size_t>(std::min(limit, size)); };
  const msgpack::unpack_limit unpack_limits(cap(limits.max_list_items), cap(limits.max_map_entries), size, size,
                                            /*ext=*/0, limits.max_depth + 4);
  msgpack::object_handle handle;
  std::size_t offset = 0;
  try {
    handle = msgpack::unpack(static_cast<const char*>(data), size, offset, reference_in_place, nullptr, unpack_limits);
  } catch (const std::exception& e) {
    throw UserError(std::string("invalid msgpack frame (") + e.what() + "), expected a msgpack map of the observation");
  }
  if (offset != size)
    throw UserError("invalid msgpack frame: " + std::to_string(size - offset) +
                    " bytes after the first object, expected exactly one msgpack map");
  const msgpack::object& root = handle.get();
  if (root.type != msgpack::type::MAP)
    throw UserError("frame holds a " + type_name(root) + ", expected a msgpack map of the observation");
  if (find_key(root.via.map, "__ndarray__") || find_key(root.via.map, "__npgeneric__"))
    throw UserError("frame holds a bare array, expected a map of observation keys");
  Fields out;
  try {
    decode_map("", root.via.map, 0, limits, out);
  } catch (const UserError& e) {
    // Keys are the client's bytes: keep the message one printable line whatever they hold.
    std::string msg = e.what();
    for (char& c : msg)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    throw UserError(msg);
  }
  return out;
}

std::string numpy_dtype(const torch::ScalarType& type) {
  switch (type) {
    case torch::kBool: return "|b1";
    case torch::kUInt8: return "|u1";
    case torch::kInt8: return "|i1";
    case torch::kInt16: return "<i2";
    case torch::kInt32: return "<i4";
    case torch::kInt64: return "<i8";
    case torch::kHalf: return "<f2";
    case torch::kFloat32: return "<f4";
    case torch::kFloat64: return "<f8";
    default: throw UserError(std::string("tensor dtype ") + c10::toString(type) + " has no numpy equivalent");
  }
}

std::string encode_fields(const Fields& fields) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(static_cast<uint32_t>(fields.size()));
  for (const auto& [key, f] : fields) {
    pk.pack(key);
    if (f.text) pk.pack(*f.text);
    else if (f.tensor.defined()) pack_tensor(pk, f.tensor);
    else pk.pack_nil();
  }
  return std::string(buf.data(), buf.size());
}

std::string encode_json(const nlohmann::json& value) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pack_json(pk, value);
  return std::string(buf.data(), buf.size());
}

std::string encode_response(const Response& r) {
  msgpack::sbuffer buf;
  Packer pk(buf);
  pk.pack_map(3 + (r.rtc.is_null() ? 0 : 1) + (r.subtask.is_null() ? 0 : 1) + (r.fast_decodable.is_null() ? 0 : 1));
  pk.pack(std::string("actions"));
  pack_tensor(pk, r.actions.to(torch::kFloat32));
  pk.pack(std::string("policy_timing"));
  pk.pack_map(1);
  pk.pack(std::string("infer_ms"));
  pk.pack(r.policy_infer_ms);
  pk.pack(std::string("server_timing"));
  pk.pack_map(r.prev_total_ms ? 2 : 1);
  pk.pack(std::string("infer_ms"));
  pk.pack(r.server_infer_ms);
  if (r.prev_total_ms) {
    pk.pack(std::string("prev_total_ms"));
    pk.pack(*r.prev_total_ms);
  }
  if (!r.rtc.is_null()) {
    pk.pack(std::string("rtc"));
    pack_json(pk, r.rtc);
  }
  if (!r.subtask.is_null()) {
    pk.pack(std::string("subtask"));
    pack_json(pk, r.subtask);
  }
  if (!r.fast_decodable.is_null()) {
    pk.pack(std::string("fast_decodable"));
    pack_json(pk, r.fast_decodable);
  }
  return std::string(buf.data(), buf.size());
}

}  // namespace pi0::serve
