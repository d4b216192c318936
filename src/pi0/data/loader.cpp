#include "pi0/data/loader.h"

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
    : dataset_(std::move(dataset)), transform_(std::move(transform)), options_(options) {
  PI0_CHECK(dataset_ && transform_, "DataLoader needs a dataset and a transform");
  if (options_.batch_size < 1) throw UserError("loader.batch_size: got " + std::to_string(options_.batch_size) + ", expected >= 1");
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw UserError("loader: rank " + std::to_string(options_.rank) + " / world_size " +
                    std::to_string(options_.world_size) + ", expected 0 <= rank < world_size");
  if (options_.num_workers < 0) throw UserError("loader.num_workers: got " + std::to_string(options_.num_workers) + ", expected >= 0");
  if (options_.prefetch < 1) options_.prefetch = 1;
  transform_->check_dims(dataset_->state_dim(), dataset_->action_dim());
  const int64_t global = options_.batch_size * options_.world_size;
  const int64_t n = dataset_->size();
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

std::vector<int64_t> DataLoader::batch_indices(LoaderPosition pos) const {
  const int64_t n = dataset_->size();
  std::shared_ptr<const std::vector<int64_t>> perm;
  if (options_.shuffle) {
    std::lock_guard<std::mutex> lock(perm_mutex_);
    auto it = perms_.find(pos.epoch);
    if (it == perms_.end()) {
      if (perms_.size() > 4) perms_.erase(perms_.begin());
      it = perms_.emplace(pos.epoch, std::make_shared<const std::vector<int64_t>>(permutation(n, options_.seed, pos.epoch))).first;
    }
    perm = it->second;
  }
  std::vector<int64_t> out;
  const int64_t first = (pos.batch_index * options_.world_size + options_.rank) * options_.batch_size;
  for (int64_t i = 0; i < options_.batch_size; ++i) {
    const int64_t k = (first + i) % n;  // wraps only without drop_last
    out.push_back(perm ? (*perm)[static_cast<size_t>(k)] : k);
  }
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
  return out;
}
}  // namespace

model::Batch DataLoader::build(int64_t g) const {
  const LoaderPosition pos = to_position(g);
  std::vector<ProcessedSample> samples;
  for (int64_t idx : batch_indices(pos)) {
    std::optional<uint64_t> seed;
    if (options_.augment) seed = sample_seed(options_.seed, pos.epoch, idx);
    samples.push_back((*transform_)(dataset_->get(idx), seed));
  }
  auto batch = collate(samples);
  if (options_.pin_memory) batch = pinned(batch);
  return batch;
}

void DataLoader::start_workers() {
  for (int64_t i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
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
