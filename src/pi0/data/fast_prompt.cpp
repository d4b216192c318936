#include "pi0/data/fast_prompt.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>

#include "pi0/common/check.h"
#include "pi0/common/log_line.h"
#include "pi0/common/strings.h"

namespace pi0::data {

namespace {

constexpr char32_t kInvalid = 0xFFFFFFFF;

/// Code points of valid UTF-8 (prompts come from JSON / parquet / HDF5 strings, the rest from SentencePiece, which
/// only emits valid UTF-8); an invalid byte is kept as kInvalid + the byte so that it passes through unchanged.
std::vector<std::pair<char32_t, std::string>> split_utf8(const std::string& s) {
  std::vector<std::pair<char32_t, std::string>> out;
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = u[i];
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (u[i + k] & 0xC0) == 0x80;
    if (!ok) {
      out.emplace_back(kInvalid, s.substr(i, 1));
      ++i;
      continue;
    }
    char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (u[i + k] & 0x3F);
    out.emplace_back(cp, s.substr(i, n));
    i += n;
  }
  return out;
}

/// Python's str.isspace() (Unicode White_Space plus the ASCII separators 0x1C..0x1F).
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/// The C.UTF-8 locale for towlower_l (glibc's tables follow Unicode's simple lower-case mapping). Null when the
/// system lacks it: then only ASCII is lower-cased, and a prompt with other letters is warned about once.
locale_t utf8_locale() {
  static locale_t loc = [] {
    locale_t l = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
    return l;
  }();
  return loc;
}

char32_t simple_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (locale_t loc = utf8_locale()) return static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), loc));
  warn_once("fast prompt: no C.UTF-8 locale",
            "fast prompt: the C.UTF-8 locale is missing, so non-ASCII letters in prompts are not lower-cased as "
            "openpi's FASTTokenizer does (install the locale, e.g. Debian's libc-bin provides C.utf8)");
  return c;
}

bool cased(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
  locale_t loc = utf8_locale();
  if (!loc) return false;
  const auto w = static_cast<wint_t>(c);
  return towlower_l(w, loc) != w || towupper_l(w, loc) != w || iswlower_l(w, loc) || iswupper_l(w, loc);
}

/// Unicode Case_Ignorable, approximated by the characters a prompt may realistically hold: apostrophes, the
/// MidLetter punctuation, modifier symbols, soft hyphen and combining marks.
bool case_ignorable(char32_t c) {
  switch (c) {
    case 0x27: case 0x2E: case 0x3A: case 0x5E: case 0x60: case 0xA8: case 0xAD: case 0xAF: case 0xB4: case 0xB7:
    case 0xB8: case 0x2018: case 0x2019: case 0x2024: case 0x2027: case 0x200B: case 0x200C: case 0x200D:
      return true;
    default:
      return (c >= 0x2B0 && c <= 0x36F) || (c >= 0x1AB0 && c <= 0x1AFF) || (c >= 0x1DC0 && c <= 0x1DFF) ||
             (c >= 0x20D0 && c <= 0x20FF) || (c >= 0xFE00 && c <= 0xFE0F) || (c >= 0xFE20 && c <= 0xFE2F);
  }
}

}  // namespace

std::string FastPromptTokenizer::lower(const std::string& text) {
  const auto cps = split_utf8(text);
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i].first;
    if (c == kInvalid) {
      out += cps[i].second;
    } else if (c == 0x130) {  // the one unconditional multi-character lower case (SpecialCasing.txt)
      out += "i\xCC\x87";
    } else if (c == 0x3A3) {  // Python's Final_Sigma rule: cased, ignorable*, SIGMA, not (ignorable*, cased)
      ptrdiff_t j = static_cast<ptrdiff_t>(i) - 1;
      while (j >= 0 && case_ignorable(cps[static_cast<size_t>(j)].first)) --j;
      bool final_sigma = j >= 0 && cased(cps[static_cast<size_t>(j)].first);
      if (final_sigma) {
        size_t k = i + 1;
        while (k < cps.size() && case_ignorable(cps[k].first)) ++k;
        final_sigma = k == cps.size() || !cased(cps[k].first);
      }
      append_utf8(out, final_sigma ? 0x3C2 : 0x3C3);
    } else {
      append_utf8(out, simple_lower(c));
    }
  }
  return out;
}

std::string FastPromptTokenizer::strip(const std::string& text) {
  const auto cps = split_utf8(text);
  size_t b = 0, e = cps.size();
  while (b < e && py_space(cps[b].first)) ++b;
  while (e > b && py_space(cps[e - 1].first)) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cps[i].second;
  return out;
}

std::string FastPromptTokenizer::clean(const std::string& prompt) {
  std::string s = strip(lower(prompt));
  std::replace(s.begin(), s.end(), '_', ' ');
  return s;
}

std::string FastPromptTokenizer::prefix_text(const std::string& cleaned, const torch::Tensor& state) {
  const torch::Tensor s = state.to(torch::kFloat64).contiguous().reshape({-1});
  std::string bins;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (i) bins += ' ';
    bins += std::to_string(Tokenizer::discretize(s.data_ptr<double>()[i]));
  }
  return "Task: " + cleaned + ", State: " + bins + ";\n";
}

FastPromptTokenizer::FastPromptTokenizer(std::shared_ptr<const Tokenizer> spm, std::shared_ptr<const FastTokenizer> fast)
    : spm_(std::move(spm)), fast_(std::move(fast)) {
  PI0_CHECK(spm_ && fast_, "FastPromptTokenizer needs both tokenizers");
  const int64_t room = fast_token_room(spm_->vocab_size());
  if (fast_->vocab_size() > room)
    throw UserError(fast_->dir() + "/processor_config.json: vocab_size is " + std::to_string(fast_->vocab_size()) +
                    ", but the SentencePiece model has room for " + std::to_string(room) +
                    " FAST tokens (its vocabulary " + std::to_string(spm_->vocab_size()) +
                    " less the 128 reserved tail tokens); use a FAST tokenizer with vocab_size <= " +
                    std::to_string(room) + " or PaliGemma's tokenizer");
  action_marker_ = spm_->encode("Action: ");
  bar_ = spm_->encode("|");
}

FastTokenized FastPromptTokenizer::tokenize(const std::string& prompt, const torch::Tensor& state,
                                            const torch::Tensor& actions_HD, int64_t max_token_len) const {
  PI0_CHECK(max_token_len > 0, "max_token_len must be > 0");
  PI0_CHECK(state.defined(), "pi0-FAST's prompt needs the state (openpi puts its bins in the prefix)");
  const std::vector<int> prefix = spm_->encode(prefix_text(clean(prompt), state), /*add_bos=*/true);
  std::vector<int64_t> ids(prefix.begin(), prefix.end());
  const auto n_prefix = static_cast<int64_t>(ids.size());
  FastTokenized out;
  if (actions_HD.defined()) {
    PI0_CHECK(actions_HD.dim() == 2, "FAST actions must be [H, D], got ", actions_HD.sizes());
    const std::vector<int64_t> fast_ids = fast_->encode(actions_HD);
    out.n_fast = static_cast<int64_t>(fast_ids.size());
    ids.insert(ids.end(), action_marker_.begin(), action_marker_.end());
    for (int64_t f : fast_ids) ids.push_back(fast_to_paligemma(f, spm_->vocab_size()));
    ids.insert(ids.end(), bar_.begin(), bar_.end());
    ids.push_back(spm_->eos_id());
  }
  out.n_tokens = static_cast<int64_t>(ids.size());
  if (out.n_tokens > max_token_len)
    warn_once("fast prompt: truncated to max_token_len",
              "pi0-FAST: the example is " + std::to_string(out.n_tokens) + " tokens (prompt and state " +
                  std::to_string(n_prefix) + ", FAST ids " + std::to_string(out.n_fast) +
                  "), truncated to model.max_token_len " + std::to_string(max_token_len) +
                  (n_prefix >= max_token_len ? " (no action token is left to learn from)" : " (the end of the actions is lost)") +
                  "; raise model.max_token_len: " + quote_value(prompt));
  out.tokens = torch::zeros({max_token_len}, torch::kLong);
  out.mask = torch::zeros({max_token_len}, torch::kBool);
  out.ar_mask = torch::zeros({max_token_len}, torch::kBool);
  out.loss_mask = torch::zeros({max_token_len}, torch::kBool);
  auto* tok = out.tokens.data_ptr<int64_t>();
  auto* msk = out.mask.data_ptr<bool>();
  auto* ar = out.ar_mask.data_ptr<bool>();
  auto* loss = out.loss_mask.data_ptr<bool>();
  for (int64_t i = 0; i < std::min(out.n_tokens, max_token_len); ++i) {
    tok[i] = ids[static_cast<size_t>(i)];
    msk[i] = true;
    ar[i] = loss[i] = i >= n_prefix;
  }
  return out;
}

FastExtracted FastPromptTokenizer::extract_actions(const std::vector<int64_t>& tokens, int64_t H, int64_t D) const {
  PI0_CHECK(H > 0 && D > 0, "extract_actions needs H, D > 0, got ", H, ", ", D);
  FastExtracted out;
  out.decoded.actions.assign(static_cast<size_t>(H * D), 0.0);
  std::vector<int> ids;
  ids.reserve(tokens.size());
  for (int64_t t : tokens) {
    PI0_CHECK(t >= 0 && t < spm_->vocab_size(), "generated token ", t, " is outside the SentencePiece vocabulary (",
              spm_->vocab_size(), ")");
    ids.push_back(static_cast<int>(t));
  }
  const std::string text = spm_->decode(ids);
  static const std::string kMarker = "Action: ";
  const size_t at = text.find(kMarker);
  if (at == std::string::npos) return out;
  out.found_marker = true;
  // Python's text.split("Action: ")[1].split("|")[0]: up to the next marker or bar, whichever comes first.
  const size_t begin = at + kMarker.size();
  const size_t end = std::min(text.find(kMarker, begin), text.find('|', begin));
  const std::string body = strip(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
  for (int id : spm_->encode(body)) out.fast_ids.push_back(paligemma_of(id));
  out.decoded = fast_->decode(out.fast_ids, H, D);
  return out;
}

FastExtracted FastPromptTokenizer::extract_generated(const std::vector<int64_t>& tokens, int64_t H, int64_t D) const {
  std::vector<int64_t> ids;
  ids.reserve(tokens.size());
  for (const int64_t t : tokens)
    if (t >= 0 && t < spm_->vocab_size()) ids.push_back(t);
  return extract_actions(ids, H, D);
}

FastRowsActions FastPromptTokenizer::extract_generated_rows(const torch::Tensor& tokens, int64_t H,
                                                            const std::vector<int64_t>& dims, int64_t width) const {
  PI0_CHECK(tokens.dim() == 2 && static_cast<int64_t>(dims.size()) == tokens.size(0),
            "extract_generated_rows: tokens must be [B, N] with one dims entry per row");
  const auto cpu = tokens.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t B = cpu.size(0), N = cpu.size(1);
  FastRowsActions out;
  out.actions = torch::zeros({B, H, width}, torch::kFloat64);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t d = dims[static_cast<size_t>(b)];
    PI0_CHECK(d > 0 && d <= width, "extract_generated_rows: row ", b, " has ", d, " dims, expected 1..", width);
    const int64_t* row = cpu.data_ptr<int64_t>() + b * N;
    const auto got = extract_generated(std::vector<int64_t>(row, row + N), H, d);
    out.decodable.push_back(got.holds_actions());
    if (got.holds_actions())
      out.actions[b].narrow(1, 0, d).copy_(torch::tensor(got.decoded.actions, torch::kFloat64).view({H, d}));
  }
  out.actions = out.actions.to(torch::kFloat32);
  return out;
}

int64_t FastPromptTokenizer::block_fast_count(const std::vector<int64_t>& block) const {
  const auto n = static_cast<int64_t>(block.size());
  const auto end = static_cast<int64_t>(bar_.size()) + 1;  // "|" + EOS
  const bool closed = n >= end && block.back() == spm_->eos_id();
  return closed ? n - end : n;
}

FastDecoded FastPromptTokenizer::decode_paligemma(const std::vector<int64_t>& pg_ids, int64_t H, int64_t D) const {
  std::vector<int64_t> ids;
  ids.reserve(pg_ids.size());
  for (const int64_t id : pg_ids) ids.push_back(paligemma_of(id));  // pg is its own inverse
  return fast_->decode(ids, H, D);
}

FastPrefix FastPromptTokenizer::prefix_only(const torch::Tensor& tokens, const torch::Tensor& mask,
                                            const torch::Tensor& loss_mask) {
  PI0_CHECK(tokens.dim() == 2 && tokens.sizes() == mask.sizes() && tokens.sizes() == loss_mask.sizes(),
            "prefix_only: tokens, mask and loss mask must be [B, L] alike");
  FastPrefix out;
  out.mask = mask.to(torch::kBool).logical_and(loss_mask.to(torch::kBool).logical_not());
  out.tokens = tokens.to(torch::kLong) * out.mask;
  out.ar_mask = torch::zeros_like(out.mask);
  return out;
}

}  // namespace pi0::data
