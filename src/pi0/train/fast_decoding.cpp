#include "pi0/train/fast_decoding.h"

#include <vector>

#include "pi0/common/check.h"

namespace pi0::train {

namespace {

// The chunk length and example b's robot action dims (the FAST chunk's D: the data pipeline encodes the actions
// before their zero padding to model.action_dim). Batches built by hand carry no action_dims: every dim is the robot's.
int64_t robot_dims(const model::Batch& batch, int64_t b) {
  return batch.action_dims.defined() ? batch.action_dims[b].item<int64_t>() : batch.actions.size(2);
}

torch::Tensor host_rows(const torch::Tensor& predicted, const model::Batch& batch, const char* what) {
  PI0_CHECK(predicted.dim() == 2 && predicted.size(0) == batch.actions.size(0), what,
            ": predictions must be [B, N] for the batch's ", batch.actions.size(0), " examples");
  return predicted.to(torch::kCPU, torch::kLong).contiguous();
}

}  // namespace

FastDecodingCount count_undecodable_fast(const data::FastPromptTokenizer& reader, const torch::Tensor& predicted,
                                         const model::Batch& batch) {
  const auto rows = host_rows(predicted, batch, "count_undecodable_fast");
  std::vector<int64_t> dims;
  for (int64_t b = 0; b < rows.size(0); ++b) dims.push_back(robot_dims(batch, b));
  // The -1 entries (not targets) are skipped as ids without text.
  const auto read = reader.extract_generated_rows(rows, batch.actions.size(1), dims, batch.actions.size(2));
  const auto has_targets = (rows >= 0).any(1);
  FastDecodingCount out;
  for (int64_t b = 0; b < rows.size(0); ++b) {
    if (!has_targets[b].item<bool>()) continue;
    ++out.sequences;
    if (!read.decodable[static_cast<size_t>(b)]) ++out.undecodable;
  }
  return out;
}

FastDecodingCount count_undecodable_ki(const data::FastPromptTokenizer& reader, const torch::Tensor& predicted,
                                       const model::Batch& batch) {
  PI0_CHECK(batch.fast_tokens.defined() && batch.fast_mask.defined(), "count_undecodable_ki: the batch has no FAST block");
  const auto rows = host_rows(predicted, batch, "count_undecodable_ki");
  const auto tokens = batch.fast_tokens.to(torch::kLong).contiguous();
  const auto mask = batch.fast_mask.to(torch::kBool).contiguous();
  PI0_CHECK(rows.size(1) == tokens.size(1), "count_undecodable_ki: predictions [", rows.size(0), ", ", rows.size(1),
            "] do not match the FAST block's ", tokens.size(1), " tokens");
  const int64_t h = batch.actions.size(1), f = tokens.size(1);
  FastDecodingCount out;
  for (int64_t b = 0; b < rows.size(0); ++b) {
    std::vector<int64_t> block, guess;
    const int64_t* row = tokens.data_ptr<int64_t>() + b * f;
    const int64_t* pred = rows.data_ptr<int64_t>() + b * f;
    const bool* valid = mask.data_ptr<bool>() + b * f;
    for (int64_t i = 0; i < f; ++i)
      if (valid[i]) block.push_back(row[i]), guess.push_back(pred[i]);
    const int64_t n_fast = reader.block_fast_count(block);
    if (n_fast == 0) continue;
    ++out.sequences;
    guess.resize(static_cast<size_t>(n_fast));
    if (!reader.decode_paligemma(guess, h, robot_dims(batch, b)).decodable) ++out.undecodable;
  }
  return out;
}

}  // namespace pi0::train
