#include "pi0/config/config.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/common/strings.h"
#include "pi0/config/policy_metadata.h"

namespace pi0::config {
namespace {

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter e;
  e << YAML::Flow << n;
  return e.c_str();
}

[[noreturn]] void type_error(const std::string& source, const std::string& key, const YAML::Node& n,
                             const std::string& expected) {
  throw UserError(source + ": " + key + " must be " + expected + " (got " + quote_value(scalar_text(n)) + ")");
}

// A mapping key as text. YAML allows lists and mappings as keys ("{a: 1}: x"); a config never has them (found by
// fuzz/config.cpp: as<std::string>() threw YAML::BadConversion, an internal error).
std::string key_text(const YAML::Node& k, const std::string& source, const std::string& where) {
  if (k.IsScalar()) return k.Scalar();
  throw UserError(source + ": line " + std::to_string(k.Mark().line + 1) + ": " + where + " has the key " +
                  quote_value(scalar_text(k)) + ", expected a name");
}

// 1-based line of a parsed node, for messages ("?" for nodes built in code).
std::string line_of(const YAML::Mark& m) { return m.line >= 0 ? std::to_string(m.line + 1) : "?"; }

// Where each dotted key of the file is ("train.lr_peak" → its mark), for messages: the parsed tree is cloned
// before --set overrides apply, and clones lose their marks.
using KeyMarks = std::map<std::string, YAML::Mark>;

// The most values (scalars, lists, mappings) a config may hold once its aliases are expanded. The largest real
// config has a few hundred; a "billion laughs" file (a list of nine aliases of a list of nine aliases ...) has
// 9^depth, and walking it (here, in YAML::Clone, in the readers) took minutes. Refused at this bound, in
// milliseconds, before anything else walks the tree.
constexpr size_t kMaxConfigValues = 100000;

// The deepest nesting a config may have once its aliases are expanded. Real configs nest 4 levels; an alias inside
// the node it names (`b: &b [*b]`, which yaml-cpp accepts) nests without end and overflowed the stack long before
// kMaxConfigValues (found by fuzz/config_alias).
constexpr size_t kMaxConfigDepth = 64;

void count_value(size_t& values, const std::string& source) {
  if (++values <= kMaxConfigValues) return;
  throw UserError(source + ": more than " + std::to_string(kMaxConfigValues) + " values once its YAML aliases (*name) "
                  "are expanded; a config holds a few hundred (an alias bomb? expand the aliases by hand)");
}

// Records every key's mark in `marks`. yaml-cpp keeps both entries of a repeated key and operator[] returns the
// first, so a second `train:` section would be ignored without a word: a repeated key is an error naming both lines.
// `values` counts the values walked (aliases expanded), refused past kMaxConfigValues.
void index_keys(const YAML::Node& n, const std::string& prefix, const std::string& source, KeyMarks& marks,
                size_t& values, size_t depth = 0) {
  count_value(values, source);
  if (depth > kMaxConfigDepth) {
    throw UserError(source + ": nested more than " + std::to_string(kMaxConfigDepth) + " levels deep once its YAML "
                    "aliases (*name) are expanded; a config nests a few (an alias inside the node it names?)");
  }
  if (n.IsMap()) {
    std::map<std::string, YAML::Mark> seen;
    for (const auto& kv : n) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : scalar_text(kv.first);
      const auto [first, inserted] = seen.emplace(key, kv.first.Mark());
      if (!inserted) {
        throw UserError(source + ": duplicate key '" + prefix + key + "' at lines " + line_of(first->second) +
                        " and " + line_of(kv.first.Mark()) + " (a key may appear once per section; merge them)");
      }
      marks.emplace(prefix + key, kv.first.Mark());
      index_keys(kv.second, prefix + key + ".", source, marks, values, depth + 1);
    }
  } else if (n.IsSequence()) {
    const auto list = prefix.empty() ? prefix : prefix.substr(0, prefix.size() - 1);
    for (size_t i = 0; i < n.size(); ++i)
      index_keys(n[i], list + "[" + std::to_string(i) + "].", source, marks, values, depth + 1);
  }
}

template <class T>
T scalar_as(const YAML::Node& n, const std::string& source, const std::string& key, const std::string& expected) {
  if (!n.IsScalar()) type_error(source, key, n, expected);
  try {
    return n.as<T>();
  } catch (const YAML::Exception&) {
    type_error(source, key, n, expected);
  }
}

void parse(const YAML::Node& n, int64_t& out, const std::string& src, const std::string& key) {
  out = scalar_as<int64_t>(n, src, key, "an integer");
}
void parse(const YAML::Node& n, double& out, const std::string& src, const std::string& key) {
  out = scalar_as<double>(n, src, key, "a number");
}
void parse(const YAML::Node& n, bool& out, const std::string& src, const std::string& key) {
  out = scalar_as<bool>(n, src, key, "true or false");
}
void parse(const YAML::Node& n, std::string& out, const std::string& src, const std::string& key) {
  out = scalar_as<std::string>(n, src, key, "a string");
}
template <class T>
void parse(const YAML::Node& n, std::vector<T>& out, const std::string& src, const std::string& key);
void parse(const YAML::Node& n, GemmaSpec& out, const std::string& src, const std::string& key);
void parse(const YAML::Node& n, SiglipSpec& out, const std::string& src, const std::string& key);
void parse(const YAML::Node& n, DatasetEntry& out, const std::string& src, const std::string& key);
void parse(const YAML::Node& n, std::map<std::string, std::string>& out, const std::string& src,
           const std::string& key) {
  if (!n.IsMap()) type_error(src, key, n, "a mapping of names to strings");
  out.clear();
  for (const auto& kv : n) {
    const std::string name = key_text(kv.first, src, key);
    out[name] = scalar_as<std::string>(kv.second, src, key + "." + name, "a string");
  }
}

// A free-form map (serve.policy_metadata): its values are checked where they are resolved (policy_metadata.h).
void parse(const YAML::Node& n, YAML::Node& out, const std::string& src, const std::string& key) {
  if (!n.IsMap()) type_error(src, key, n, "a mapping of names to values");
  for (const auto& kv : n) key_text(kv.first, src, key);
  out = YAML::Clone(n);
  // Kept as values, not as the text's layout: a map read from the compact one-line config ({...}) would otherwise
  // be dumped in flow style, and the resolved config would not read back to the same text.
  std::function<void(YAML::Node)> plain = [&](YAML::Node node) {
    node.SetStyle(YAML::EmitterStyle::Default);
    if (node.IsMap()) {
      for (auto kv : node) plain(kv.second);
    } else if (node.IsSequence()) {
      for (auto item : node) plain(item);
    }
  };
  plain(out);
}

// Reads one section's fields; remembers which keys it knows so unknown ones can be reported.
struct Reader {
  YAML::Node node;
  std::string prefix, source;
  const KeyMarks* marks = nullptr;  // where the file's keys are (line numbers in messages); null for specs
  std::vector<std::string> known;

  template <class T>
  void operator()(const char* key, T& field, const char*) {
    known.push_back(key);
    if (!node.IsMap()) return;
    const YAML::Node n = node[key];
    if (!n) return;
    if (n.IsNull()) {
      // `key:` with nothing after it would silently mean "the default", which is rarely what was meant.
      std::string where;
      if (marks && marks->count(prefix + key)) where = " (line " + line_of(marks->at(prefix + key)) + ")";
      throw UserError(source + ": " + prefix + key + " has no value" + where +
                      "; give one ('' for an empty string) or remove the key to keep the default");
    }
    parse(n, field, source, prefix + key);
  }
  template <class S>
  void section(const char* key, S& s) {
    known.push_back(key);
    YAML::Node n = node.IsMap() ? node[key] : YAML::Node();
    read_struct(n, s, prefix + key + ".", source, marks);
  }
  void finish() const {
    if (!node || node.IsNull()) return;
    if (!node.IsMap()) {
      throw UserError(source + ": " + (prefix.empty() ? std::string("the file") : prefix.substr(0, prefix.size() - 1)) +
                      " must be a mapping of keys to values");
    }
    for (const auto& kv : node) {
      const auto key = key_text(kv.first, source, prefix.empty() ? std::string("the file") : prefix.substr(0, prefix.size() - 1));
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string msg = source + ": unknown key " + quote_value(prefix + key);
      const auto guess = did_you_mean(key, known);
      if (!guess.empty()) msg += " (did you mean '" + prefix + guess + "'?)";
      throw UserError(msg);
    }
  }

  template <class S>
  static void read_struct(const YAML::Node& n, S& s, const std::string& prefix, const std::string& source,
                          const KeyMarks* marks = nullptr) {
    Reader r{n, prefix, source, marks, {}};
    s.visit(r);
    r.finish();
  }
};

template <class T>
void parse(const YAML::Node& n, std::vector<T>& out, const std::string& src, const std::string& key) {
  if (!n.IsSequence()) {
    // `--set train.loss_mask=action_padding` is the natural first try: say the list form of what was written.
    if (n.IsScalar())
      throw UserError(src + ": " + key + " must be a list (got " + quote_value(scalar_text(n)) + "); write [" +
                      scalar_text(n) + "] for a list of one");
    type_error(src, key, n, "a list");
  }
  out.clear();
  for (size_t i = 0; i < n.size(); ++i) {
    T value{};
    const auto item_key = key + "[" + std::to_string(i) + "]";
    if constexpr (std::is_same_v<T, bool>) {
      bool b = false;
      parse(n[i], b, src, item_key);
      value = b;
    } else {
      parse(n[i], value, src, item_key);
    }
    out.push_back(value);
  }
}

// The keys of a model part's explicit dimensions that must be given: every key of its visit() but LoRA's.
struct RequiredKeys {
  std::vector<std::string> keys;
  template <class T>
  void operator()(const char* key, const T&, const char*) {
    if (std::string(key).rfind("lora_", 0) != 0) keys.emplace_back(key);
  }
};

// A model part: a variant name (scalar) or a map of dimensions, read with the same strict reader (unknown keys
// rejected with a did-you-mean); every dimension except LoRA's must be given.
template <class Spec>
void parse_spec(const YAML::Node& n, Spec& out, const std::string& src, const std::string& key) {
  if (n.IsScalar()) {
    out = Spec(scalar_as<std::string>(n, src, key, "a variant name or a map of dimensions"));
    return;
  }
  if (!n.IsMap()) type_error(src, key, n, "a variant name or a map of dimensions");
  Spec s;
  s.variant.clear();
  Reader::read_struct(n, s, key + ".", src);
  RequiredKeys required;
  s.visit(required);
  std::string all;
  for (const auto& r : required.keys) all += (all.empty() ? "" : ", ") + r;
  for (const auto& r : required.keys) {
    if (!n[r]) throw UserError(src + ": " + key + "." + r + " is missing (explicit dimensions need all of " + all + ")");
  }
  out = s;
}

void parse(const YAML::Node& n, GemmaSpec& out, const std::string& src, const std::string& key) {
  parse_spec(n, out, src, key);
}
// An entry of data.datasets: a section of its own, read with the same strict reader.
void parse(const YAML::Node& n, DatasetEntry& out, const std::string& src, const std::string& key) {
  if (!n.IsMap()) type_error(src, key, n, "a mapping of data.dataset's keys (format, paths, ...) plus weight");
  Reader::read_struct(n, out, key + ".", src);
}
void parse(const YAML::Node& n, SiglipSpec& out, const std::string& src, const std::string& key) {
  parse_spec(n, out, src, key);
}

// Writes fields back to YAML.
struct Writer {
  YAML::Node node{YAML::NodeType::Map};
  template <class T>
  void operator()(const char* key, const T& field, const char*) {
    node[key] = encode(field);
  }
  template <class S>
  void section(const char* key, S& s) {
    Writer w;
    s.visit(w);
    node[key] = w.node;
  }
  template <class T>
  static YAML::Node encode(const T& v) {
    return YAML::Node(v);
  }
  // yaml-cpp writes doubles with 17 significant digits (0.94999999999999996); the shortest text that reads back as
  // the same double is what the user wrote (0.95). Non-finite values never pass validate().
  static YAML::Node encode(double v) { return std::isfinite(v) ? YAML::Node(shortest_double(v)) : YAML::Node(v); }
  static YAML::Node encode(const std::vector<bool>& v) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (bool b : v) n.push_back(b);
    return n;
  }
  static YAML::Node encode(const std::vector<std::string>& v) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (const auto& s : v) n.push_back(s);
    return n;
  }
  template <class Spec>
  static YAML::Node encode_spec(const Spec& spec) {
    if (spec.is_named()) return YAML::Node(spec.variant);
    Writer w;
    auto copy = spec;
    copy.visit(w);
    w.node.SetStyle(YAML::EmitterStyle::Flow);
    return w.node;
  }
  static YAML::Node encode(const GemmaSpec& v) {
    auto n = encode_spec(v);
    if (!v.is_named() && v.lora_rank == 0 && v.lora_alpha == 0) {  // no LoRA: keep the map to the dimensions
      n.remove("lora_rank");
      n.remove("lora_alpha");
    }
    return n;
  }
  static YAML::Node encode(const SiglipSpec& v) { return encode_spec(v); }
  static YAML::Node encode(const std::vector<DatasetEntry>& v) {
    YAML::Node n(YAML::NodeType::Sequence);
    for (auto entry : v) {
      Writer w;
      entry.visit(w);
      n.push_back(w.node);
    }
    return n;
  }
};

// Collects (key, default, doc) for the reference.
struct Lister {
  std::string prefix;
  std::vector<std::array<std::string, 3>>* out;
  template <class T>
  void operator()(const char* key, const T& field, const char* doc) {
    out->push_back({prefix + key, scalar_text(Writer::encode(field)), doc});
    if constexpr (std::is_same_v<T, std::vector<DatasetEntry>>) {
      // An entry's keys beyond data.dataset's, as data.datasets[].weight etc.
      Lister entry{prefix + key + "[].", out};
      DatasetEntry defaults;
      defaults.visit_own(entry);
    }
  }
  template <class S>
  void section(const char* key, S& s) {
    Lister l{prefix + key + ".", out};
    s.visit(l);
  }
};

void apply_override(YAML::Node& root, const std::string& assignment, const std::string& source) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    throw UserError("--set expects section.key=value (got '" + assignment + "')");
  }
  const auto key = assignment.substr(0, eq);
  YAML::Node value;
  try {
    value = YAML::Load(assignment.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw UserError("--set " + key + ": value is not valid YAML (" + e.msg + ")");
  }
  {
    KeyMarks unused;
    size_t values = 0;
    index_keys(value, key + ".", "--set " + key, unused, values);  // an alias bomb in a value, too
  }
  if (value.IsNull()) {
    // "key=" (or key=null) used to reset the key to its built-in default without a word (a run once landed in
    // runs/default that way).
    throw UserError("--set " + assignment + ": empty value; give one (" + key + "='' for an empty string)");
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  if (parts.size() < 2) throw UserError("--set expects section.key=value (got '" + assignment + "')");
  // A part may index a list as the messages name its entries: data.datasets[1].prompt (issue 49).
  struct Part {
    std::string name;
    std::optional<size_t> index;
  };
  std::vector<Part> steps;
  for (size_t i = 0; i < parts.size(); ++i) {
    Part step{parts[i], std::nullopt};
    const auto open = parts[i].find('[');
    if (open != std::string::npos) {
      const std::string digits = parts[i].substr(open + 1, parts[i].size() - open - 2);
      const bool ok = open > 0 && parts[i].back() == ']' && !digits.empty() && digits.size() <= 9 &&
                      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (!ok)
        throw UserError("--set " + key + ": '" + parts[i] + "' is not a key or an entry of a list (expected e.g. " +
                        "data.datasets[1].prompt=...)");
      step = {parts[i].substr(0, open), static_cast<size_t>(std::stoul(digits))};
    }
    steps.push_back(step);
  }
  std::string path;  // the key so far, as messages name it
  YAML::Node node = root;
  for (size_t i = 0; i < steps.size(); ++i) {
    const bool last = i + 1 == steps.size();
    const auto& step = steps[i];
    path += (path.empty() ? "" : ".") + step.name;
    if (last && !step.index) {
      node[step.name] = value;
      break;
    }
    YAML::Node child = node[step.name];
    if (step.index) {
      // An entry must exist already (in the file or an earlier --set of the whole list): --set changes an entry,
      // and a list grown past its end would leave holes.
      const size_t n = child.IsDefined() && child.IsSequence() ? child.size() : 0;
      if (*step.index >= n)
        throw UserError("--set " + key + ": " + path + " has " + std::to_string(n) + " entr" + (n == 1 ? "y" : "ies") +
                        (n == 0 ? "" : " (" + path + "[0].." + path + "[" + std::to_string(n - 1) + "])") +
                        ", so there is no " + path + "[" + std::to_string(*step.index) +
                        "]; give the whole list to add one (" + path + "=[...])");
      path += "[" + std::to_string(*step.index) + "]";
      if (last) {
        child[*step.index] = value;
        break;
      }
      child.reset(child[*step.index]);  // reset rebinds; `=` would assign the entry over the list
    } else if (!child.IsDefined() || child.IsNull()) {
      node[step.name] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[step.name]);
    }
    if (!child.IsMap())
      throw UserError("--set " + key + ": '" + (step.index ? path : step.name) + "' is not a section" +
                      (child.IsSequence() ? " but a list (address an entry as " + path + "[0])" : ""));
    node.reset(child);
  }
  (void)source;
}

// NaN and infinity are never a meaningful setting, and `.inf` is valid YAML that passes range checks such as
// "lr_peak > 0": every floating-point field (sections, model specs) must be finite, however it was set.
struct FiniteChecker {
  std::string prefix;
  void operator()(const char* key, const double& v, const char*) const {
    if (std::isfinite(v)) return;
    std::ostringstream os;
    os << prefix << key << " must be a finite number (got " << v << ")";
    throw UserError(os.str());
  }
  template <class T>
  void operator()(const char* key, const T& field, const char*) const {
    if constexpr (std::is_same_v<T, GemmaSpec> || std::is_same_v<T, SiglipSpec>) {
      if (field.is_named()) return;
      FiniteChecker inner{prefix + key + "."};
      auto copy = field;
      copy.visit(inner);
    } else if constexpr (std::is_same_v<T, std::vector<DatasetEntry>>) {
      for (size_t i = 0; i < field.size(); ++i) {
        FiniteChecker inner{prefix + key + "[" + std::to_string(i) + "]."};
        auto copy = field[i];
        copy.visit(inner);
      }
    }
  }
  template <class S>
  void section(const char* key, S& s) const {
    FiniteChecker inner{prefix + key + "."};
    s.visit(inner);
  }
};

template <class T>
void require(bool ok, const std::string& key, const T& value, const std::string& expected) {
  if (ok) return;
  std::ostringstream os;
  os << key << " must be " << expected << " (got " << value << ")";
  throw UserError(os.str());
}

bool has_control_char(const std::string& s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// A path from the config: a control character (a newline, an escape) is never part of a real path and would split
// or garble every log line that names it.
void require_plain_path(const std::string& key, const std::string& value) {
  if (!has_control_char(value)) return;
  throw UserError(key + " must be a path without control characters (newline, tab, escape) (got " +
                  quote_value(value) + ")");
}

// The longest file name Linux file systems take (NAME_MAX of ext4, xfs, btrfs; in bytes, not characters).
constexpr size_t kMaxFileNameBytes = 255;

// An asset id names the folder assets/<asset_id>/ inside every checkpoint and bundle: '..', a '/' or an absolute
// path would put norm_stats.json outside them (overwriting what is there), and a name longer than a file name may be
// would fail only at the first checkpoint save, after save_interval steps of training.
void require_folder_name(const std::string& key, const std::string& id) {
  require(!id.empty() && id != "." && id != ".." && id.find('/') == std::string::npos && !has_control_char(id), key,
          quote_value(id), "a plain folder name (no '/', not '.' or '..', no control characters), e.g. 'libero'");
  if (id.size() <= kMaxFileNameBytes) return;
  throw UserError(key + " must be a folder name of at most " + std::to_string(kMaxFileNameBytes) + " bytes (got " +
                  std::to_string(id.size()) + " bytes: " + quote_value(id.substr(0, 24)) + "...)");
}

}  // namespace

std::string GemmaSpec::describe() const { return scalar_text(Writer::encode(*this)); }
std::string SiglipSpec::describe() const { return scalar_text(Writer::encode(*this)); }

Config parse_config(const YAML::Node& input, const std::string& source, const std::vector<std::string>& overrides) {
  KeyMarks marks;
  size_t values = 0;
  index_keys(input, "", source, marks, values);
  YAML::Node root = input && !input.IsNull() ? YAML::Clone(input) : YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) throw UserError(source + ": the config must be a mapping of sections (model, data, train, ...)");
  for (const auto& o : overrides) apply_override(root, o, source);
  if (const YAML::Node data = root["data"]; data.IsMap() && data["dataset"] && data["datasets"] &&
                                              data["datasets"].IsSequence() && data["datasets"].size() > 0) {
    throw UserError(source + ": data.dataset and data.datasets are both set; a mixture lists every dataset under "
                    "data.datasets (move data.dataset's keys into an entry), a single dataset needs only data.dataset");
  }
  Config c;
  Reader::read_struct(root, c, "", source, &marks);
  // train.gradient_checkpointing was a bool until `auto` joined it: every spelling YAML reads as a bool (True, yes,
  // on, ...) keeps meaning what it did.
  if (bool on = false; YAML::convert<bool>::decode(YAML::Node(c.train.gradient_checkpointing), on))
    c.train.gradient_checkpointing = on ? "true" : "false";
  validate(c);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!pi0::posix_fs::exists(path, ec)) throw UserError("config file '" + path + "' does not exist" + relative_path_note(path, ""));
  if (pi0::posix_fs::is_directory(path, ec)) {
    throw UserError("config file '" + path + "' is a directory; expected a YAML file (e.g. configs/debug.yaml)");
  }
  // A FIFO or /dev/zero would block or never end; a file we may not read says so.
  require_input_file(path, "config file", "a YAML file (e.g. configs/debug.yaml)");
  std::ifstream f(path);
  if (!f) throw UserError("config file '" + path + "' cannot be read (" + std::strerror(errno) + ")");
  YAML::Node root;
  try {
    root = YAML::Load(f);
  } catch (const YAML::Exception& e) {
    throw UserError("config file '" + path + "' is not valid YAML: line " + std::to_string(e.mark.line + 1) + ": " +
                    e.msg);
  }
  // An empty file would otherwise run as "all defaults": the full-size model with no data, failing late.
  if (root.IsNull()) {
    throw UserError("config file '" + path + "' is empty; expected the sections model, data, train, checkpoint "
                    "(start from configs/debug.yaml; pi0-train --config-reference lists every key)");
  }
  return parse_config(root, path, overrides);
}

int64_t micro_batch_size(const TrainConfig& t, int64_t world_size) {
  const int64_t per_step = world_size * t.grad_accum_steps;
  if (per_step < 1 || t.batch_size % per_step != 0) {
    throw UserError("train.batch_size must be divisible by world size (" + std::to_string(world_size) +
                    ") × train.grad_accum_steps (" + std::to_string(t.grad_accum_steps) + ") (got " +
                    std::to_string(t.batch_size) + ")");
  }
  return t.batch_size / per_step;
}

namespace {

// model.type pi0_fast (docs/pi0_fast.md): what it needs, and the settings that belong to the flow-matching models'
// action expert or to parts of the trainer pi0-FAST does not run, refused rather than silently ignored.
void validate_pi0_fast(const Config& c) {
  const auto& m = c.model;
  const auto& t = c.train;
  require_plain_path("model.fast_tokenizer", m.fast_tokenizer);
  if (m.type != "pi0_fast") {
    require(m.fast_tokenizer.empty(), "model.fast_tokenizer", quote_value(m.fast_tokenizer),
            "empty with model.type " + m.type + " (pi0_fast only; pi0.5's insulation reads train.ki.fast_tokenizer)");
    return;
  }
  require(!m.fast_tokenizer.empty(), "model.fast_tokenizer", "''",
          "a FAST tokenizer folder (processor_config.json + tokenizer.json) with model.type pi0_fast");
  require(m.max_decoding_steps > 0, "model.max_decoding_steps", m.max_decoding_steps, "> 0");
  require(m.temperature >= 0, "model.temperature", m.temperature, ">= 0 (0 = greedy)");
  require(t.rtc_max_delay == 0, "train.rtc_max_delay", t.rtc_max_delay,
          "0 with model.type pi0_fast (real-time chunking trains the flow-matching expert)");
  require(t.loss_mask.empty(), "train.loss_mask", quote_value(t.loss_mask.empty() ? "" : t.loss_mask[0]),
          "[] with model.type pi0_fast (its loss is over FAST tokens, not action positions)");
  for (const char* preset : {"action-expert-only", "projection-only"}) {
    require(t.freeze != preset, "train.freeze", quote_value(t.freeze),
            "full, +vision, +language, freeze-vision, lora or lora-only with model.type pi0_fast (it has no action "
            "expert or action projections)");
  }
  require(t.offload == "none", "train.offload", quote_value(t.offload),
          "none with model.type pi0_fast (the host update is not wired to its forward)");
  require(t.gradient_checkpointing != "auto", "train.gradient_checkpointing", "'auto'",
          "true or false with model.type pi0_fast (the memory plan does not model it)");
}

}  // namespace

void validate(const Config& c) {
  {
    FiniteChecker finite;
    auto copy = c;  // visit() is not const
    copy.visit(finite);
  }
  const auto& m = c.model;
  require(m.type == "pi0" || m.type == "pi05" || m.type == "pi0_fast", "model.type", "'" + m.type + "'",
          "pi0, pi05 or pi0_fast");
  require(m.vocab_size > 0, "model.vocab_size", m.vocab_size, "> 0");
  require(m.image_size > 0, "model.image_size", m.image_size, "> 0");
  require(m.action_dim > 0, "model.action_dim", m.action_dim, "> 0");
  require(m.action_horizon > 0, "model.action_horizon", m.action_horizon, "> 0");
  require(m.max_token_len >= 0, "model.max_token_len", m.max_token_len, ">= 0 (0 = model default)");
  for (const auto& [key, g] : {std::pair<std::string, const GemmaSpec*>{"model.paligemma_variant", &m.paligemma_variant},
                               {"model.action_expert_variant", &m.action_expert_variant}}) {
    if (g->is_named()) continue;
    require(g->width > 0, key + ".width", g->width, "> 0");
    require(g->depth > 0, key + ".depth", g->depth, "> 0");
    require(g->mlp_dim > 0, key + ".mlp_dim", g->mlp_dim, "> 0");
    require(g->num_heads > 0, key + ".num_heads", g->num_heads, "> 0");
    require(g->num_kv_heads > 0, key + ".num_kv_heads", g->num_kv_heads, "> 0");
    require(g->num_heads % g->num_kv_heads == 0, key + ".num_heads", g->num_heads,
            "a multiple of num_kv_heads (" + std::to_string(g->num_kv_heads) + ")");
    require(g->head_dim > 0 && g->head_dim % 2 == 0, key + ".head_dim", g->head_dim, "> 0 and even (RoPE)");
    require(g->lora_rank >= 0, key + ".lora_rank", g->lora_rank, ">= 0 (0 = no LoRA)");
    require(g->lora_rank == 0 || g->lora_alpha > 0, key + ".lora_alpha", g->lora_alpha, "> 0 when lora_rank > 0");
  }
  if (!m.siglip_variant.is_named()) {
    const auto& v = m.siglip_variant;
    const std::string key = "model.siglip_variant";
    require(v.width > 0, key + ".width", v.width, "> 0");
    require(v.depth > 0, key + ".depth", v.depth, "> 0");
    require(v.mlp_dim > 0, key + ".mlp_dim", v.mlp_dim, "> 0");
    require(v.num_heads > 0, key + ".num_heads", v.num_heads, "> 0");
    require(v.width % v.num_heads == 0, key + ".width", v.width,
            "a multiple of num_heads (" + std::to_string(v.num_heads) + ")");
    require(v.patch_size > 0, key + ".patch_size", v.patch_size, "> 0");
  }
  require(c.model.attention == "auto" || c.model.attention == "explicit" || c.model.attention == "sdpa",
          "model.attention", "'" + c.model.attention + "'", "auto, explicit or sdpa");
  const auto entries = dataset_entries(c);
  std::set<std::string> asset_ids;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& d = entries[i];
    const std::string key = dataset_key(c, i);
    require(d.format == "libero" || d.format == "aloha" || d.format == "lerobot", key + ".format",
            "'" + d.format + "'", "libero, aloha or lerobot");
    require(d.adapt_to_pi == "auto" || d.adapt_to_pi == "true" || d.adapt_to_pi == "false", key + ".adapt_to_pi",
            "'" + d.adapt_to_pi + "'", "auto, true or false");
    require(d.flip_images == "auto" || d.flip_images == "true" || d.flip_images == "false", key + ".flip_images",
            "'" + d.flip_images + "'", "auto, true or false");
    for (size_t p = 0; p < d.paths.size(); ++p) require_plain_path(key + ".paths[" + std::to_string(p) + "]", d.paths[p]);
    if (c.data.datasets.empty()) continue;  // the single dataset's stats and asset are data.norm_stats, checkpoint.asset_id
    require(d.weight > 0, key + ".weight", d.weight, "> 0");
    require_plain_path(key + ".norm_stats", d.norm_stats);
    const auto& id = d.asset_id;
    require_folder_name(key + ".asset_id", id);
    require(asset_ids.insert(id).second, key + ".asset_id", quote_value(id),
            "unique among data.datasets (each entry's stats live in assets/<asset_id>/)");
    for (const int64_t e : d.validation_episodes)
      require(e >= 0, key + ".validation_episodes", e, "episode indices >= 0");
  }
  if (!c.data.datasets.empty()) {
    // Each weight is finite, but their sum may not be (two of 1e308): every draw would then pick the last entry.
    double sum = 0;
    std::string terms;
    for (const auto& d : c.data.datasets) {
      sum += d.weight;
      terms += (terms.empty() ? "" : " + ") + shortest_double(d.weight);
    }
    require(std::isfinite(sum), "data.datasets[].weight", terms + " = " + shortest_double(sum),
            "weights with a finite sum (only their ratios count: scale them down)");
  }
  require(c.data.validation_split >= 0 && c.data.validation_split < 1, "data.validation_split",
          c.data.validation_split, "in [0, 1) (0 = no validation split)");
  require(c.data.num_workers >= 0, "data.num_workers", c.data.num_workers, ">= 0");
  require(c.data.prefetch >= 1, "data.prefetch", c.data.prefetch, ">= 1");
  const auto& t = c.train;
  require(t.num_steps > 0, "train.num_steps", t.num_steps, "> 0");
  require(t.batch_size > 0, "train.batch_size", t.batch_size, "> 0");
  require(t.grad_accum_steps > 0, "train.grad_accum_steps", t.grad_accum_steps, "> 0");
  require(t.batch_size % t.grad_accum_steps == 0, "train.batch_size", t.batch_size,
          "a multiple of train.grad_accum_steps (" + std::to_string(t.grad_accum_steps) + ")");
  require(t.precision == "float32" || t.precision == "bf16-mixed" || t.precision == "bf16", "train.precision",
          "'" + t.precision + "'", "float32, bf16-mixed or bf16");
  require(t.offload == "none" || t.offload == "optimizer" || t.offload == "auto", "train.offload",
          "'" + t.offload + "'", "none, optimizer or auto");
  require(t.gradient_checkpointing == "false" || t.gradient_checkpointing == "true" || t.gradient_checkpointing == "auto",
          "train.gradient_checkpointing", "'" + t.gradient_checkpointing + "'", "false, true or auto");
  require(t.device == "cpu" || t.device.rfind("cuda", 0) == 0, "train.device", "'" + t.device + "'",
          "cpu, cuda or cuda:N");
  require(t.lr_schedule == "cosine" || t.lr_schedule == "rsqrt" || t.lr_schedule == "constant", "train.lr_schedule",
          quote_value(t.lr_schedule), "cosine, rsqrt or constant");
  require(t.lr_warmup_steps >= 0, "train.lr_warmup_steps", t.lr_warmup_steps, ">= 0");
  require(t.lr_peak > 0, "train.lr_peak", t.lr_peak, "> 0");
  require(t.lr_end >= 0, "train.lr_end", t.lr_end, ">= 0");
  // Only the cosine reads lr_decay_steps: a long rsqrt or constant warmup need not move it.
  if (t.lr_schedule == "cosine")
    require(t.lr_decay_steps >= t.lr_warmup_steps, "train.lr_decay_steps", t.lr_decay_steps,
            ">= train.lr_warmup_steps (" + std::to_string(t.lr_warmup_steps) + ") with train.lr_schedule=cosine");
  require(t.lr_timescale > 0, "train.lr_timescale", t.lr_timescale, "> 0 (steps)");
  require(t.adam_b1 >= 0 && t.adam_b1 < 1, "train.adam_b1", t.adam_b1, "in [0, 1)");
  require(t.adam_b2 >= 0 && t.adam_b2 < 1, "train.adam_b2", t.adam_b2, "in [0, 1)");
  require(t.adam_eps > 0, "train.adam_eps", t.adam_eps, "> 0");
  require(t.weight_decay >= 0, "train.weight_decay", t.weight_decay, ">= 0");
  require(t.clip_grad_norm >= 0, "train.clip_grad_norm", t.clip_grad_norm, ">= 0 (0 = off)");
  require(t.ema_decay >= 0 && t.ema_decay < 1, "train.ema_decay", t.ema_decay, "in [0, 1) (0 = off)");
  require(t.max_nonfinite_skips >= 0, "train.max_nonfinite_skips", t.max_nonfinite_skips, ">= 0");
  require(t.log_interval > 0, "train.log_interval", t.log_interval, "> 0");
  require(t.metrics_interval >= 0, "train.metrics_interval", t.metrics_interval, ">= 0 (0 = log_interval)");
  require(t.num_threads >= 0, "train.num_threads", t.num_threads, ">= 0 (0 = OMP_NUM_THREADS or all cores)");
  // The delay leaves at least one position in the loss and one row for the robot to continue at.
  require(t.rtc_max_delay >= 0 && t.rtc_max_delay < c.model.action_horizon, "train.rtc_max_delay", t.rtc_max_delay,
          "in 0.." + std::to_string(c.model.action_horizon - 1) + " (below model.action_horizon; 0 = off)");
  require(t.rtc_delay_distribution == "uniform" || t.rtc_delay_distribution == "exp", "train.rtc_delay_distribution",
          "'" + t.rtc_delay_distribution + "'", "uniform or exp");
  for (size_t i = 0; i < t.loss_mask.size(); ++i) {
    require(t.loss_mask[i] == "episode_end" || t.loss_mask[i] == "action_padding",
            "train.loss_mask[" + std::to_string(i) + "]", quote_value(t.loss_mask[i]), "episode_end or action_padding");
  }
  require(t.val_interval >= 0, "train.val_interval", t.val_interval, ">= 0 (0 = checkpoint.save_interval)");
  require(t.val_samples >= 0, "train.val_samples", t.val_samples, ">= 0 (0 = every held-out frame)");
  require(t.rtc_delay_exp_rate > 0 && std::isfinite(t.rtc_delay_exp_rate), "train.rtc_delay_exp_rate",
          t.rtc_delay_exp_rate, "a finite number > 0");
  if (t.ki.enabled) {
    // The action expert must read a prefix the backbone also sees at inference (pi0.5's adaRMS expert, no state
    // token); pi0 is not how the paper trains with insulation.
    require(c.model.type == "pi05", "train.ki.enabled", "true with model.type '" + c.model.type + "'",
            "model.type pi05 (knowledge insulation trains pi0.5)");
    require(!t.ki.fast_tokenizer.empty(), "train.ki.fast_tokenizer", "''",
            "a FAST tokenizer folder (processor_config.json + tokenizer.json) when train.ki.enabled");
    require(t.ki.max_fast_tokens >= 3, "train.ki.max_fast_tokens", t.ki.max_fast_tokens,
            ">= 3 (at least one FAST id, the separator and EOS)");
    require(t.ki.ce_weight >= 0, "train.ki.ce_weight", t.ki.ce_weight, ">= 0");
    require(t.ki.flow_weight >= 0, "train.ki.flow_weight", t.ki.flow_weight, ">= 0");
    require(t.ki.ce_weight > 0 || t.ki.flow_weight > 0, "train.ki.ce_weight", t.ki.ce_weight,
            "> 0 when train.ki.flow_weight is 0 (nothing would train)");
  }
  require_plain_path("train.ki.fast_tokenizer", t.ki.fast_tokenizer);
  validate_pi0_fast(c);
  if (t.subtask.enabled) {
    // The block sits in pi0.5's prefix and is read by its adaRMS expert, as the pi0.5 paper trains it.
    require(c.model.type == "pi05", "train.subtask.enabled", "true with model.type '" + c.model.type + "'",
            "model.type pi05 (subtask prediction trains pi0.5)");
    require(!t.subtask.key.empty(), "train.subtask.key", "''",
            "the data key holding each frame's subtask (a lerobot column, an HDF5 dataset or attribute)");
    require(t.subtask.max_tokens >= 2, "train.subtask.max_tokens", t.subtask.max_tokens,
            ">= 2 (at least one subtask token and EOS)");
    require(t.subtask.weight >= 0 && std::isfinite(t.subtask.weight), "train.subtask.weight", t.subtask.weight,
            "a finite number >= 0");
  }
  const auto& k = c.checkpoint;
  require(!k.run_dir.empty(), "checkpoint.run_dir", "''", "a directory path");
  require_plain_path("checkpoint.run_dir", k.run_dir);
  require_plain_path("checkpoint.init_weights", k.init_weights);
  require_plain_path("data.norm_stats", c.data.norm_stats);
  require_plain_path("data.tokenizer", c.data.tokenizer);
  require_folder_name("checkpoint.asset_id", k.asset_id);
  require(k.save_interval > 0, "checkpoint.save_interval", k.save_interval, "> 0");
  require(k.keep_last >= 1, "checkpoint.keep_last", k.keep_last, ">= 1");
  require(k.keep_period >= 0, "checkpoint.keep_period", k.keep_period, ">= 0 (0 = none)");
  require(k.keep_best >= 0, "checkpoint.keep_best", k.keep_best, ">= 0 (0 = none)");
  require(k.keep_best == 0 || validation_enabled(c), "checkpoint.keep_best", k.keep_best,
          "0 without a validation split (set data.validation_split or an entry's validation_episodes: the best are "
          "chosen by val_loss)");
  require(k.resume_policy == "newest_verified" || k.resume_policy == "strict", "checkpoint.resume_policy",
          "'" + k.resume_policy + "'", "newest_verified or strict");
  require(c.dist.bucket_size_mb > 0, "dist.bucket_size_mb", c.dist.bucket_size_mb, "> 0");
  require(c.dist.timeout_s > 0, "dist.timeout_s", c.dist.timeout_s, "> 0");
  require(c.dist.shard == "none" || c.dist.shard == "optimizer" || c.dist.shard == "gradients", "dist.shard",
          "'" + c.dist.shard + "'", "none, optimizer or gradients");
  // Refuses what pi0-serve could not send, at config load rather than at serving time: a bundle serves one dataset's
  // robot profile (pi0-serve --asset), so each entry's.
  for (size_t i = 0; i < entries.size(); ++i) policy_metadata(for_dataset(c, i));
}

YAML::Node to_yaml(const Config& config) {
  Writer w;
  auto copy = config;
  copy.visit(w);
  // A mixture lists every dataset under data.datasets; data.dataset's defaults beside it would read back as both set.
  if (!config.data.datasets.empty()) w.node["data"].remove("dataset");
  return w.node;
}

std::vector<DatasetEntry> dataset_entries(const Config& config) {
  std::vector<DatasetEntry> out;
  if (config.data.datasets.empty()) {
    DatasetEntry e;
    static_cast<DatasetConfig&>(e) = config.data.dataset;
    out.push_back(e);
  } else {
    out = config.data.datasets;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i].norm_stats.empty()) out[i].norm_stats = config.data.norm_stats;
    if (out[i].asset_id.empty())
      out[i].asset_id = config.checkpoint.asset_id + (i == 0 ? std::string() : "_" + std::to_string(i));
    if (out[i].delta_action_mask.empty()) out[i].delta_action_mask = config.data.delta_action_mask;
  }
  return out;
}

std::string delta_action_mask_key(const Config& config, size_t i) {
  const bool own = i < config.data.datasets.size() && !config.data.datasets[i].delta_action_mask.empty();
  return own ? dataset_key(config, i) + ".delta_action_mask" : std::string("data.delta_action_mask");
}

std::string dataset_key(const Config& config, size_t i) {
  return config.data.datasets.empty() ? std::string("data.dataset") : "data.datasets[" + std::to_string(i) + "]";
}

Config for_dataset(const Config& config, size_t i) {
  const auto entries = dataset_entries(config);
  PI0_CHECK(i < entries.size(), "for_dataset: entry ", i, " of ", entries.size());
  Config out = config;
  out.data.dataset = entries[i];  // the DatasetConfig part
  out.data.datasets.clear();
  out.data.norm_stats = entries[i].norm_stats;
  out.data.delta_action_mask = entries[i].delta_action_mask;
  out.checkpoint.asset_id = entries[i].asset_id;
  return out;
}

bool validation_enabled(const Config& config) {
  if (config.data.validation_split > 0) return true;
  for (const auto& e : config.data.datasets)
    if (!e.validation_episodes.empty()) return true;
  return false;
}

int64_t val_interval(const Config& config) {
  return config.train.val_interval > 0 ? config.train.val_interval : config.checkpoint.save_interval;
}

LossMask loss_mask(const TrainConfig& train) {
  LossMask m;
  for (const auto& s : train.loss_mask) {
    if (s == "episode_end") m.episode_end = true;
    if (s == "action_padding") m.action_padding = true;
  }
  return m;
}

std::string to_compact_text(const Config& config) {
  // One flow mapping per section, wrapped after commas: the whole config in a dozen lines of valid YAML.
  constexpr size_t kWidth = 118;
  std::vector<std::string> lines;
  for (const auto& section : to_yaml(config)) {
    YAML::Emitter e;
    e << YAML::Flow << section.second;
    const std::string flow = e.c_str();
    // Pieces that may start a line: split after each comma outside a quoted string (a flow collection may continue
    // on the next line when indented past its key, at any nesting depth).
    std::vector<std::string> entries;
    bool quoted = false;
    size_t start = 0;
    for (size_t i = 0; i < flow.size(); ++i) {
      const char c = flow[i];
      if (c == '"' && (i == 0 || flow[i - 1] != '\\')) quoted = !quoted;
      if (quoted) continue;
      if (c == ',' || i + 1 == flow.size()) {
        const size_t from = flow.find_first_not_of(' ', start);
        entries.push_back(flow.substr(from, i + 1 - from));
        start = i + 1;
      }
    }
    const std::string head = section.first.Scalar() + ": ", indent(head.size() + 1, ' ');
    std::string line = head;
    for (const auto& entry : entries) {
      const bool fresh = line == head || line == indent;
      if (!fresh && line.size() + 1 + entry.size() > kWidth) {
        lines.push_back(line);
        line = indent;
      }
      line += (line == head || line == indent ? "" : " ") + entry;
    }
    lines.push_back(line);
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "\n") + l;
  return out;
}

std::vector<std::array<std::string, 3>> config_reference() {
  std::vector<std::array<std::string, 3>> out;
  Config defaults;
  Lister l{"", &out};
  defaults.visit(l);
  return out;
}

}  // namespace pi0::config
