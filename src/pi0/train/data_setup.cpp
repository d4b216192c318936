#include "pi0/train/data_setup.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"
#include "pi0/data/config_options.h"
#include "pi0/data/split.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/checksum.h"

namespace pi0::train {
namespace {

// The held-out set as ValidationSetId records it: its keys, and a digest of the frames and samples they chose.
ValidationSetId validation_set_id(const config::Config& cfg, const DataPipeline& p) {
  ValidationSetId id;
  id.validation_split = cfg.data.validation_split;
  id.seed = cfg.train.seed;
  id.val_samples = cfg.train.val_samples;
  io::Xxh3 h;
  auto add = [&h](int64_t v) { h.update(&v, sizeof v); };
  for (const auto& frames : p.held_out) {
    add(static_cast<int64_t>(frames.size()));  // where one source's frames end and the next one's begin
    for (const int64_t f : frames) add(f);
  }
  for (const auto& s : p.validation) add(s.source), add(s.index);
  // The seed draws each validation sample's noise and time: another seed, other values. Without held-out frames it
  // chooses nothing.
  if (!p.validation.empty()) add(id.seed);
  id.digest = h.hex();
  return id;
}

}  // namespace

namespace {

// The FAST tokenizer folder `dir` of config key `key`, checked against openpi's map into `spm`'s vocabulary.
std::shared_ptr<const data::FastTokenizer> load_fast_tokenizer(const std::string& key, const std::string& dir,
                                                               const config::Config& cfg, const data::Tokenizer& spm) {
  if (!pi0::posix_fs::exists(dir)) {
    throw UserError(key + ": folder '" + dir + "' does not exist (expected a FAST tokenizer folder with "
                    "processor_config.json and tokenizer.json, docs/fast.md)" + relative_path_note(dir));
  }
  std::shared_ptr<const data::FastTokenizer> fast;
  try {
    fast = std::make_shared<const data::FastTokenizer>(dir);
  } catch (const UserError& e) {
    throw UserError(key + ": " + e.what());
  }
  // openpi's map pg(id) = spm vocab - 1 - 128 - id puts FAST ids below the 128 <seg> tokens at the vocabulary's end.
  const int64_t room = data::fast_token_room(spm.vocab_size());
  if (fast->vocab_size() > room) {
    throw UserError(key + ": the FAST vocabulary has " + std::to_string(fast->vocab_size()) + " ids but data.tokenizer '" +
                    cfg.data.tokenizer + "' (" + std::to_string(spm.vocab_size()) + " tokens) has room for " +
                    std::to_string(std::max<int64_t>(room, 0)) + " below its 128 reserved tail tokens (openpi's map); "
                    "use a smaller FAST tokenizer or PaliGemma's SentencePiece model");
  }
  return fast;
}

}  // namespace

std::shared_ptr<const data::FastTokenizer> load_ki_fast_tokenizer(const config::Config& cfg,
                                                                  const data::Tokenizer& spm) {
  if (!cfg.train.ki.enabled) return nullptr;
  return load_fast_tokenizer("train.ki.fast_tokenizer", cfg.train.ki.fast_tokenizer, cfg, spm);
}

std::shared_ptr<const data::FastPromptTokenizer> load_fast_prompt_tokenizer(
    const config::Config& cfg, std::shared_ptr<const data::Tokenizer> spm) {
  if (cfg.model.type != "pi0_fast") return nullptr;
  auto fast = load_fast_tokenizer("model.fast_tokenizer", cfg.model.fast_tokenizer, cfg, *spm);
  return std::make_shared<const data::FastPromptTokenizer>(std::move(spm), std::move(fast));
}

DataPipeline make_data_pipeline(const config::Config& cfg, int64_t local_batch, int64_t rank, int64_t world_size,
                                data::LoaderPosition start) {
  if (cfg.data.tokenizer.empty()) throw UserError("data.tokenizer is not set: name a sentencepiece model file");
  if (!pi0::posix_fs::exists(cfg.data.tokenizer)) {
    throw UserError("data.tokenizer: file '" + cfg.data.tokenizer + "' does not exist (expected a sentencepiece model)" +
                    relative_path_note(cfg.data.tokenizer));
  }
  require_input_file(cfg.data.tokenizer, "data.tokenizer", "a sentencepiece model file");
  DataPipeline p;
  auto tokenizer = std::make_shared<const data::Tokenizer>(cfg.data.tokenizer);
  if (tokenizer->vocab_size() > cfg.model.vocab_size) {
    throw UserError("data.tokenizer '" + cfg.data.tokenizer + "' has " + std::to_string(tokenizer->vocab_size()) +
                    " tokens but model.vocab_size is " + std::to_string(cfg.model.vocab_size));
  }
  const auto fast = load_ki_fast_tokenizer(cfg, *tokenizer);
  const auto fast_prompt = load_fast_prompt_tokenizer(cfg, tokenizer);
  p.fast_reader = fast ? std::make_shared<const data::FastPromptTokenizer>(tokenizer, fast) : fast_prompt;
  if (cfg.train.subtask.enabled) {
    // Decoding starts after the cue, and a block must hold the cue, one text token and EOS.
    const auto& st = cfg.train.subtask;
    const auto cue = static_cast<int64_t>(tokenizer->encode(st.cue).size());
    if (cue == 0)
      throw UserError("train.subtask.cue: '" + st.cue + "' has no tokens in " + cfg.data.tokenizer +
                      ", expected text the subtask follows (e.g. 'Subtask: ')");
    if (st.max_tokens < cue + 2)
      throw UserError("train.subtask.max_tokens: got " + std::to_string(st.max_tokens) + ", expected >= " +
                      std::to_string(cue + 2) + " (the cue's " + std::to_string(cue) + " tokens, a text token and EOS)");
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
    auto transform = data::transform_options(one);
    transform.fast_tokenizer = fast;
    transform.max_fast_tokens = cfg.train.ki.max_fast_tokens;
    transform.fast_prompt = fast_prompt;
    if (cfg.train.subtask.enabled) {
      transform.max_subtask_tokens = cfg.train.subtask.max_tokens;
      transform.subtask_cue = cfg.train.subtask.cue;
    }
    s.transform = std::make_shared<const data::SampleTransform>(transform,
                                                                data::load_config_norm_stats(one, data::norm_stats_key(cfg, i)), tokenizer);
    s.transform->check_dims(s.dataset->state_dim(), s.dataset->action_dim(), key,
                            config::delta_action_mask_key(cfg, i));
    const auto held = data::held_out_episodes(s.dataset->num_episodes(), cfg.data.validation_split,
                                              entries[i].validation_episodes, static_cast<uint64_t>(cfg.train.seed),
                                              static_cast<int64_t>(i), key);
    if (!held.empty()) s.frames = data::episode_frames(*s.dataset, held, /*held_out=*/false);
    p.held_out.push_back(held.empty() ? std::vector<int64_t>{} : data::episode_frames(*s.dataset, held, true));
    p.sources.push_back(std::move(s));
  }
  p.validation = data::validation_samples(p.held_out, cfg.train.val_samples);
  p.validation_set = validation_set_id(cfg, p);
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
