#include "pi0/train/sample_dump.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"
#include "pi0/model/observation.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/plot.h"

namespace pi0::train {
namespace fs = pi0::posix_fs;

namespace {

// [H,W,3] uint8 → PNG.
void write_frame(const torch::Tensor& hwc, const fs::path& path) {
  const auto img = hwc.to(torch::kUInt8).contiguous();
  const int h = static_cast<int>(img.size(0)), w = static_cast<int>(img.size(1));
  Canvas c(w, h);
  const auto* p = img.data_ptr<uint8_t>();
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x, p += 3) c.set(x, y, {p[0], p[1], p[2]});
  write_png(path.string(), c);
}

// A model input image [3,S,S] in [-1, 1] → [S,S,3] uint8 (the inverse of the transform's x/255·2−1).
torch::Tensor to_hwc_uint8(const torch::Tensor& chw) {
  return ((chw.to(torch::kFloat32) + 1) * 127.5).round().clamp(0, 255).to(torch::kUInt8).permute({1, 2, 0});
}

// float32 values as the shortest decimals that read back as the same float (0.18786848, not 0.18786847591400146).
nlohmann::json values(const torch::Tensor& t) {
  const auto f = t.to(torch::kFloat32).contiguous();
  if (f.dim() == 1) {
    nlohmann::json out = nlohmann::json::array();
    char buf[32];
    for (int64_t i = 0; i < f.numel(); ++i) {
      const auto r = std::to_chars(buf, buf + sizeof buf, f.data_ptr<float>()[i]);
      out.push_back(std::strtod(std::string(buf, r.ptr).c_str(), nullptr));
    }
    return out;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < f.size(0); ++i) rows.push_back(values(f[i]));
  return rows;
}

}  // namespace

int64_t dump_samples(const config::Config& cfg, int64_t n, const std::string& dir) {
  if (n < 1) throw UserError("--dump-batches: got " + std::to_string(n) + " samples, expected >= 1");
  if (fs::exists(dir)) {
    throw UserError("--dump-batches: '" + dir + "' already exists; name a new directory (nothing is overwritten)");
  }
  // The micro-batch a single process trains on: the loader then yields samples in training's order.
  const int64_t micro_batch = cfg.train.batch_size / cfg.train.grad_accum_steps;
  auto pipe = make_data_pipeline(cfg, micro_batch, 0, 1);
  const data::Tokenizer tokenizer(cfg.data.tokenizer);
  // pi0_fast and train.ki: the FAST tokens are shown with the actions they decode to.
  const data::FastPromptTokenizer* fast = pipe.fast_reader.get();

  const fs::path final_dir(dir);
  const fs::path tmp = final_dir.parent_path() / (final_dir.filename().string() + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  try {
    int64_t written = 0;
    while (written < n) {
      const auto refs = pipe.loader->batch_samples(pipe.loader->position());
      const auto batch = pipe.loader->next();
      const auto& obs = batch.observation;
      for (int64_t b = 0; b < obs.batch_size() && written < n; ++b, ++written) {
        const auto& ref = refs.at(static_cast<size_t>(b));
        const int64_t index = ref.index;
        const auto& source = pipe.sources.at(static_cast<size_t>(ref.source));
        const auto& dataset = *source.dataset;
        const auto& opts = dataset.options();
        const auto raw = dataset.get(index);
        const auto& ep = dataset.episode(raw.episode);
        char name[32];
        std::snprintf(name, sizeof name, "sample_%03lld", static_cast<long long>(written));
        const fs::path sd = tmp / name;
        fs::create_directories(sd);

        nlohmann::json cameras = nlohmann::json::object();
        for (size_t slot = 0; slot < model::kCameraNames.size(); ++slot) {
          const std::string slot_name = model::kCameraNames[slot];
          const bool present = obs.image_masks[slot][b].item<bool>();
          auto key = opts.cameras.find(slot_name);
          nlohmann::json c = {{"key", key == opts.cameras.end() ? nlohmann::json(nullptr) : nlohmann::json(key->second)},
                              {"present", present}};
          if (present) {
            c["image"] = slot_name + ".png";
            write_frame(to_hwc_uint8(obs.images[slot][b]), sd / (slot_name + ".png"));
            if (slot < raw.images.size() && raw.images[slot].defined()) {
              c["raw_image"] = slot_name + "_raw.png";
              c["raw_size"] = {raw.images[slot].size(1), raw.images[slot].size(0)};
              write_frame(raw.images[slot], sd / (slot_name + "_raw.png"));
            }
          }
          cameras[slot_name] = c;
        }
        const auto tokens = obs.tokenized_prompt[b].to(torch::kInt64).contiguous();
        const auto mask = obs.tokenized_prompt_mask[b].to(torch::kBool).contiguous();
        std::vector<int> ids;
        std::vector<int64_t> all_ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
        for (int64_t i = 0; i < tokens.numel(); ++i)
          if (mask[i].item<bool>()) ids.push_back(static_cast<int>(all_ids[static_cast<size_t>(i)]));
        nlohmann::json j = {
            {"dataset", source.name},
            {"dataset_index", ref.source},
            {"index", index},
            {"episode", raw.episode},
            {"frame", raw.frame},
            {"file", dataset.files().at(static_cast<size_t>(ep.file))},
            {"group", ep.group},
            {"format", opts.format},
            {"flip_images", opts.flip_images},
            {"prompt", raw.prompt},
            {"cameras", cameras},
            {"state_raw", values(raw.state)},
            {"actions_raw", values(raw.actions)},
            {"state", values(obs.state[b])},
            {"actions", values(batch.actions[b])},
            {"tokens", all_ids},
            {"token_count", static_cast<int64_t>(ids.size())},
            {"tokens_text", tokenizer.decode(ids)},
        };
        const auto show_fast = [&](const std::vector<int64_t>& tokens, const std::vector<int64_t>& fast_ids,
                                   const data::FastDecoded& decoded, bool holds_actions) {
          const int64_t h = batch.actions.size(1), d = batch.action_dims[b].item<int64_t>();
          j["fast_tokens"] = tokens;
          j["fast_ids"] = fast_ids;
          j["fast_decodable"] = holds_actions;
          j["fast_actions"] = values(torch::tensor(decoded.actions, torch::kFloat64).view({h, d}));
        };
        if (fast && batch.fast_tokens.defined()) {
          // train.ki: the block's PaliGemma ids, the FAST ids they map back to (without the closing "|" and EOS,
          // unless truncation cut them), and those decoded: [H, robot dims], normalized units.
          std::vector<int64_t> block;
          for (int64_t i = 0; i < batch.fast_tokens.size(1); ++i)
            if (batch.fast_mask[b][i].item<bool>()) block.push_back(batch.fast_tokens[b][i].item<int64_t>());
          const int64_t n_fast = fast->block_fast_count(block);
          std::vector<int64_t> fast_ids;
          for (int64_t i = 0; i < n_fast; ++i) fast_ids.push_back(fast->paligemma_of(block[static_cast<size_t>(i)]));
          const auto decoded = fast->fast().decode(fast_ids, batch.actions.size(1), batch.action_dims[b].item<int64_t>());
          show_fast(block, fast_ids, decoded, decoded.decodable);
          j["fast_truncated"] = n_fast == static_cast<int64_t>(block.size());
        } else if (fast && batch.token_loss_mask.defined()) {
          // pi0_fast: the postfix ("Action: ", FAST ids, "|", EOS) and the actions inference would read from it
          // (openpi's text round trip: over a tokenizer whose tail pieces do not re-encode to themselves, none).
          std::vector<int64_t> postfix;
          for (int64_t i = 0; i < tokens.numel(); ++i)
            if (batch.token_loss_mask[b][i].item<bool>()) postfix.push_back(all_ids[static_cast<size_t>(i)]);
          const auto extracted =
              fast->extract_generated(postfix, batch.actions.size(1), batch.action_dims[b].item<int64_t>());
          show_fast(postfix, extracted.fast_ids, extracted.decoded, extracted.holds_actions());
        }
        if (batch.subtask_tokens.defined()) {
          // The frame's subtask text, the block the model reads (cue, text, EOS) and the part it predicts.
          std::vector<int64_t> block;
          std::vector<int> target_ids;
          for (int64_t i = 0; i < batch.subtask_tokens.size(1); ++i) {
            if (!batch.subtask_mask[b][i].item<bool>()) continue;
            block.push_back(batch.subtask_tokens[b][i].item<int64_t>());
            if (batch.subtask_targets[b][i].item<bool>()) target_ids.push_back(static_cast<int>(block.back()));
          }
          j["subtask"] = raw.subtask;
          j["subtask_tokens"] = block;
          j["subtask_text"] = tokenizer.decode(std::vector<int>(block.begin(), block.end()));
          j["subtask_target_text"] = tokenizer.decode(target_ids);
        }
        std::ofstream out(sd / "sample.json");
        out << j.dump(2) << "\n";
        if (!out) throw UserError("--dump-batches: cannot write '" + (sd / "sample.json").string() + "'");
      }
    }
    fs::rename(tmp, final_dir);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  std::string what;
  for (const auto& s : pipe.sources) {
    const auto& o = s.dataset->options();
    what += (what.empty() ? "" : ", ") + std::string("'") + s.name + "' (" + (o.paths.empty() ? "?" : o.paths.front()) +
            ", " + o.format + ", " + std::to_string(s.dataset->size()) + " samples)";
  }
  spdlog::info("wrote {} samples of {} to {}: frames as read (*_raw.png) and as the model sees them (*.png), state, "
               "actions and prompt tokens in sample.json (\"dataset\" names each one's)", n, what, dir);
  return n;
}

}  // namespace pi0::train
