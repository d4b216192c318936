// FAST action tokenizer (arXiv 2501.09747): reads a tokenizer fitted by the FAST processor
// (physical-intelligence/fast, processing_action_tokenizer.py, UniversalActionProcessor) as HF saves it and encodes /
// decodes action chunks bit-compatibly with it (tests/data/fast_reference.py, docs/fast.md).
//
//   encode(a[H, D]):  c = DCT-II_ortho(a) over time;  q = round_half_even(c * scale);  flatten frequency-major;
//                     u = max(q - min_token, 0);  s = UTF-8 of code points u;  ids = byte-level BPE(s)
//   decode(ids):      s = lossy UTF-8 of the byte-level vocabulary strings;  q = code points + min_token;
//                     a = DCT-III_ortho(q / scale)  if there are exactly H*D code points, else zeros (flagged)
//
// The BPE is HF `tokenizers`' model with a ByteLevel pre-tokenizer: the GPT-2 regex split runs on Oniguruma, the
// engine `tokenizers` itself is built with, so \p{L}, \p{N} and \s agree by construction. Merges apply lowest rank
// first, leftmost on equal ranks (HF's heap order); symbols missing from the vocabulary are dropped, as HF does with
// no unk_token. Fitting a tokenizer stays in Python (docs/fast.md).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/torch.h>

namespace pi0::data {

/// One decoded action chunk.
struct FastDecoded {
  std::vector<double> actions;  ///< [H*D] row-major (time-major), float64; all zeros when !decodable
  bool decodable = false;       ///< false when the ids give a coefficient count != H*D (upstream prints and returns 0)
  int64_t n_code_points = 0;    ///< code points the ids decoded to (-1 for a negative id, which upstream rejects)
};

/// Immutable after construction: const methods may run concurrently (loader workers share one instance; each
/// Oniguruma search gets its own region).
class FastTokenizer {
 public:
  /// Reads `dir`/processor_config.json and `dir`/tokenizer.json (and `dir`/tokenizer_config.json when present).
  /// Throws pi0::UserError, one line naming the file and the field, for anything it does not support.
  explicit FastTokenizer(const std::string& dir);
  /// The files a FAST tokenizer folder may hold, all that this reader reads (the first two required): what a
  /// checkpoint and a bundle copy of it (pi0-FAST's model.fast_tokenizer).
  static const std::vector<std::string>& file_names();
  ~FastTokenizer();
  FastTokenizer(FastTokenizer&&) noexcept;
  FastTokenizer& operator=(FastTokenizer&&) noexcept;

  /// FAST ids of one chunk `actions_HD` ([H*D] row-major, normalized units).
  std::vector<int64_t> encode(const std::vector<double>& actions_HD, int64_t H, int64_t D) const;
  /// Same for a [H, D] tensor (any floating dtype; converted to float64 first).
  std::vector<int64_t> encode(const torch::Tensor& actions_HD) const;
  /// Inverse of encode. H and D default (0) to the tokenizer's time_horizon / action_dim.
  FastDecoded decode(const std::vector<int64_t>& ids, int64_t H = 0, int64_t D = 0) const;

  // Stages, public for tests and for showing FAST text in batch dumps.
  /// round_half_even(DCT-II(actions) * scale), [H*D] frequency-major.
  std::vector<int64_t> quantize(const std::vector<double>& actions_HD, int64_t H, int64_t D) const;
  /// UTF-8 string of the code points max(q - min_token, 0). Throws UserError past U+10FFFF or on a surrogate.
  std::string code_point_string(const std::vector<int64_t>& q) const;
  /// Pre-tokenizer pieces of a UTF-8 string (the GPT-2 split, or the whole string when use_regex is false).
  std::vector<std::string> pre_tokenize(const std::string& text) const;
  /// BPE ids of the UTF-8 string (pre-tokenize, byte-level map, merges).
  std::vector<int64_t> encode_text(const std::string& text) const;
  /// The ids' text: vocabulary strings mapped back to bytes, lossy UTF-8. Unknown ids are skipped (as HF does).
  std::string decode_text(const std::vector<int64_t>& ids) const;

  /// Orthonormal DCT-II / DCT-III over time of x[H*D] row-major (scipy.fft dct / idct, norm="ortho", axis=0).
  static std::vector<double> dct(const std::vector<double>& x, int64_t H, int64_t D);
  static std::vector<double> idct(const std::vector<double>& x, int64_t H, int64_t D);
  /// Code points of a UTF-8 string, each maximal invalid subpart replaced by U+FFFD (Rust's from_utf8_lossy).
  static std::vector<char32_t> utf8_lossy_code_points(const std::string& bytes);

  double scale() const { return scale_; }
  int64_t min_token() const { return min_token_; }
  int64_t vocab_size() const { return vocab_size_; }       ///< processor_config.json's (every id is below it)
  int64_t vocab_len() const { return static_cast<int64_t>(id_to_token_.size()); }
  int64_t time_horizon() const { return time_horizon_; }  ///< 0 when processor_config.json has null
  int64_t action_dim() const { return action_dim_; }      ///< 0 when processor_config.json has null
  const std::string& dir() const { return dir_; }

 private:
  struct Regex;  // Oniguruma handle
  std::vector<int64_t> bpe(const std::string& byte_level_word) const;

  std::string dir_;
  double scale_ = 10.0;
  int64_t min_token_ = 0;
  int64_t vocab_size_ = 0;
  int64_t time_horizon_ = 0;
  int64_t action_dim_ = 0;
  bool use_regex_ = true;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, int64_t> token_to_id_;
  std::vector<std::string> id_to_token_;  ///< "" for unused ids
  /// (left id, right id) -> (rank, merged id)
  std::map<std::pair<int64_t, int64_t>, std::pair<int64_t, int64_t>> merges_;
  std::unique_ptr<Regex> regex_;
};

/// openpi's map of FAST ids into PaliGemma's vocabulary (tokenizer.py FASTTokenizer, `_act_tokens_to_paligemma_tokens`):
/// the last ids of the vocabulary, counted down, skipping its 128 `<seg>` tokens at the very end:
/// pg(id) = vocab − 1 − 128 − id (257023 − id for PaliGemma's 257152). Both directions throw pi0::UserError on an
/// id outside [0, vocab − 129] / a token below the FAST range (a FAST id ≥ the fast vocabulary is the caller's check).
int64_t fast_to_paligemma(int64_t fast_id, int64_t paligemma_vocab);
/// How many FAST ids that map has room for: the vocabulary less its 128 `<seg>` tail tokens (a FAST tokenizer with a
/// larger vocab_size does not fit the SentencePiece model).
int64_t fast_token_room(int64_t paligemma_vocab);
int64_t paligemma_to_fast(int64_t paligemma_id, int64_t paligemma_vocab);

}  // namespace pi0::data
