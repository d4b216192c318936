#include "pi0/config/policy_metadata.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"

namespace pi0::config {
namespace {

// Values are sent to every client: a bound on their size keeps a YAML alias bomb or a mistake out of the handshake.
constexpr size_t kMaxNodes = 100000;

bool is_integer(const std::string& s) {
  size_t i = (!s.empty() && (s[0] == '-' || s[0] == '+')) ? 1 : 0;
  if (i == s.size()) return false;
  for (; i < s.size(); ++i)
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// One YAML value as JSON: maps, lists, null, and scalars typed as YAML's core schema reads them (true/false, an
// integer, a number; anything else, and every quoted scalar, is a string).
nlohmann::json to_json(const YAML::Node& n, const std::string& key, size_t& nodes) {
  if (++nodes > kMaxNodes)
    throw UserError(key + ": more than " + std::to_string(kMaxNodes) + " values, expected a small map of metadata");
  if (!n || n.IsNull()) return nullptr;
  if (n.IsSequence()) {
    auto out = nlohmann::json::array();
    for (size_t i = 0; i < n.size(); ++i) out.push_back(to_json(n[i], key + "[" + std::to_string(i) + "]", nodes));
    return out;
  }
  if (n.IsMap()) {
    auto out = nlohmann::json::object();
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) throw UserError(key + ": a map key that is not a name, expected names as keys");
      out[kv.first.Scalar()] = to_json(kv.second, key + "." + kv.first.Scalar(), nodes);
    }
    return out;
  }
  const std::string& s = n.Scalar();
  if (n.Tag() == "!") return s;  // quoted: always a string
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "true") return true;
  if (lower == "false") return false;
  if (is_integer(s)) {
    errno = 0;
    const long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == 0) return static_cast<int64_t>(v);
  }
  try {
    const double v = n.as<double>();
    if (!std::isfinite(v)) throw UserError(key + " must be a finite number (got " + quote_value(s) + ")");
    return v;
  } catch (const YAML::Exception&) {
    return s;
  }
}

}  // namespace

const std::vector<std::string>& reserved_metadata_keys() {
  static const std::vector<std::string> keys = {
      "server",     "model_type", "robot",     "action_horizon", "action_dim", "model_action_dim",
      "state_dim",  "image_size", "max_token_len", "num_steps", "max_batch", "adapt_to_pi",
      "config_id",  "bundle",     "device",    "dtype",          "rtc",        "subtask",
      "fast"};
  return keys;
}

nlohmann::json default_policy_metadata(const Config& config) {
  const auto& d = config.data.dataset;
  if (d.format == "aloha" || d.adapt_to_pi_enabled())
    return {{"reset_pose", nlohmann::json::array({0, -1.5, 1.5, 0, 0, 0})}};  // openpi's value, ints and floats alike
  return nlohmann::json::object();
}

void set_policy_metadata(nlohmann::json& metadata, const std::string& key, const nlohmann::json& value,
                         const std::string& source) {
  if (key.empty()) throw UserError(source + ": empty key, expected a name");
  const auto& reserved = reserved_metadata_keys();
  if (std::find(reserved.begin(), reserved.end(), key) != reserved.end())
    throw UserError(source + ": '" + key + "' is a key pi0-serve's metadata sets itself, expected another name");
  if (value.is_null()) metadata.erase(key);
  else metadata[key] = value;
}

nlohmann::json policy_metadata(const Config& config) {
  nlohmann::json out = default_policy_metadata(config);
  const auto& declared = config.serve.policy_metadata;
  size_t nodes = 0;
  if (declared && declared.IsMap()) {
    for (const auto& kv : declared) {
      const std::string key = "serve.policy_metadata." + kv.first.Scalar();
      set_policy_metadata(out, kv.first.Scalar(), to_json(kv.second, key, nodes), key);
    }
  }
  return out;
}

}  // namespace pi0::config
