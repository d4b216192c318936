// openpi's msgpack-numpy wire format (openpi_client/msgpack_numpy.py), decoded and encoded with msgpack-cxx.
//   ndarray:   map {__ndarray__: true, data: bin (raw bytes, C order), dtype: str ("<f4", "|u1", ...), shape: [..]}
//   np scalar: map {__npgeneric__: true, data: the Python value, dtype: str}
//   text:      str, bytes, or a one-element ndarray of dtype '<U<n>' (UTF-32) or '|S<n>' (bytes, NUL-padded)
// openpi's packer writes these keys as bytes; its client sends observation keys as str. Both are accepted as keys.
//
// The decoder turns one frame (a map, possibly nested) into flat Fields: nested maps are joined with '/', so
// {"images": {"cam_high": x}} and {"images/cam_high": x} read the same. It is the server's first contact with
// untrusted bytes: every size is checked against the frame before anything is allocated, and every problem is a
// pi0::UserError with one line naming the key and what was expected (never a crash; fuzzed in the tests).
#pragma once
#include <cstddef>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

namespace pi0::serve {

/// One leaf of a decoded frame: a tensor (ndarray, numpy scalar as 0-d, Python bool/int/float as 0-d, or a list
/// of numbers) or a text (str, bytes, numpy str/bytes scalar, or a numpy text ndarray of one element, 0-d or [1]:
/// what openpi's transforms accept as a prompt: bytes decoded, .item() of an array).
struct Field {
  torch::Tensor tensor;
  std::optional<std::string> text;
};

/// Key path ('/'-joined for nested maps) → leaf. Nil values are left out (absent).
using Fields = std::map<std::string, Field>;

struct DecodeLimits {
  size_t max_depth = 16;          ///< nesting of maps and lists
  size_t max_map_entries = 4096;  ///< per map
  size_t max_list_items = 1 << 20;///< per list (Python lists of numbers)
  size_t max_dims = 8;            ///< ndarray rank
};

/// Decodes one binary frame. Throws pi0::UserError (one line) on anything that is not a map of the above.
Fields decode_frame(const void* data, size_t size, const DecodeLimits& limits = {});

/// numpy's dtype string for a tensor ("<f4", "|u1", "|b1", ...). UserError for types numpy lacks (bfloat16).
std::string numpy_dtype(const torch::ScalarType& type);

/// Encodes `fields` as one frame: a flat map with str keys; tensors as ndarrays, texts as str.
std::string encode_fields(const Fields& fields);

/// Encodes a JSON value (objects, arrays, strings, numbers, bools, null) as msgpack: the metadata frame.
std::string encode_json(const nlohmann::json& value);

/// The answer to one request, as openpi's server sends it.
struct Response {
  torch::Tensor actions;                ///< [H,D] (or [B,H,D]) float32
  double policy_infer_ms = 0;           ///< policy_timing.infer_ms: the model's sample_actions
  double server_infer_ms = 0;           ///< server_timing.infer_ms: inputs → model → outputs
  std::optional<double> prev_total_ms;  ///< server_timing.prev_total_ms, from the second request on
  /// {"mode": "trained"|"guided", "delay": d} when the answer continues a previous chunk (real-time chunking);
  /// null: not sent, so openpi's clients get openpi's answer exactly.
  nlohmann::json rtc;
  /// A model trained with train.subtask: the decoded subtask (string, or list for a batched request); null: not sent.
  /// openpi's clients read the keys they know, so the extra key leaves them working.
  nlohmann::json subtask;
  /// A pi0-FAST model: whether its tokens held actions (bool, or list for a batched request; false: the actions are
  /// openpi's zeros fallback); null: not sent.
  nlohmann::json fast_decodable;
};
std::string encode_response(const Response& response);

}  // namespace pi0::serve
