#include "pi0/train/data_setup.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/config_options.h"
#include "pi0/data/tokenizer.h"

namespace pi0::train {

DataPipeline make_data_pipeline(const config::Config& cfg, int64_t local_batch, int64_t rank, int64_t world_size,
                                data::LoaderPosition start) {
  if (cfg.data.tokenizer.empty()) throw UserError("data.tokenizer is not set: name a sentencepiece model file");
  if (!pi0::posix_fs::exists(cfg.data.tokenizer)) {
    throw UserError("data.tokenizer: file '" + cfg.data.tokenizer + "' does not exist (expected a sentencepiece model)");
  }
  require_input_file(cfg.data.tokenizer, "data.tokenizer", "a sentencepiece model file");
  DataPipeline p;
  auto tokenizer = std::make_shared<const data::Tokenizer>(cfg.data.tokenizer);
  if (tokenizer->vocab_size() > cfg.model.vocab_size) {
    throw UserError("data.tokenizer '" + cfg.data.tokenizer + "' has " + std::to_string(tokenizer->vocab_size()) +
                    " tokens but model.vocab_size is " + std::to_string(cfg.model.vocab_size));
  }
  auto dataset = std::make_shared<const data::RobotDataset>(data::dataset_options(cfg));
  auto transform = std::make_shared<const data::SampleTransform>(data::transform_options(cfg), data::load_config_norm_stats(cfg),
                                                                 tokenizer);
  transform->check_dims(dataset->state_dim(), dataset->action_dim());
  data::LoaderOptions lo;
  lo.batch_size = local_batch;
  lo.num_workers = cfg.data.num_workers;
  lo.prefetch = cfg.data.prefetch;
  lo.pin_memory = torch::Device(cfg.train.device).is_cuda() && torch::cuda::is_available();
  lo.seed = static_cast<uint64_t>(cfg.train.seed);
  lo.rank = rank;
  lo.world_size = world_size;
  lo.augment = cfg.data.augment;
  p.dataset = dataset;
  p.transform = transform;
  p.loader = std::make_unique<data::DataLoader>(dataset, transform, lo, start);
  return p;
}

}  // namespace pi0::train
