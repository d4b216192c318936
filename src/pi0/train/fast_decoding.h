// fast_undecodable, the trainer's metric for models that learn FAST tokens (model.type pi0_fast, train.ki): the share
// of examples whose teacher-forced prediction (the logits' argmax at each FAST target, given the true tokens before
// it) holds no action chunk when read back. Token accuracy can be high while a single wrong token — a piece that
// spans more or fewer DCT coefficients, or an id outside FAST's range — leaves the whole chunk undecodable; this
// counts those chunks.
#pragma once
#include <cstdint>

#include <torch/torch.h>

#include "pi0/data/fast_prompt.h"
#include "pi0/model/observation.h"

namespace pi0::train {

struct FastDecodingCount {
  int64_t undecodable = 0;  ///< examples whose prediction holds no actions
  int64_t sequences = 0;    ///< examples with FAST targets
};

/// model.type pi0_fast: each row of `predicted` (Pi0FastImpl::Loss::predicted: [B, L-1] int64, the argmax at each
/// loss-masked target, -1 elsewhere) read as inference reads generated tokens (FastPromptTokenizer::extract_generated,
/// openpi's text round trip), with the batch's chunk length H and each example's robot action dims.
FastDecodingCount count_undecodable_fast(const data::FastPromptTokenizer& reader, const torch::Tensor& predicted,
                                         const model::Batch& batch);

/// train.ki: of each row of `predicted` (KiLoss::predicted: [B, F] int64, the argmax at each valid FAST-block target),
/// the predictions at the block's FAST ids (FastPromptTokenizer::block_fast_count of batch.fast_tokens' row) decoded
/// with (H, robot action dims) (FastPromptTokenizer::decode_paligemma). No text round trip: a KI model acts through its
/// expert, and its FAST block is read as the data pipeline wrote it.
FastDecodingCount count_undecodable_ki(const data::FastPromptTokenizer& reader, const torch::Tensor& predicted,
                                       const model::Batch& batch);

}  // namespace pi0::train
