// Prompt tokenizer: SentencePiece with openpi's PaligemmaTokenizer prompt formats (openpi-reference §5).
//   pi0:   [BOS] encode(clean(prompt)) encode("\n")
//   pi0.5: [BOS] encode("Task: {clean}, State: {d_0 d_1 ...};\nAction: ")  with d = 256-bin discretized state
// Tokens are right-padded with 0 (mask false) or truncated (with a warning) to max_token_len. No EOS.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pi0::data {

struct TokenizedPrompt {
  torch::Tensor tokens;  ///< [L] int64, 0 = pad
  torch::Tensor mask;    ///< [L] bool, true for real tokens
};

class Tokenizer {
 public:
  /// Loads a SentencePiece model (openpi: paligemma_tokenizer.model; tests: data/tokenizer/tiny_spm.model).
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();

  /// pi0 format (state == undefined) or pi0.5 discrete-state format (state = normalized [S] at native dim).
  TokenizedPrompt tokenize(const std::string& prompt, int64_t max_token_len,
                           const torch::Tensor& state = torch::Tensor()) const;

  /// Raw ids of `text`, optionally preceded by BOS.
  std::vector<int> encode(const std::string& text, bool add_bos = false) const;
  std::string decode(const std::vector<int>& ids) const;
  int bos_id() const;
  /// The model's EOS id (PaliGemma: 1); pi0-FAST ends its postfix with it.
  int eos_id() const;
  int64_t vocab_size() const;

  /// strip, then '_' -> ' ' and '\n' -> ' ' (openpi; no lower-casing).
  static std::string clean(const std::string& prompt);
  /// np.digitize(s, linspace(-1, 1, 257)[:-1]) - 1: floor((s+1)*128) on [-1,1), 255 above, -1 below -1.
  static int64_t discretize(double s);
  /// "Task: {cleaned}, State: {d...};\nAction: "
  static std::string pi05_prompt(const std::string& cleaned, const torch::Tensor& state);

 private:
  struct Impl;  // the dlopen'ed SentencePiece shim (see CMakeLists.txt for why)
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

}  // namespace pi0::data
