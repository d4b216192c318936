#include "pi0/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"

namespace pi0::data {

Tokenizer::Tokenizer(const std::string& model_path)
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_path) {
  auto status = sp_->Load(model_path);
  if (!status.ok()) throw UserError(model_path + ": cannot load SentencePiece model (" + status.ToString() + ")");
}

Tokenizer::~Tokenizer() = default;

std::vector<int> Tokenizer::encode(const std::string& text, bool add_bos) const {
  std::vector<int> ids;
  if (add_bos) ids.push_back(sp_->bos_id());
  std::vector<int> body;
  auto status = sp_->Encode(text, &body);
  PI0_CHECK(status.ok(), "sentencepiece encode failed: ", status.ToString());
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  sp_->Decode(ids, &out);
  return out;
}

int Tokenizer::bos_id() const { return sp_->bos_id(); }
int64_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string Tokenizer::clean(const std::string& prompt) {
  // Python str.strip() without arguments strips all whitespace.
  const char* ws = " \t\n\r\v\f";
  size_t b = prompt.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  size_t e = prompt.find_last_not_of(ws);
  std::string s = prompt.substr(b, e - b + 1);
  for (char& c : s)
    if (c == '_' || c == '\n') c = ' ';
  return s;
}

int64_t Tokenizer::discretize(double s) {
  // Bin edges -1 + k/128, k = 0..255 (exact in binary); digitize counts the edges <= s.
  int64_t count = 0;
  for (int k = 0; k < 256; ++k)
    if (-1.0 + k / 128.0 <= s) ++count;
  return count - 1;
}

std::string Tokenizer::pi05_prompt(const std::string& cleaned, const torch::Tensor& state) {
  torch::Tensor s = state.to(torch::kFloat64).contiguous();
  std::string digits;
  for (int64_t i = 0; i < s.numel(); ++i) {
    if (i) digits += ' ';
    digits += std::to_string(discretize(s.data_ptr<double>()[i]));
  }
  return "Task: " + cleaned + ", State: " + digits + ";\nAction: ";
}

TokenizedPrompt Tokenizer::tokenize(const std::string& prompt, int64_t max_token_len,
                                    const torch::Tensor& state) const {
  PI0_CHECK(max_token_len > 0, "max_token_len must be > 0");
  const std::string cleaned = clean(prompt);
  std::vector<int> ids;
  if (state.defined()) {
    ids = encode(pi05_prompt(cleaned, state), /*add_bos=*/true);
  } else {
    ids = encode(cleaned, /*add_bos=*/true);
    std::vector<int> nl = encode("\n");  // separate "start of answer" token(s)
    ids.insert(ids.end(), nl.begin(), nl.end());
  }
  const int64_t n = static_cast<int64_t>(ids.size());
  if (n > max_token_len) {
    spdlog::warn("tokenizer: prompt is {} tokens, truncated to max_token_len {} (the end of the prompt is lost; "
                 "raise max_token_len): '{}'", n, max_token_len, cleaned);
  }
  TokenizedPrompt out;
  out.tokens = torch::zeros({max_token_len}, torch::kLong);
  out.mask = torch::zeros({max_token_len}, torch::kBool);
  auto* tok = out.tokens.data_ptr<int64_t>();
  auto* msk = out.mask.data_ptr<bool>();
  for (int64_t i = 0; i < std::min(n, max_token_len); ++i) {
    tok[i] = ids[static_cast<size_t>(i)];
    msk[i] = true;
  }
  return out;
}

}  // namespace pi0::data
