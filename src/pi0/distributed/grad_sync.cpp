#include "pi0/distributed/grad_sync.h"

#include <cstdio>

#include "pi0/common/check.h"
#include "pi0/distributed/sharded_grad_reducer.h"

namespace pi0::distributed {

int64_t GradSync::held_grad_bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, p] : trainable_)
    if (p.grad().defined()) bytes += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  return bytes;
}

void GradSync::clear() {
  for (auto& [name, p] : trainable_)
    if (p.grad().defined()) p.mutable_grad() = torch::Tensor();
}

namespace {

// One process: the gradients are the ones backward accumulated.
class LocalGradSync : public GradSync {
 public:
  explicit LocalGradSync(NamedTensors trainable) : GradSync(std::move(trainable)) {}
  const NamedTensors& updated() const override { return trainable_; }
  std::vector<torch::Tensor> gradients() override {
    std::vector<torch::Tensor> grads;
    for (const auto& [name, p] : trainable_) grads.push_back(p.grad());
    return grads;
  }
};

// dist.shard=none (DDP) and, with `sharded`, dist.shard=optimizer (ZeRO-1): the whole gradient is all-reduced,
// on the last micro-step only, overlapped with its backward.
class AllReduceGradSync : public GradSync {
 public:
  AllReduceGradSync(std::shared_ptr<ProcessGroup> pg, NamedTensors trainable, int64_t bucket_bytes, bool sharded)
      : GradSync(std::move(trainable)), pg_(std::move(pg)), bucket_bytes_(bucket_bytes) {
    if (sharded) shards_ = std::make_unique<ParameterShards>(*pg_, trainable_);
    reducer_ = std::make_unique<GradReducer>(*pg_, trainable_, bucket_bytes);
  }
  const NamedTensors& updated() const override { return shards_ ? shards_->owned_views() : trainable_; }
  const ParameterShards* shards() const override { return shards_.get(); }
  void before_backward(int64_t micro, int64_t n) override { reducer_->enable_sync(micro + 1 == n); }
  std::vector<torch::Tensor> gradients() override {
    reducer_->wait();  // gradients are now the mean over ranks, identical everywhere
    if (shards_) return shards_->owned_grad_views();
    std::vector<torch::Tensor> grads;
    for (const auto& [name, p] : trainable_) grads.push_back(p.grad());
    return grads;
  }
  std::function<double(double)> norm_sum_over_ranks() const override {
    if (!shards_) return {};
    // Each rank holds a disjoint part of the gradient: the squared norms add up across ranks.
    return [pg = pg_](double local) {
      auto x = torch::tensor({local}, torch::kFloat64);
      pg->all_reduce_sum(x, "gradient norm");
      return x.item<double>();
    };
  }
  void after_update() override {
    if (shards_) shards_->broadcast_updates(bucket_bytes_, 2 * bucket_bytes_);
  }
  const GradReducerStats* stats() const override { return &reducer_->stats(); }
  std::string describe() const override {
    char line[160];
    std::snprintf(line, sizeof line, "data parallel: %ld ranks, %ld gradient buckets of <= %ld MB, backend %s",
                  static_cast<long>(pg_->world_size()), static_cast<long>(reducer_->num_buckets()),
                  static_cast<long>(bucket_bytes_ >> 20), pg_->backend_name().c_str());
    return line;
  }

 private:
  std::shared_ptr<ProcessGroup> pg_;
  int64_t bucket_bytes_;
  std::unique_ptr<ParameterShards> shards_;  ///< ZeRO-1 only
  std::unique_ptr<GradReducer> reducer_;
};

// dist.shard=gradients (ZeRO-2): every micro-step's gradients are reduced to their owners and freed elsewhere.
class ShardedGradSync : public GradSync {
 public:
  ShardedGradSync(std::shared_ptr<ProcessGroup> pg, NamedTensors trainable, int64_t bucket_bytes)
      : GradSync(std::move(trainable)), pg_(std::move(pg)), bucket_bytes_(bucket_bytes) {
    shards_ = std::make_unique<ParameterShards>(*pg_, trainable_);
    reducer_ = std::make_unique<ShardedGradReducer>(*pg_, trainable_, shards_->layout(), bucket_bytes,
                                                    2 * bucket_bytes);
  }
  const NamedTensors& updated() const override { return shards_->owned_views(); }
  const ParameterShards* shards() const override { return shards_.get(); }
  void after_backward(int64_t, int64_t) override { reducer_->wait(); }  // owners accumulate, the rest is freed
  std::vector<torch::Tensor> gradients() override { return reducer_->finish_step(); }
  int64_t held_grad_bytes() const override { return reducer_->held_bytes(); }
  std::function<double(double)> norm_sum_over_ranks() const override {
    return [pg = pg_](double local) {
      auto x = torch::tensor({local}, torch::kFloat64);
      pg->all_reduce_sum(x, "gradient norm");
      return x.item<double>();
    };
  }
  void after_update() override { shards_->broadcast_updates(bucket_bytes_, 2 * bucket_bytes_); }
  void clear() override {
    GradSync::clear();
    reducer_->clear();
  }
  const GradReducerStats* stats() const override { return &reducer_->stats(); }
  std::string describe() const override {
    char line[160];
    std::snprintf(line, sizeof line,
                  "data parallel: %ld ranks, gradients reduced to their owners (at most %ld MB in flight), backend %s",
                  static_cast<long>(pg_->world_size()), static_cast<long>(2 * (bucket_bytes_ >> 20)),
                  pg_->backend_name().c_str());
    return line;
  }

 private:
  std::shared_ptr<ProcessGroup> pg_;
  int64_t bucket_bytes_;
  std::unique_ptr<ParameterShards> shards_;
  std::unique_ptr<ShardedGradReducer> reducer_;
};

}  // namespace

std::unique_ptr<GradSync> make_grad_sync(ShardMode mode, std::shared_ptr<ProcessGroup> pg, NamedTensors trainable,
                                         int64_t bucket_bytes) {
  if (!pg) return std::make_unique<LocalGradSync>(std::move(trainable));
  switch (mode) {
    case ShardMode::kNone:
      return std::make_unique<AllReduceGradSync>(std::move(pg), std::move(trainable), bucket_bytes, false);
    case ShardMode::kOptimizer:
      return std::make_unique<AllReduceGradSync>(std::move(pg), std::move(trainable), bucket_bytes, true);
    case ShardMode::kGradients:
      return std::make_unique<ShardedGradSync>(std::move(pg), std::move(trainable), bucket_bytes);
  }
  PI0_CHECK(false, "make_grad_sync: unknown shard mode");
  return nullptr;
}

}  // namespace pi0::distributed
