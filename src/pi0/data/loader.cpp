#include "pi0/data/loader.h"

#include "pi0/common/threads.h"

#include <cmath>

#include <spdlog/spdlog.h>

#include "pi0/common/check.h"

namespace pi0::data {

std::vector<int64_t> DataLoader::permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  Rng rng(sample_seed(seed, epoch, -1));
  for (int64_t i = n - 1; i > 0; --i) {
    // Unbiased bounded integer by rejection.
    const uint64_t bound = static_cast<uint64_t>(i + 1);
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do r = rng.next(); while (r >= limit);
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(r % bound)]);
  }
  return p;
}

DataLoader::DataLoader(std::shared_ptr<const RobotDataset> dataset, std::shared_ptr<const SampleTransform> transform,
                       LoaderOptions options, LoaderPosition start)
    : DataLoader(std::vector<DataSource>{{"", std::move(dataset), std::move(transform), 1.0, {}}}, options, start) {}

DataLoader::DataLoader(std::vector<DataSource> sources, LoaderOptions options, LoaderPosition start)
    : sources_(std::move(sources)), options_(options) {
  if (sources_.empty()) throw UserError("loader: no dataset to draw from");
  if (options_.batch_size < 1) throw UserError("loader.batch_size: got " + std::to_string(options_.batch_size) + ", expected >= 1");
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw UserError("loader: rank " + std::to_string(options_.rank) + " / world_size " +
                    std::to_string(options_.world_size) + ", expected 0 <= rank < world_size");
  if (options_.num_workers < 0) throw UserError("loader.num_workers: got " + std::to_string(options_.num_workers) + ", expected >= 0");
  if (options_.prefetch < 1) options_.prefetch = 1;
  for (const auto& s : sources_) {
    PI0_CHECK(s.dataset && s.transform, "DataLoader needs a dataset and a transform per source");
    const std::string what = s.name.empty() ? std::string("the dataset") : "dataset '" + s.name + "'";
    if (!(s.weight > 0) || !std::isfinite(s.weight))
      throw UserError("loader: " + what + " has weight " + std::to_string(s.weight) + ", expected a finite number > 0");
    if (s.size() < 1) throw UserError("loader: " + what + " has no frames to train on");
    s.transform->check_dims(s.dataset->state_dim(), s.dataset->action_dim(), what);
    epoch_size_ += s.size();
  }
  const int64_t global = options_.batch_size * options_.world_size;
  const int64_t n = epoch_size_;
  batches_per_epoch_ = options_.drop_last ? n / global : (n + global - 1) / global;
  if (batches_per_epoch_ < 1)
    throw UserError("loader.batch_size: " + std::to_string(options_.batch_size) + " x world_size " +
                    std::to_string(options_.world_size) + " = " + std::to_string(global) + " exceeds the dataset's " +
                    std::to_string(n) + " samples, expected at most that many with drop_last");
  seek(start);
}

DataLoader::~DataLoader() { stop_workers(); }

LoaderPosition DataLoader::to_position(int64_t g) const { return {g / batches_per_epoch_, g % batches_per_epoch_}; }

LoaderPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return to_position(next_to_consume_);
}

void DataLoader::seek(LoaderPosition pos) {
  PI0_CHECK(pos.epoch >= 0 && pos.batch_index >= 0 && pos.batch_index < batches_per_epoch_, "bad loader position ",
            pos.epoch, "/", pos.batch_index, " (", batches_per_epoch_, " batches per epoch)");
  stop_workers();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    next_to_consume_ = next_to_produce_ = pos.epoch * batches_per_epoch_ + pos.batch_index;
    ready_.clear();
    errors_.clear();
    stop_ = false;
  }
  start_workers();
}

std::vector<SampleRef> DataLoader::epoch_order(int64_t epoch) const {
  std::vector<SampleRef> order;
  order.reserve(static_cast<size_t>(epoch_size_));
  if (sources_.size() == 1) {
    const auto& s = sources_[0];
    if (options_.shuffle) {
      for (const int64_t k : permutation(s.size(), options_.seed, epoch)) order.push_back({0, s.index(k)});
    } else {
      for (int64_t k = 0; k < s.size(); ++k) order.push_back({0, s.index(k)});
    }
    return order;
  }
  if (!options_.shuffle) {  // the sources one after the other
    for (size_t i = 0; i < sources_.size(); ++i)
      for (int64_t k = 0; k < sources_[i].size(); ++k) order.push_back({static_cast<int64_t>(i), sources_[i].index(k)});
    return order;
  }
  // Each slot's source: one uniform of the epoch's stream against the cumulative weights.
  std::vector<double> cumulative;
  double total = 0;
  for (const auto& s : sources_) cumulative.push_back(total += s.weight);
  Rng slots(sample_seed(options_.seed, epoch, -2));
  std::vector<int64_t> drawn(sources_.size(), 0);
  std::vector<std::vector<int64_t>> perms(sources_.size());
  for (int64_t k = 0; k < epoch_size_; ++k) {
    const double u = slots.uniform(0.0, total);
    size_t i = 0;
    while (i + 1 < cumulative.size() && u >= cumulative[i]) ++i;
    const auto& s = sources_[i];
    const int64_t n = s.size();
    const int64_t c = drawn[i]++;
    if (c % n == 0) {
      // The source's (c / n)-th pass of this epoch: its own permutation, from the seed, the source and the pass.
      const uint64_t source_seed = sample_seed(options_.seed, static_cast<int64_t>(i), -3);
      perms[i] = permutation(n, source_seed, epoch * (int64_t{1} << 24) + c / n);
    }
    order.push_back({static_cast<int64_t>(i), s.index(perms[i][static_cast<size_t>(c % n)])});
  }
  return order;
}

std::vector<SampleRef> DataLoader::batch_samples(LoaderPosition pos) const {
  std::shared_ptr<const std::vector<SampleRef>> order;
  {
    std::lock_guard<std::mutex> lock(perm_mutex_);
    auto it = orders_.find(pos.epoch);
    if (it == orders_.end()) {
      if (orders_.size() > 4) orders_.erase(orders_.begin());
      it = orders_.emplace(pos.epoch, std::make_shared<const std::vector<SampleRef>>(epoch_order(pos.epoch))).first;
    }
    order = it->second;
  }
  std::vector<SampleRef> out;
  const int64_t first = (pos.batch_index * options_.world_size + options_.rank) * options_.batch_size;
  for (int64_t i = 0; i < options_.batch_size; ++i) {
    const int64_t k = (first + i) % epoch_size_;  // wraps only without drop_last
    out.push_back((*order)[static_cast<size_t>(k)]);
  }
  return out;
}

std::vector<int64_t> DataLoader::batch_indices(LoaderPosition pos) const {
  std::vector<int64_t> out;
  for (const auto& r : batch_samples(pos)) out.push_back(r.index);
  return out;
}

namespace {
// The batch in page-locked memory (done in the worker threads, off the trainer's critical path).
model::Batch pinned(const model::Batch& b) {
  model::Batch out;
  auto pin = [](const torch::Tensor& t) { return t.is_pinned() ? t : t.pin_memory(); };
  for (const auto& t : b.observation.images) out.observation.images.push_back(pin(t));
  for (const auto& t : b.observation.image_masks) out.observation.image_masks.push_back(pin(t));
  out.observation.state = pin(b.observation.state);
  out.observation.tokenized_prompt = pin(b.observation.tokenized_prompt);
  out.observation.tokenized_prompt_mask = pin(b.observation.tokenized_prompt_mask);
  out.actions = pin(b.actions);
  out.action_rows = pin(b.action_rows);
  out.action_dims = pin(b.action_dims);
  if (b.fast_tokens.defined()) out.fast_tokens = pin(b.fast_tokens), out.fast_mask = pin(b.fast_mask);
  if (b.token_ar_mask.defined()) out.token_ar_mask = pin(b.token_ar_mask), out.token_loss_mask = pin(b.token_loss_mask);
  if (b.subtask_tokens.defined()) {
    out.subtask_tokens = pin(b.subtask_tokens);
    out.subtask_mask = pin(b.subtask_mask);
    out.subtask_targets = pin(b.subtask_targets);
  }
  return out;
}
}  // namespace

model::Batch make_batch(const std::vector<DataSource>& sources, const std::vector<SampleRef>& refs,
                        const std::vector<std::optional<uint64_t>>& augment_seeds) {
  PI0_CHECK(augment_seeds.empty() || augment_seeds.size() == refs.size(), "make_batch: one seed per sample");
  std::vector<ProcessedSample> samples;
  for (size_t i = 0; i < refs.size(); ++i) {
    const auto& s = sources.at(static_cast<size_t>(refs[i].source));
    samples.push_back((*s.transform)(s.dataset->get(refs[i].index), augment_seeds.empty() ? std::nullopt : augment_seeds[i]));
  }
  return collate(samples);
}

model::Batch DataLoader::build(int64_t g) const {
  const LoaderPosition pos = to_position(g);
  const auto refs = batch_samples(pos);
  std::vector<std::optional<uint64_t>> seeds;
  if (options_.augment) {
    for (const auto& r : refs) {
      // One source: the seed of its dataset index, as before mixtures. Several: each source's own stream.
      const uint64_t base = sources_.size() == 1 ? options_.seed : sample_seed(options_.seed, r.source, -4);
      seeds.push_back(sample_seed(base, pos.epoch, r.index));
    }
  }
  auto batch = make_batch(sources_, refs, seeds);
  if (options_.pin_memory) batch = pinned(batch);
  return batch;
}

void DataLoader::start_workers() {
  for (int64_t i = 0; i < options_.num_workers; ++i)
    workers_.emplace_back([this] {
      // The workers run side by side: one ATen thread each (PyTorch's DataLoader does the same), the cores left to
      // the training thread and the host update (train.offload).
      use_one_intra_op_thread();
      worker_loop();
    });
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

void DataLoader::worker_loop() {
  // Each batch is built entirely outside the lock; only claiming a number and publishing the result lock.
  torch::NoGradGuard no_grad;
  while (true) {
    int64_t g;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || next_to_produce_ < next_to_consume_ + options_.prefetch; });
      if (stop_) return;
      g = next_to_produce_++;
    }
    model::Batch b;
    std::exception_ptr err;
    try {
      b = build(g);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (err) errors_[g] = err;
      else ready_[g] = std::move(b);
    }
    cv_.notify_all();
  }
}

model::Batch DataLoader::next() {
  if (options_.num_workers == 0) {
    int64_t g;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      g = next_to_consume_;
    }
    model::Batch b = build(g);  // on exception the position stays, so a retry rebuilds the same batch
    std::lock_guard<std::mutex> lock(mutex_);
    next_to_consume_ = next_to_produce_ = g + 1;
    return b;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  const int64_t g = next_to_consume_;
  cv_.wait(lock, [&] { return ready_.count(g) || errors_.count(g); });
  if (auto it = errors_.find(g); it != errors_.end()) {
    std::exception_ptr err = it->second;
    errors_.erase(it);
    // Rebuild this batch on the next call: hand the slot back to the workers.
    lock.unlock();
    LoaderPosition pos = to_position(g);
    seek(pos);
    std::rethrow_exception(err);
  }
  model::Batch b = std::move(ready_[g]);
  ready_.erase(g);
  ++next_to_consume_;
  lock.unlock();
  cv_.notify_all();
  return b;
}

}  // namespace pi0::data
