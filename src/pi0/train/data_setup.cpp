#include "pi0/train/data_setup.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/config_options.h"
#include "pi0/data/tokenizer.h"

namespace pi0::train {

data::DatasetOptions dataset_options(const config::Config& cfg) {
  const auto& d = cfg.data.dataset;
  if (d.paths.empty()) throw UserError("data.dataset.paths is empty: name the HDF5 files or globs to train on");
  data::DatasetOptions o;
  o.format = d.format;
  o.paths = d.paths;
  o.cameras = d.cameras;
  o.state_keys = d.state_keys;
  o.action_key = d.action_key;
  o.prompt = d.prompt;
  o.adapt_to_pi = d.adapt_to_pi;
  o.action_horizon = cfg.model.action_horizon;
  return o;
}

data::TransformOptions transform_options(const config::Config& cfg) {
  data::TransformOptions t;
  t.model_type = cfg.model.type;
  t.action_dim = cfg.model.action_dim;
  t.image_size = cfg.model.image_size;
  t.max_token_len = cfg.model.max_token_len;
  t.discrete_state_input = cfg.data.discrete_state_input;
  t.delta_action_mask = cfg.data.delta_action_mask;
  return t;
}

data::NormStats load_config_norm_stats(const config::Config& cfg) {
  if (cfg.data.norm_stats.empty()) {
    throw UserError("data.norm_stats is not set: compute it with pi0-norm-stats --config <run.yaml> and set the path");
  }
  if (!pi0::posix_fs::exists(cfg.data.norm_stats)) {
    throw UserError("data.norm_stats: file '" + cfg.data.norm_stats +
                    "' does not exist (compute it with pi0-norm-stats --config <run.yaml>)");
  }
  require_input_file(cfg.data.norm_stats, "data.norm_stats", "a norm_stats.json file");
  return data::load_norm_stats(cfg.data.norm_stats);
}

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
