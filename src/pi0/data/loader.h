// Multi-threaded, deterministic, resumable batch loader over one dataset or a weighted mixture of several.
//
// Determinism: the batch at (epoch, batch_index) on a rank is a pure function of (seed, epoch, batch_index, rank,
// world_size, batch_size): the epoch's order of samples comes from (seed, epoch), the rank takes a fixed slice of it,
// and each sample's augmentation stream is seeded from (seed, epoch, dataset index). Worker threads only decide
// *when* a batch is built, never *what* is in it, so any num_workers gives the same batches, and restoring a
// LoaderPosition yields exactly the batch that would have come next.
//
// One source: an epoch is a permutation of its frames (of its training split, when episodes are held out). Several
// (data.datasets): an epoch has as many samples as the sources' frames together; each of its slots draws its source
// i with probability weight_i / Σ weights (independent draws from the epoch's seed), and a source's n-th draw in the
// epoch takes the n-th frame of the source's own permutation (a fresh permutation each time it runs out), so a
// source is sampled without replacement until it is exhausted.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pi0/data/dataset.h"
#include "pi0/data/transforms.h"
#include "pi0/model/observation.h"

namespace pi0::data {

struct LoaderOptions {
  int64_t batch_size = 32;   ///< per-rank (local) batch size; the global batch is batch_size · world_size
  int64_t num_workers = 2;   ///< background threads building batches; 0 = build in next() on the caller's thread
  int64_t prefetch = 4;      ///< batches built ahead of the consumer (bounded queue)
  uint64_t seed = 0;
  int64_t rank = 0;
  int64_t world_size = 1;
  bool drop_last = true;     ///< false: the last batch of an epoch wraps around to the epoch's first samples
  bool shuffle = true;
  bool augment = false;      ///< training augmentation (§7.4)
  /// Build batches in page-locked (pinned) host memory, so the trainer's host→GPU copies run asynchronously
  /// (non_blocking) while the GPU computes. Only with a CUDA LibTorch and a usable GPU.
  bool pin_memory = false;
};

/// One dataset of what the loader draws from: its samples, its transform (its own norm stats and dims), its share.
struct DataSource {
  std::string name;  ///< its asset id: messages, --dump-batches
  std::shared_ptr<const RobotDataset> dataset;
  std::shared_ptr<const SampleTransform> transform;
  double weight = 1.0;
  /// Dataset indices the loader may draw (the training split), ascending; empty = every frame.
  std::vector<int64_t> frames;

  int64_t size() const { return frames.empty() ? dataset->size() : static_cast<int64_t>(frames.size()); }
  /// Dataset index of the source's k-th drawable frame.
  int64_t index(int64_t k) const { return frames.empty() ? k : frames[static_cast<size_t>(k)]; }
};

/// One sample of a batch: which source, which dataset index in it.
struct SampleRef {
  int64_t source = 0;
  int64_t index = 0;
  bool operator==(const SampleRef& o) const { return source == o.source && index == o.index; }
};

/// The samples `refs` of `sources` through their transforms, stacked (augmented with the seeds when given, one per
/// sample).
model::Batch make_batch(const std::vector<DataSource>& sources, const std::vector<SampleRef>& refs,
                        const std::vector<std::optional<uint64_t>>& augment_seeds = {});

/// Where the loader is: the next batch next() returns. Save it with a checkpoint, pass it back to resume.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t batch_index = 0;
  bool operator==(const LoaderPosition& o) const { return epoch == o.epoch && batch_index == o.batch_index; }
};

class DataLoader {
 public:
  /// One or more sources (a mixture when several); UserError for none, a weight <= 0 or an empty source.
  DataLoader(std::vector<DataSource> sources, LoaderOptions options, LoaderPosition start = {});
  /// One dataset, every frame.
  DataLoader(std::shared_ptr<const RobotDataset> dataset, std::shared_ptr<const SampleTransform> transform,
             LoaderOptions options, LoaderPosition start = {});
  ~DataLoader();  ///< stops and joins the workers
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  /// The next batch; iterates forever across epochs. Rethrows a worker's exception.
  model::Batch next();
  /// Position of the batch the next call to next() returns.
  LoaderPosition position() const;
  /// Restarts from `pos` (drops prefetched batches).
  void seek(LoaderPosition pos);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  /// Samples per epoch: the sources' drawable frames together.
  int64_t epoch_size() const { return epoch_size_; }
  const std::vector<DataSource>& sources() const { return sources_; }
  /// The samples of the batch at `pos` for this rank (pure function).
  std::vector<SampleRef> batch_samples(LoaderPosition pos) const;
  /// Their dataset indices (each in its own source's dataset).
  std::vector<int64_t> batch_indices(LoaderPosition pos) const;
  /// The epoch's permutation of [0, n) from (seed, epoch): Fisher-Yates over SplitMix64, identical on every platform.
  static std::vector<int64_t> permutation(int64_t n, uint64_t seed, int64_t epoch);

 private:
  model::Batch build(int64_t global_batch) const;
  void start_workers();
  void stop_workers();
  void worker_loop();
  LoaderPosition to_position(int64_t global_batch) const;

  /// The epoch's order of samples (one source: a permutation of its frames; a mixture: the slots' draws).
  std::vector<SampleRef> epoch_order(int64_t epoch) const;

  std::vector<DataSource> sources_;
  LoaderOptions options_;
  int64_t epoch_size_ = 0;
  int64_t batches_per_epoch_ = 0;

  // Batches are numbered globally: g = epoch · batches_per_epoch + batch_index.
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  int64_t next_to_consume_ = 0;
  int64_t next_to_produce_ = 0;
  std::map<int64_t, model::Batch> ready_;
  std::map<int64_t, std::exception_ptr> errors_;
  bool stop_ = false;
  std::vector<std::thread> workers_;

  // Epoch order cache (one epoch at a time is enough: workers stay within prefetch of the consumer).
  mutable std::mutex perm_mutex_;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<SampleRef>>> orders_;
};

}  // namespace pi0::data
