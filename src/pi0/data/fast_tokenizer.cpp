// FAST action tokenizer; see fast_tokenizer.h. The BPE follows HF `tokenizers` (models/bpe/word.rs merge order,
// pre_tokenizers/byte_level.rs split and byte map, decoders ByteLevel + String::from_utf8_lossy); only behaviour is
// reproduced, checked by tests/unit/data/test_fast_tokenizer.cpp against tests/data/fast_reference.py's outputs.
#include "pi0/data/fast_tokenizer.h"

#include <oniguruma.h>

#include <cmath>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"

namespace pi0::data {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer regex, as HF's ByteLevel pre-tokenizer compiles it (with Oniguruma).
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char32_t kReplacement = 0xFFFD;
constexpr double kPi = 3.14159265358979323846;  // M_PI is not standard C++

std::string dump(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError(path + ": cannot read (a FAST tokenizer folder holds tokenizer.json and processor_config.json)");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw UserError(path + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

[[noreturn]] void unsupported(const std::string& path, const std::string& field, const json& v,
                              const std::string& expected) {
  throw UserError(path + ": " + field + " is " + dump(v) + "; FastTokenizer supports only " + expected);
}

/// j[key] if present and not null, else nullptr.
const json* field(const json& j, const char* key) {
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}

bool is_null_or(const json& j, const char* key, const json& allowed) {
  const json* v = field(j, key);
  return v == nullptr || *v == allowed;
}

/// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards in order.
struct ByteMap {
  char32_t to_char[256];
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

/// cos(pi * k * (2n + 1) / (2H)), with the angle reduced exactly in integers first.
double dct_cos(int64_t k, int64_t n, int64_t H) {
  const int64_t m = (k * (2 * n + 1)) % (4 * H);
  return std::cos(kPi * static_cast<double>(m) / static_cast<double>(2 * H));
}

void onig_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

}  // namespace

struct FastTokenizer::Regex {
  regex_t* reg = nullptr;
  ~Regex() {
    if (reg != nullptr) onig_free(reg);
  }
};

FastTokenizer::~FastTokenizer() = default;
FastTokenizer::FastTokenizer(FastTokenizer&&) noexcept = default;
FastTokenizer& FastTokenizer::operator=(FastTokenizer&&) noexcept = default;

const std::vector<std::string>& FastTokenizer::file_names() {
  static const std::vector<std::string> names = {"processor_config.json", "tokenizer.json", "tokenizer_config.json"};
  return names;
}

FastTokenizer::FastTokenizer(const std::string& dir) : dir_(dir) {
  // processor_config.json: the FAST processor's own settings.
  const std::string ppath = dir + "/processor_config.json";
  const json proc = read_json(ppath);
  if (!proc.is_object()) unsupported(ppath, "the top level", proc, "an object");
  const json* scale = field(proc, "scale");
  if (scale == nullptr || !scale->is_number() || !(scale->get<double>() > 0) || !std::isfinite(scale->get<double>()))
    unsupported(ppath, "scale", scale ? *scale : json(), "a number > 0 (the released tokenizer has 10)");
  scale_ = scale->get<double>();
  const json* min_token = field(proc, "min_token");
  if (min_token == nullptr || !min_token->is_number_integer())
    unsupported(ppath, "min_token", min_token ? *min_token : json(), "an integer (the released tokenizer has -354)");
  min_token_ = min_token->get<int64_t>();
  const json* vocab_size = field(proc, "vocab_size");
  if (vocab_size == nullptr || !vocab_size->is_number_integer() || vocab_size->get<int64_t>() <= 0)
    unsupported(ppath, "vocab_size", vocab_size ? *vocab_size : json(), "an integer > 0 (the released tokenizer has 2048)");
  vocab_size_ = vocab_size->get<int64_t>();
  for (const char* key : {"time_horizon", "action_dim"}) {
    const json* v = field(proc, key);
    if (v != nullptr && (!v->is_number_integer() || v->get<int64_t>() <= 0))
      unsupported(ppath, key, *v, "null or an integer > 0");
    (std::string(key) == "time_horizon" ? time_horizon_ : action_dim_) = v ? v->get<int64_t>() : 0;
  }

  // tokenizer_config.json (optional): transformers' decode would also "clean up" spaces before punctuation, which
  // changes FAST text; the FAST processor turns it off.
  const std::string cpath = dir + "/tokenizer_config.json";
  if (std::ifstream(cpath).good()) {
    const json cfg = read_json(cpath);
    if (cfg.is_object() && !is_null_or(cfg, "clean_up_tokenization_spaces", false))
      unsupported(cpath, "clean_up_tokenization_spaces", cfg["clean_up_tokenization_spaces"], "false");
  }

  // tokenizer.json: a byte-level BPE with nothing around it that would change ids.
  const std::string tpath = dir + "/tokenizer.json";
  const json tok = read_json(tpath);
  if (!tok.is_object()) unsupported(tpath, "the top level", tok, "an object");
  for (const char* key : {"normalizer", "truncation", "padding"})
    if (field(tok, key) != nullptr) unsupported(tpath, key, tok[key], "null");
  if (const json* added = field(tok, "added_tokens"); added != nullptr && !(added->is_array() && added->empty()))
    unsupported(tpath, "added_tokens", *added, "[] (FAST tokenizers have no special tokens)");
  const json* pre = field(tok, "pre_tokenizer");
  if (pre == nullptr || !pre->is_object() || pre->value("type", "") != "ByteLevel")
    unsupported(tpath, "pre_tokenizer", pre ? *pre : json(), "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}");
  if (!is_null_or(*pre, "add_prefix_space", false))
    unsupported(tpath, "pre_tokenizer.add_prefix_space", (*pre)["add_prefix_space"], "false");
  if (const json* ur = field(*pre, "use_regex"); ur != nullptr) {
    if (!ur->is_boolean()) unsupported(tpath, "pre_tokenizer.use_regex", *ur, "true or false");
    use_regex_ = ur->get<bool>();
  }
  const json* dec = field(tok, "decoder");
  if (dec == nullptr || !dec->is_object() || dec->value("type", "") != "ByteLevel")
    unsupported(tpath, "decoder", dec ? *dec : json(), "{\"type\": \"ByteLevel\"}");
  // ByteLevel post-processing only moves offsets; anything else (a template) would add ids.
  if (const json* post = field(tok, "post_processor"); post != nullptr && (!post->is_object() || post->value("type", "") != "ByteLevel"))
    unsupported(tpath, "post_processor", *post, "null or {\"type\": \"ByteLevel\"}");

  const json* model = field(tok, "model");
  if (model == nullptr || !model->is_object() || model->value("type", "") != "BPE")
    unsupported(tpath, "model.type", model && model->is_object() ? model->value("type", json()) : json(), "\"BPE\"");
  if (!is_null_or(*model, "dropout", 0.0)) unsupported(tpath, "model.dropout", (*model)["dropout"], "null");
  if (field(*model, "unk_token") != nullptr)
    unsupported(tpath, "model.unk_token", (*model)["unk_token"], "null (unknown symbols are dropped, as upstream)");
  if (!is_null_or(*model, "byte_fallback", false)) unsupported(tpath, "model.byte_fallback", (*model)["byte_fallback"], "false");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (!is_null_or(*model, key, "")) unsupported(tpath, std::string("model.") + key, (*model)[key], "null");
  if (const json* im = field(*model, "ignore_merges"); im != nullptr) {
    if (!im->is_boolean()) unsupported(tpath, "model.ignore_merges", *im, "true or false");
    ignore_merges_ = im->get<bool>();
  }

  const json* vocab = field(*model, "vocab");
  if (vocab == nullptr || !vocab->is_object() || vocab->empty())
    unsupported(tpath, "model.vocab", vocab ? *vocab : json(), "an object {token: id}");
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size_ || token.empty())
      throw UserError(tpath + ": model.vocab[" + dump(json(token)) + "] is " + dump(id) + "; expected an id in [0, " +
                      std::to_string(vocab_size_) + ") (processor_config.json vocab_size) for a non-empty token");
    const int64_t i = id.get<int64_t>();
    if (static_cast<int64_t>(id_to_token_.size()) <= i) id_to_token_.resize(static_cast<size_t>(i) + 1);
    if (!id_to_token_[static_cast<size_t>(i)].empty())
      throw UserError(tpath + ": model.vocab has id " + std::to_string(i) + " twice; expected one token per id");
    id_to_token_[static_cast<size_t>(i)] = token;
    token_to_id_[token] = i;
  }

  // Merges in either format: "a b" (tokenizers < 0.20) or ["a", "b"] (>= 0.20). Rank = position in the list.
  const json* merges = field(*model, "merges");
  if (merges == nullptr || !merges->is_array()) unsupported(tpath, "model.merges", merges ? *merges : json(), "a list");
  int64_t rank = 0;
  for (const json& m : *merges) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        unsupported(tpath, "model.merges[" + std::to_string(rank) + "]", m, "\"left right\" (one space) or [\"left\", \"right\"]");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      unsupported(tpath, "model.merges[" + std::to_string(rank) + "]", m, "\"left right\" (one space) or [\"left\", \"right\"]");
    }
    const auto ia = token_to_id_.find(a), ib = token_to_id_.find(b), iab = token_to_id_.find(a + b);
    if (ia == token_to_id_.end() || ib == token_to_id_.end() || iab == token_to_id_.end())
      throw UserError(tpath + ": model.merges[" + std::to_string(rank) + "] " + dump(m) +
                      " names a token missing from model.vocab; expected both parts and their concatenation in it");
    // A repeated pair keeps its last rank, as HF's map built from the list does (a trained file has none).
    merges_.insert_or_assign(std::make_pair(ia->second, ib->second), std::make_pair(rank, iab->second));
    ++rank;
  }

  if (use_regex_) {
    onig_init_once();
    regex_ = std::make_unique<Regex>();
    OnigErrorInfo einfo;
    const auto* pat = reinterpret_cast<const OnigUChar*>(kGpt2Pattern);
    const int r = onig_new(&regex_->reg, pat, pat + std::char_traits<char>::length(kGpt2Pattern), ONIG_OPTION_NONE,
                           ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &einfo);
    PI0_CHECK(r == ONIG_NORMAL, "Oniguruma rejected the GPT-2 pattern (code ", r, ")");
  }
}

std::vector<double> FastTokenizer::dct(const std::vector<double>& x, int64_t H, int64_t D) {
  PI0_CHECK(H > 0 && D > 0 && static_cast<int64_t>(x.size()) == H * D, "dct: x has ", x.size(), " values, not ", H, "x", D);
  std::vector<double> out(x.size(), 0.0);
  const double dc = std::sqrt(static_cast<double>(H));
  const double ac = std::sqrt(2.0 / static_cast<double>(H));
  for (int64_t d = 0; d < D; ++d) {
    // DC: one sum and one division by sqrt(H), so chunks whose exact coefficient is representable get it exactly
    // (scipy does too for e.g. H = 9; the .5-tie cases of the tests depend on it).
    double s = 0.0;
    for (int64_t n = 0; n < H; ++n) s += x[static_cast<size_t>(n * D + d)];
    out[static_cast<size_t>(d)] = s / dc;
    for (int64_t k = 1; k < H; ++k) {
      double acc = 0.0;
      for (int64_t n = 0; n < H; ++n) acc += x[static_cast<size_t>(n * D + d)] * dct_cos(k, n, H);
      out[static_cast<size_t>(k * D + d)] = acc * ac;
    }
  }
  return out;
}

std::vector<double> FastTokenizer::idct(const std::vector<double>& x, int64_t H, int64_t D) {
  PI0_CHECK(H > 0 && D > 0 && static_cast<int64_t>(x.size()) == H * D, "idct: x has ", x.size(), " values, not ", H, "x", D);
  std::vector<double> out(x.size(), 0.0);
  const double dc = std::sqrt(static_cast<double>(H));
  const double ac = std::sqrt(2.0 / static_cast<double>(H));
  for (int64_t d = 0; d < D; ++d) {
    for (int64_t n = 0; n < H; ++n) {
      double acc = 0.0;
      for (int64_t k = 1; k < H; ++k) acc += x[static_cast<size_t>(k * D + d)] * dct_cos(k, n, H);
      out[static_cast<size_t>(n * D + d)] = x[static_cast<size_t>(d)] / dc + acc * ac;
    }
  }
  return out;
}

std::vector<int64_t> FastTokenizer::quantize(const std::vector<double>& actions_HD, int64_t H, int64_t D) const {
  for (double v : actions_HD)
    if (!std::isfinite(v)) throw UserError("FAST encode (" + dir_ + "): an action value is " + std::to_string(v) + "; expected finite normalized actions");
  const std::vector<double> c = dct(actions_HD, H, D);
  std::vector<int64_t> q(c.size());
  // std::nearbyint rounds half to even in the default rounding mode, as np.around does.
  for (size_t i = 0; i < c.size(); ++i) q[i] = static_cast<int64_t>(std::nearbyint(c[i] * scale_));
  return q;
}

std::string FastTokenizer::code_point_string(const std::vector<int64_t>& q) const {
  std::string s;
  s.reserve(q.size() * 2);
  for (int64_t v : q) {
    const int64_t u = std::max<int64_t>(v - min_token_, 0);  // clamped below only, as upstream
    if (u > 0x10FFFF || (u >= 0xD800 && u <= 0xDFFF))
      throw UserError("FAST encode (" + dir_ + "): DCT token " + std::to_string(v) + " gives code point " +
                      std::to_string(u) + ", not a Unicode scalar value; expected actions in normalized units (the "
                      "tokenizer was fitted on tokens from " + std::to_string(min_token_) + ")");
    append_utf8(s, static_cast<char32_t>(u));
  }
  return s;
}

std::vector<std::string> FastTokenizer::pre_tokenize(const std::string& text) const {
  if (!use_regex_ || text.empty()) return text.empty() ? std::vector<std::string>{} : std::vector<std::string>{text};
  // Matches and the gaps between them are all pieces (HF's Isolated split behaviour).
  std::vector<std::string> pieces;
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  OnigRegion* region = onig_region_new();
  size_t prev = 0, pos = 0;
  while (pos < text.size()) {
    const int r = onig_search(regex_->reg, str, end, str + pos, end, region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      onig_region_free(region, 1);
      PI0_CHECK(false, "Oniguruma search failed (code ", r, ")");
    }
    const auto b = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
    if (e == b) {  // the pattern cannot match empty; step one byte defensively rather than loop
      ++pos;
      continue;
    }
    if (b != prev) pieces.push_back(text.substr(prev, b - prev));
    pieces.push_back(text.substr(b, e - b));
    prev = pos = e;
  }
  onig_region_free(region, 1);
  if (prev != text.size()) pieces.push_back(text.substr(prev));
  return pieces;
}

std::vector<int64_t> FastTokenizer::bpe(const std::string& word) const {
  const ByteMap& bm = byte_map();
  if (ignore_merges_) {
    std::string whole;
    for (unsigned char c : word) append_utf8(whole, bm.to_char[c]);
    if (auto it = token_to_id_.find(whole); it != token_to_id_.end()) return {it->second};
  }
  // One symbol per byte; a byte whose symbol is not in the vocabulary is dropped (no unk_token).
  struct Symbol {
    int64_t id;
    int64_t prev, next;
    int64_t len;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (unsigned char c : word) {
    std::string ch;
    append_utf8(ch, bm.to_char[c]);
    auto it = token_to_id_.find(ch);
    if (it == token_to_id_.end()) continue;
    const auto n = static_cast<int64_t>(sym.size());
    sym.push_back({it->second, n - 1, n + 1, 1});
  }
  if (sym.empty()) return {};
  sym.back().next = -1;
  // HF's merge loop (word.rs merge_all): a min-heap on (rank, position); stale entries are skipped when the pair at
  // that position no longer yields the entry's merged id.
  struct Merge {
    int64_t pos, rank, new_id;
  };
  auto later = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
  auto push = [&](int64_t pos, int64_t left, int64_t right) {
    auto it = merges_.find({left, right});
    if (it != merges_.end()) queue.push({pos, it->second.first, it->second.second});
  };
  for (size_t i = 0; i + 1 < sym.size(); ++i) push(static_cast<int64_t>(i), sym[i].id, sym[i + 1].id);
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = sym[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next == -1) continue;
    const int64_t next_pos = cur.next;
    Symbol& right = sym[static_cast<size_t>(next_pos)];
    auto it = merges_.find({cur.id, right.id});
    if (it == merges_.end() || it->second.second != top.new_id) continue;
    cur.id = top.new_id;
    cur.len += right.len;
    cur.next = right.next;
    right.len = 0;
    if (cur.next >= 0) sym[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0) push(cur.prev, sym[static_cast<size_t>(cur.prev)].id, cur.id);
    if (cur.next >= 0) push(top.pos, cur.id, sym[static_cast<size_t>(cur.next)].id);
  }
  std::vector<int64_t> ids;
  for (const Symbol& s : sym)
    if (s.len != 0) ids.push_back(s.id);
  return ids;
}

std::vector<int64_t> FastTokenizer::encode_text(const std::string& text) const {
  std::vector<int64_t> ids;
  for (const std::string& piece : pre_tokenize(text)) {
    const std::vector<int64_t> p = bpe(piece);
    ids.insert(ids.end(), p.begin(), p.end());
  }
  return ids;
}

std::vector<int64_t> FastTokenizer::encode(const std::vector<double>& actions_HD, int64_t H, int64_t D) const {
  if (H <= 0 || D <= 0 || static_cast<int64_t>(actions_HD.size()) != H * D)
    throw UserError("FAST encode (" + dir_ + "): an action chunk of " + std::to_string(actions_HD.size()) +
                    " values is not H x D = " + std::to_string(H) + " x " + std::to_string(D));
  return encode_text(code_point_string(quantize(actions_HD, H, D)));
}

std::vector<int64_t> FastTokenizer::encode(const torch::Tensor& actions_HD) const {
  PI0_CHECK(actions_HD.dim() == 2 && actions_HD.is_floating_point(), "FAST encode: expected a floating [H, D] chunk, got ",
            actions_HD.sizes());
  const torch::Tensor a = actions_HD.to(torch::kCPU, torch::kFloat64).contiguous();
  const double* p = a.data_ptr<double>();
  return encode(std::vector<double>(p, p + a.numel()), a.size(0), a.size(1));
}

std::vector<char32_t> FastTokenizer::utf8_lossy_code_points(const std::string& bytes) {
  // Unicode's "maximal subpart" practice, as Rust's from_utf8_lossy: a lead byte followed by valid continuation
  // bytes that stops short is one U+FFFD; a byte that cannot start a sequence is one U+FFFD on its own.
  std::vector<char32_t> out;
  const size_t n = bytes.size();
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned char>(bytes[k]); };
  while (i < n) {
    const unsigned char b0 = at(i);
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    char32_t cp = 0;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
      need = 1, cp = b0 & 0x1F;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      need = 2, cp = b0 & 0x0F;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      need = 3, cp = b0 & 0x07;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      out.push_back(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ok = true;
    for (int k = 0; k < need; ++k, ++j) {
      const unsigned char lo_k = k == 0 ? lo : 0x80, hi_k = k == 0 ? hi : 0xBF;
      if (j >= n || at(j) < lo_k || at(j) > hi_k) {
        ok = false;
        break;
      }
      cp = (cp << 6) | (at(j) & 0x3F);
    }
    out.push_back(ok ? cp : kReplacement);
    i = j;  // on failure j is the first byte that did not fit: it starts the next sequence
  }
  return out;
}

std::string FastTokenizer::decode_text(const std::vector<int64_t>& ids) const {
  const ByteMap& bm = byte_map();
  std::string bytes;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_len() || id_to_token_[static_cast<size_t>(id)].empty()) continue;
    const std::string& token = id_to_token_[static_cast<size_t>(id)];
    // A token maps to bytes only if every character is in the byte map; otherwise its own UTF-8 is used (HF's
    // ByteLevel decoder; the initial-alphabet tokens of a FAST fit are such characters).
    std::string mapped;
    bool all = true;
    for (char32_t c : utf8_lossy_code_points(token)) {
      auto it = bm.to_byte.find(c);
      if (it == bm.to_byte.end()) {
        all = false;
        break;
      }
      mapped += static_cast<char>(it->second);
    }
    bytes += all ? mapped : token;
  }
  std::string out;
  for (char32_t c : utf8_lossy_code_points(bytes)) append_utf8(out, c);
  return out;
}

FastDecoded FastTokenizer::decode(const std::vector<int64_t>& ids, int64_t H, int64_t D) const {
  if (H <= 0) H = time_horizon_;
  if (D <= 0) D = action_dim_;
  if (H <= 0 || D <= 0)
    throw UserError(dir_ + "/processor_config.json: time_horizon and action_dim are null; the FAST decode needs the "
                    "chunk's H and D (pass them, or set them in processor_config.json)");
  FastDecoded out;
  out.actions.assign(static_cast<size_t>(H * D), 0.0);
  for (int64_t id : ids)
    if (id < 0 || id > 0xFFFFFFFFLL) {  // upstream: the id does not convert to u32; its try/except gives zeros
      out.n_code_points = -1;
      return out;
    }
  const std::vector<char32_t> cps = utf8_lossy_code_points(decode_text(ids));
  out.n_code_points = static_cast<int64_t>(cps.size());
  if (out.n_code_points != H * D) return out;
  std::vector<double> coef(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) coef[i] = static_cast<double>(static_cast<int64_t>(cps[i]) + min_token_) / scale_;
  out.actions = idct(coef, H, D);
  out.decodable = true;
  return out;
}

namespace {
constexpr int64_t kSegTokens = 128;  // PaliGemma's <seg000>..<seg127>, the vocabulary's last ids
}  // namespace

int64_t fast_token_room(int64_t paligemma_vocab) { return paligemma_vocab - kSegTokens; }

int64_t fast_to_paligemma(int64_t fast_id, int64_t paligemma_vocab) {
  const int64_t top = fast_token_room(paligemma_vocab) - 1;
  if (fast_id < 0 || fast_id > top)
    throw UserError("FAST id " + std::to_string(fast_id) + " has no PaliGemma token (expected 0.." +
                    std::to_string(top) + " for a vocabulary of " + std::to_string(paligemma_vocab) + ")");
  return top - fast_id;
}

int64_t paligemma_to_fast(int64_t paligemma_id, int64_t paligemma_vocab) {
  const int64_t top = fast_token_room(paligemma_vocab) - 1;
  if (paligemma_id < 0 || paligemma_id > top)
    throw UserError("PaliGemma token " + std::to_string(paligemma_id) + " is not a FAST token (expected 0.." +
                    std::to_string(top) + " for a vocabulary of " + std::to_string(paligemma_vocab) + ")");
  return top - paligemma_id;
}

}  // namespace pi0::data
