#include "pi0/train/data_setup.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/config_options.h"
#include "pi0/data/split.h"
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
  const auto entries = config::dataset_entries(cfg);
  for (size_t i = 0; i < entries.size(); ++i) {
    // Each entry through the single-dataset path: its own options, norm stats and transform.
    const config::Config one = config::for_dataset(cfg, i);
    const std::string key = config::dataset_key(cfg, i);
    data::DataSource s;
    s.name = entries[i].asset_id;
    s.weight = entries[i].weight;
    s.dataset = std::make_shared<const data::RobotDataset>(data::dataset_options(one, key));
    s.transform = std::make_shared<const data::SampleTransform>(data::transform_options(one),
                                                                data::load_config_norm_stats(one, data::norm_stats_key(cfg, i)), tokenizer);
    s.transform->check_dims(s.dataset->state_dim(), s.dataset->action_dim());
    const auto held = data::held_out_episodes(s.dataset->num_episodes(), cfg.data.validation_split,
                                              entries[i].validation_episodes, static_cast<uint64_t>(cfg.train.seed),
                                              static_cast<int64_t>(i), key);
    if (!held.empty()) s.frames = data::episode_frames(*s.dataset, held, /*held_out=*/false);
    p.held_out.push_back(held.empty() ? std::vector<int64_t>{} : data::episode_frames(*s.dataset, held, true));
    p.sources.push_back(std::move(s));
  }
  p.validation = data::validation_samples(p.held_out, cfg.train.val_samples);
  data::LoaderOptions lo;
  lo.batch_size = local_batch;
  lo.num_workers = cfg.data.num_workers;
  lo.prefetch = cfg.data.prefetch;
  lo.pin_memory = torch::Device(cfg.train.device).is_cuda() && torch::cuda::is_available();
  lo.seed = static_cast<uint64_t>(cfg.train.seed);
  lo.rank = rank;
  lo.world_size = world_size;
  lo.augment = cfg.data.augment;
  p.loader = std::make_unique<data::DataLoader>(p.sources, lo, start);
  return p;
}

}  // namespace pi0::train
