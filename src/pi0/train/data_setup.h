// Builds the data pipeline (dataset, tokenizer, norm stats, transform, loader) from the config's data section
// (its options: data/config_options.h).
#pragma once
#include <memory>

#include "pi0/config/config.h"
#include "pi0/data/loader.h"
#include "pi0/data/norm_stats.h"

namespace pi0::train {

struct DataPipeline {
  std::shared_ptr<const data::RobotDataset> dataset;
  std::shared_ptr<const data::SampleTransform> transform;
  std::unique_ptr<data::DataLoader> loader;
};

/// The whole pipeline for `rank` of `world_size`; `local_batch` samples per next(), starting at `start`.
DataPipeline make_data_pipeline(const config::Config& cfg, int64_t local_batch, int64_t rank, int64_t world_size,
                                data::LoaderPosition start = {});

}  // namespace pi0::train
