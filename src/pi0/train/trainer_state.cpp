#include "pi0/train/trainer_state.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "pi0/common/check.h"
#include "pi0/common/strings.h"

namespace pi0::train {
namespace {

std::string state_file(const std::string& checkpoint_dir) {
  return (std::filesystem::path(checkpoint_dir) / kTrainerStateFile).string();
}

// `obj[key]` as an integer >= lo; `fallback` when absent and `fallback` is given.
int64_t read_int(const nlohmann::json& obj, const std::string& key, const std::string& field, int64_t lo,
                 const std::string& file, std::optional<int64_t> fallback = std::nullopt) {
  const auto it = obj.find(key);
  if (it == obj.end()) {
    if (fallback) return *fallback;
    throw UserError(file + ": field '" + field + "' is missing (expected an integer >= " + std::to_string(lo) + ")");
  }
  if (!it->is_number_integer() || it->get<int64_t>() < lo) {
    throw UserError(file + ": field '" + field + "' must be an integer >= " + std::to_string(lo) + " (got " +
                    it->dump() + ")");
  }
  return it->get<int64_t>();
}

data::LoaderPosition read_position(const nlohmann::json& j, const std::string& field, const std::string& file) {
  if (!j.is_object()) {
    throw UserError(file + ": field '" + field + "' must be an object {epoch, batch_index} (got " + j.dump() + ")");
  }
  data::LoaderPosition p;
  p.epoch = read_int(j, "epoch", field + ".epoch", 0, file);
  p.batch_index = read_int(j, "batch_index", field + ".batch_index", 0, file);
  return p;
}

}  // namespace

nlohmann::json to_json(const TrainerStateFile& state) {
  nlohmann::json loaders = nlohmann::json::array();
  for (const auto& p : state.rank_loaders) loaders.push_back({{"epoch", p.epoch}, {"batch_index", p.batch_index}});
  nlohmann::json j = {{"step", state.step},
                      {"world_size", state.world_size},
                      {"nonfinite_skips", state.nonfinite_skips},
                      {"loader", loaders.empty() ? nlohmann::json::object() : loaders[0]},
                      {"rank_loaders", loaders}};
  if (state.global_batch_size > 0) {
    j["global_batch_size"] = state.global_batch_size;
    j["grad_accum_steps"] = state.grad_accum_steps;
  }
  if (state.val_loss) j["val_loss"] = *state.val_loss;
  if (const auto& v = state.validation_set) {
    j["validation_set"] = {{"validation_split", v->validation_split},
                           {"seed", v->seed},
                           {"val_samples", v->val_samples},
                           {"digest", v->digest}};
  }
  return j;
}

TrainerStateFile read_trainer_state(const std::string& checkpoint_dir) {
  const auto file = state_file(checkpoint_dir);
  std::ifstream in(file);
  if (!in) throw UserError(file + ": cannot be read (" + std::strerror(errno) + ")");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw UserError(file + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw UserError(file + ": expected a JSON object (got " + std::string(j.type_name()) + ")");
  TrainerStateFile s;
  s.step = read_int(j, "step", "step", 0, file);
  s.world_size = read_int(j, "world_size", "world_size", 1, file, 1);
  s.nonfinite_skips = read_int(j, "nonfinite_skips", "nonfinite_skips", 0, file, 0);
  if (j.contains("rank_loaders")) {
    const auto& r = j.at("rank_loaders");
    if (!r.is_array() || static_cast<int64_t>(r.size()) != s.world_size) {
      throw UserError(file + ": field 'rank_loaders' must be a list of " + std::to_string(s.world_size) +
                      " loader positions, one per rank (got " + r.dump() + ")");
    }
    for (size_t i = 0; i < r.size(); ++i)
      s.rank_loaders.push_back(read_position(r[i], "rank_loaders[" + std::to_string(i) + "]", file));
  } else if (j.contains("loader") && s.world_size == 1) {
    s.rank_loaders.push_back(read_position(j.at("loader"), "loader", file));
  } else {
    throw UserError(file + ": field 'rank_loaders' is missing (expected one loader position per rank)");
  }
  if (j.contains("global_batch_size") || j.contains("grad_accum_steps")) {  // both, or neither (older files)
    s.global_batch_size = read_int(j, "global_batch_size", "global_batch_size", 1, file);
    s.grad_accum_steps = read_int(j, "grad_accum_steps", "grad_accum_steps", 1, file);
    if (s.global_batch_size % s.grad_accum_steps != 0) {
      throw UserError(file + ": field 'global_batch_size' (" + std::to_string(s.global_batch_size) + ") must be a " +
                      "multiple of 'grad_accum_steps' (" + std::to_string(s.grad_accum_steps) + ")");
    }
  }
  if (j.contains("val_loss")) {
    const auto& v = j.at("val_loss");
    if (!v.is_number()) throw UserError(file + ": field 'val_loss' must be a number (got " + v.dump() + ")");
    s.val_loss = v.get<double>();
  }
  if (j.contains("validation_set")) {
    const auto& v = j.at("validation_set");
    const auto bad = [&file](const std::string& field, const std::string& expected, const nlohmann::json& got) {
      return UserError(file + ": field '" + field + "' must be " + expected + " (got " + got.dump() + ")");
    };
    if (!v.is_object()) throw bad("validation_set", "an object {validation_split, seed, val_samples, digest}", v);
    const auto get = [&v](const char* key) { return v.contains(key) ? v.at(key) : nlohmann::json(); };
    const auto split = get("validation_split"), seed = get("seed"), digest = get("digest");
    if (!split.is_number()) throw bad("validation_set.validation_split", "a number", split);
    if (!seed.is_number_integer()) throw bad("validation_set.seed", "an integer", seed);
    if (!digest.is_string()) throw bad("validation_set.digest", "a string", digest);
    ValidationSetId id;
    id.validation_split = split.get<double>();
    id.seed = seed.get<int64_t>();
    id.val_samples = read_int(v, "val_samples", "validation_set.val_samples", 0, file);
    id.digest = digest.get<std::string>();
    s.validation_set = id;
  }
  return s;
}

std::string validation_set_change(const ValidationSetId& recorded, const ValidationSetId& run,
                                  const std::string& checkpoint_dir) {
  if (recorded.digest == run.digest) return "";
  const std::string when = " when checkpoint " + checkpoint_dir + " was written";
  if (recorded.validation_split != run.validation_split)
    return "data.validation_split is " + shortest_double(run.validation_split) + " but was " +
           shortest_double(recorded.validation_split) + when;
  if (recorded.seed != run.seed)
    return "train.seed is " + std::to_string(run.seed) + " but was " + std::to_string(recorded.seed) + when;
  if (recorded.val_samples != run.val_samples)
    return "train.val_samples is " + std::to_string(run.val_samples) + " but was " +
           std::to_string(recorded.val_samples) + when;
  return "the held-out validation set differs from the one checkpoint " + checkpoint_dir + " was written with, " +
         "though data.validation_split, train.seed and train.val_samples are the same (the datasets or an entry's "
         "validation_episodes changed)";
}

ResumePosition resume_position(const TrainerStateFile& state, const std::string& checkpoint_dir,
                               const RunGeometry& run, int64_t rank) {
  const auto file = state_file(checkpoint_dir);
  if (state.world_size != run.world_size) {
    // Another world size sees the same global batches (each rank takes a slice of the global batch order) only if
    // every rank stopped at the same place, which they do when all ran the same steps.
    for (size_t r = 1; r < state.rank_loaders.size(); ++r) {
      if (!(state.rank_loaders[r] == state.rank_loaders[0])) {
        throw UserError("checkpoint '" + checkpoint_dir + "' was written by " + std::to_string(state.world_size) +
                        " ranks whose loader positions differ (" + file + ": rank_loaders); resume it with the same "
                        "world size (got " + std::to_string(run.world_size) + ")");
      }
    }
  }
  // A loader position counts batches of global_batch_size / grad_accum_steps samples of the epoch's permutation
  // (loader.h), whatever the world size. When that changed, the run continues at the same sample, so it reads
  // exactly the samples the checkpointed run had not read yet this epoch. A checkpoint without the sizes (older
  // than the fields) keeps its batch index, as it always did.
  const int64_t old_samples = state.global_batch_size ? state.global_batch_size / state.grad_accum_steps : 0;
  const int64_t new_samples = run.global_batch_size / run.grad_accum_steps;
  std::string changed;  // "train.batch_size changed 4 → 8", and/or grad_accum_steps
  if (state.global_batch_size && state.global_batch_size != run.global_batch_size)
    changed = "train.batch_size changed " + std::to_string(state.global_batch_size) + " → " +
              std::to_string(run.global_batch_size);
  if (state.global_batch_size && state.grad_accum_steps != run.grad_accum_steps)
    changed += (changed.empty() ? "" : ", ") + std::string("train.grad_accum_steps changed ") +
               std::to_string(state.grad_accum_steps) + " → " + std::to_string(run.grad_accum_steps);
  const bool move = old_samples && old_samples != new_samples;
  ResumePosition out;
  for (size_t r = 0; r < state.rank_loaders.size(); ++r) {
    const auto field = "'rank_loaders[" + std::to_string(r) + "]";
    data::LoaderPosition p = state.rank_loaders[r];
    const int64_t sample = p.batch_index * old_samples;
    if (move) {
      if (sample % new_samples != 0) {
        throw UserError(file + ": the run stopped at sample " + std::to_string(sample) + " of epoch " +
                        std::to_string(p.epoch) + " (" + field + "'), which no batch of " +
                        std::to_string(new_samples) + " samples starts at (" + changed + "); resume this checkpoint "
                        "with a batch that divides " + std::to_string(sample) + " samples, e.g. the old one");
      }
      p.batch_index = sample / new_samples;
    }
    if (p.batch_index >= run.batches_per_epoch) {
      throw UserError(file + ": field " + field + ".batch_index' is " + std::to_string(state.rank_loaders[r].batch_index) +
                      (move ? " (batch " + std::to_string(p.batch_index) + " of " + std::to_string(new_samples) +
                                  " samples now)"
                            : std::string()) +
                      " but an epoch now has " + std::to_string(run.batches_per_epoch) + " batches per rank (the "
                      "dataset or train.batch_size changed since this checkpoint)");
    }
    if (static_cast<int64_t>(r) == (state.world_size == run.world_size ? rank : 0)) {
      out.loader = p;
      if (move) {
        out.moved = changed + ": continuing at sample " + std::to_string(sample) + " of epoch " +
                    std::to_string(p.epoch) + " (batch " + std::to_string(p.batch_index) + ")";
      }
    }
  }
  return out;
}

}  // namespace pi0::train
