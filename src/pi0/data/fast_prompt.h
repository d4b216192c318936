// pi0-FAST's token layout and action extraction: openpi's FASTTokenizer (src/openpi/models/tokenizer.py at 15a9616,
// tokenize and extract_actions), checked against openpi's own code by tests/data/pi0_fast_reference.py.
//
//   prefix  = [BOS] spm("Task: {clean(prompt)}, State: {bins};\n")             ar 0, loss 0
//   postfix = spm("Action: ") pg(FAST ids) spm("|") [EOS]                     ar 1, loss 1
//   then right-padded with 0 (all masks 0) or truncated to max_token_len (warned once, counted)
//
// clean() is lower() then strip() then '_' -> ' ' (Python semantics: Unicode lower-casing and whitespace; pi0.5's
// prompt cleaning differs: no lower-casing, '\n' -> ' '). bins = np.digitize(state, linspace(-1,1,257)[:-1]) - 1.
// pg(id) = spm vocab - 1 - 128 - id (fast_to_paligemma).
//
// extract_actions is openpi's text round trip, kept because released checkpoints are evaluated through it:
// SentencePiece-decode all generated tokens; without "Action: " the actions are zeros; otherwise the text between the
// first "Action: " and the next "|" is stripped, SentencePiece-encoded again, mapped back through pg (ids may leave the
// FAST range: negative ones make the sequence undecodable, ones past the FAST vocabulary are skipped, as upstream) and
// FAST-decoded with (H, D). The round trip is lossy where re-encoding merges pieces differently.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"

namespace pi0::data {

/// One example in pi0-FAST's layout, each tensor [max_token_len].
struct FastTokenized {
  torch::Tensor tokens;     ///< int64, 0 = pad
  torch::Tensor mask;       ///< bool, true for real tokens
  torch::Tensor ar_mask;    ///< bool, true on the postfix (causal), false on the prefix (bidirectional) and padding
  torch::Tensor loss_mask;  ///< bool, true on the postfix (cross-entropy targets)
  int64_t n_tokens = 0;     ///< length before padding or truncation
  int64_t n_fast = 0;       ///< FAST ids in the postfix before truncation (0 without actions)
};

/// A batch's inference input in this layout (FastPromptTokenizer::prefix_only), each tensor [B, L].
struct FastPrefix {
  torch::Tensor tokens;   ///< int64: the prefix, then 0
  torch::Tensor mask;     ///< bool: true on the prefix
  torch::Tensor ar_mask;  ///< bool: all false (the prefix is bidirectional)
};

/// The actions recovered from one generated token row.
struct FastExtracted {
  FastDecoded decoded;            ///< actions [H*D] float64; zeros when !found_marker or !decoded.decodable
  bool found_marker = false;      ///< the decoded text contains "Action: " (openpi returns zeros otherwise)
  std::vector<int64_t> fast_ids;  ///< FAST ids after the round trip (may be out of the FAST range)
  /// The row yielded actions (openpi's zeros otherwise).
  bool holds_actions() const { return found_marker && decoded.decodable; }
};

/// Actions read from a batch of token rows (FastPromptTokenizer::extract_generated_rows).
struct FastRowsActions {
  torch::Tensor actions;        ///< [B, H, width] float32, normalized units; zeros past each row's dims and where none
  std::vector<bool> decodable;  ///< per row: it held actions (FastExtracted::holds_actions)
};

/// openpi's FASTTokenizer over a SentencePiece model (PaliGemma's, or a test model) and a FAST tokenizer.
/// Immutable after construction; const methods may run concurrently.
class FastPromptTokenizer {
 public:
  /// Throws UserError when the FAST vocabulary does not fit below the SentencePiece vocabulary's 128 reserved tail
  /// tokens (FAST vocab_size must be <= spm vocab - 128).
  FastPromptTokenizer(std::shared_ptr<const Tokenizer> spm, std::shared_ptr<const FastTokenizer> fast);

  /// `state` [S] normalized (any float dtype), `actions_HD` [H, D] normalized or undefined (inference: prefix only).
  FastTokenized tokenize(const std::string& prompt, const torch::Tensor& state, const torch::Tensor& actions_HD,
                         int64_t max_token_len) const;

  /// A batch of tokenize() rows ([B, L] tokens, mask and loss mask) cut to what tokenize() without actions gives:
  /// the prefix alone, right-padded to the same L (the prefix comes first in every row).
  static FastPrefix prefix_only(const torch::Tensor& tokens, const torch::Tensor& mask, const torch::Tensor& loss_mask);

  /// Actions from generated tokens (sample_actions' output row: "Action: ", FAST tokens, "|", EOS, then anything).
  FastExtracted extract_actions(const std::vector<int64_t>& tokens, int64_t H, int64_t D) const;

  /// extract_actions of a model's token row, leaving out ids past the SentencePiece vocabulary (a model.vocab_size
  /// larger than its tokenizer's, which openpi's PaliGemma never has): they have no text, as if never generated.
  FastExtracted extract_generated(const std::vector<int64_t>& tokens, int64_t H, int64_t D) const;
  /// extract_generated of each row of `tokens` ([B, N] int64, any device; negative entries are skipped like other
  /// ids without text), row b with its own D = dims[b] <= width, its actions in the first dims[b] columns.
  FastRowsActions extract_generated_rows(const torch::Tensor& tokens, int64_t H, const std::vector<int64_t>& dims,
                                         int64_t width) const;

  /// train.ki's FAST block (data::SampleTransform): pg(FAST ids) + spm("|") + EOS, right-padded, truncation may cut
  /// its end. Of its valid tokens `block`, how many lead with FAST ids: all but the closing ones when it ends with
  /// EOS, else all.
  int64_t block_fast_count(const std::vector<int64_t>& block) const;
  /// FAST ids given as PaliGemma ids (`pg_ids`, mapped back through pg without range checks) decoded with (H, D).
  FastDecoded decode_paligemma(const std::vector<int64_t>& pg_ids, int64_t H, int64_t D) const;

  /// pg(id) = spm vocab - 1 - 128 - id, without range checks (openpi applies it to any id in both directions).
  int64_t paligemma_of(int64_t id) const { return spm_->vocab_size() - 1 - 128 - id; }

  /// Python's prompt.lower().strip().replace("_", " ") on UTF-8 text.
  static std::string clean(const std::string& prompt);
  /// "Task: {cleaned}, State: {bins};\n"
  static std::string prefix_text(const std::string& cleaned, const torch::Tensor& state);
  /// Python's str.strip() (no arguments: Unicode whitespace, str.isspace) on UTF-8 text.
  static std::string strip(const std::string& text);
  /// Python's str.lower() on UTF-8 text (full lower-casing: U+0130 -> "i\u0307", final sigma).
  static std::string lower(const std::string& text);

  const Tokenizer& spm() const { return *spm_; }
  const FastTokenizer& fast() const { return *fast_; }

 private:
  std::shared_ptr<const Tokenizer> spm_;
  std::shared_ptr<const FastTokenizer> fast_;
  std::vector<int> action_marker_;  ///< spm("Action: ")
  std::vector<int> bar_;            ///< spm("|")
};

}  // namespace pi0::data
