// Builds the data pipeline (datasets, tokenizer, norm stats, transforms, validation split, loader) from the config's
// data section (its options: data/config_options.h). One dataset (data.dataset) or a weighted mixture
// (data.datasets): each entry its own dataset, norm stats and transform; the loader draws from them all.
#pragma once
#include <memory>
#include <vector>

#include "pi0/config/config.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/loader.h"
#include "pi0/data/tokenizer.h"
#include "pi0/data/norm_stats.h"
#include "pi0/train/trainer_state.h"

namespace pi0::train {

struct DataPipeline {
  /// One per entry of config::dataset_entries(), in order, each with its training frames (empty: every frame).
  std::vector<data::DataSource> sources;
  /// Per source: dataset indices of its held-out frames (empty without a validation split).
  std::vector<std::vector<int64_t>> held_out;
  /// The samples every validation pass evaluates (train.val_samples of the held-out frames); empty without a split.
  std::vector<data::SampleRef> validation;
  /// What chose `held_out` and `validation` (recorded in checkpoints, compared at --resume).
  ValidationSetId validation_set;
  std::unique_ptr<data::DataLoader> loader;
  /// What reads a model's FAST predictions back (train/fast_decoding.h): model.type pi0_fast's token layout, or
  /// train.ki's FAST tokenizer over data.tokenizer; null otherwise.
  std::shared_ptr<const data::FastPromptTokenizer> fast_reader;
};

/// train.ki's FAST tokenizer (null when KI is off). UserError naming train.ki.fast_tokenizer when the folder is missing or
/// unreadable, or when its vocabulary does not fit openpi's map into `spm`'s vocabulary.
std::shared_ptr<const data::FastTokenizer> load_ki_fast_tokenizer(const config::Config& cfg, const data::Tokenizer& spm);
/// model.type pi0_fast's token layout over `spm` and model.fast_tokenizer (null for the other model types); UserError
/// naming model.fast_tokenizer as load_ki_fast_tokenizer does.
std::shared_ptr<const data::FastPromptTokenizer> load_fast_prompt_tokenizer(const config::Config& cfg,
                                                                            std::shared_ptr<const data::Tokenizer> spm);
/// The whole pipeline for `rank` of `world_size`; `local_batch` samples per next(), starting at `start`.
DataPipeline make_data_pipeline(const config::Config& cfg, int64_t local_batch, int64_t rank, int64_t world_size,
                                data::LoaderPosition start = {});

}  // namespace pi0::train
