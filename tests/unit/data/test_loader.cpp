// Loader: determinism, resume, rank sharding, epochs, batch contents.
#include <catch2/catch.hpp>

#include <set>

#include "data_test_util.h"
#include "pi0/data/example_data.h"
#include "pi0/data/loader.h"

using namespace pi0::data;

namespace {

struct Fixture {
  pi0::test::TempDir dir;
  std::shared_ptr<RobotDataset> dataset;
  std::shared_ptr<SampleTransform> transform;
  Fixture(int64_t episodes = 3, int64_t steps = 10) {
    ExampleDataOptions eo;
    eo.episodes = episodes;
    eo.steps = steps;
    eo.image_size = 16;
    DatasetOptions o;
    o.paths = {write_example_libero(dir.str(), eo)};
    o.action_horizon = 4;
    dataset = std::make_shared<RobotDataset>(o);
    TransformOptions t;
    t.image_size = 32;
    t.action_dim = 10;
    t.max_token_len = 16;
    transform = std::make_shared<SampleTransform>(t, compute_norm_stats(*dataset), pi0::test::tiny_tokenizer());
  }
};

bool same(const pi0::model::Batch& a, const pi0::model::Batch& b) {
  bool eq = torch::equal(a.actions, b.actions) && torch::equal(a.observation.state, b.observation.state) &&
            torch::equal(a.observation.tokenized_prompt, b.observation.tokenized_prompt);
  for (size_t c = 0; c < a.observation.images.size(); ++c)
    eq = eq && torch::equal(a.observation.images[c], b.observation.images[c]) &&
         torch::equal(a.observation.image_masks[c], b.observation.image_masks[c]);
  return eq;
}

}  // namespace

TEST_CASE("batches have the Observation contract's shapes", "[unit][data]") {
  Fixture fx;
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.num_workers = 2;
  DataLoader loader(fx.dataset, fx.transform, lo);
  pi0::model::Batch b = loader.next();
  REQUIRE(b.observation.images.size() == 3);
  CHECK(b.observation.images[0].sizes() == torch::IntArrayRef({4, 3, 32, 32}));
  CHECK(b.observation.images[0].scalar_type() == torch::kFloat32);
  CHECK(b.observation.image_masks[0].all().item<bool>());
  CHECK_FALSE(b.observation.image_masks[2].any().item<bool>());
  CHECK(b.observation.images[2].eq(-1).all().item<bool>());
  CHECK(b.observation.state.sizes() == torch::IntArrayRef({4, 10}));
  CHECK(b.observation.state.narrow(1, 8, 2).abs().sum().item<float>() == 0.f);  // zero padded
  CHECK(b.observation.tokenized_prompt.sizes() == torch::IntArrayRef({4, 16}));
  CHECK(b.observation.tokenized_prompt.scalar_type() == torch::kLong);
  CHECK(b.observation.tokenized_prompt_mask.scalar_type() == torch::kBool);
  CHECK(b.actions.sizes() == torch::IntArrayRef({4, 4, 10}));
  CHECK(b.observation.images[0].min().item<float>() >= -1.f);
  CHECK(b.observation.images[0].max().item<float>() <= 1.f);
}

TEST_CASE("same batches for any number of workers, with augmentation", "[unit][data]") {
  Fixture fx;
  LoaderOptions lo;
  lo.batch_size = 3;
  lo.augment = true;
  lo.seed = 42;
  lo.num_workers = 0;
  DataLoader l0(fx.dataset, fx.transform, lo);
  lo.num_workers = 2;
  lo.prefetch = 3;
  DataLoader l2(fx.dataset, fx.transform, lo);
  for (int i = 0; i < 12; ++i) CHECK(same(l0.next(), l2.next()));  // 12 > one epoch of 10 batches
  CHECK(l0.position() == LoaderPosition{1, 2});
}

TEST_CASE("restoring a LoaderPosition yields exactly the next batch", "[unit][data]") {
  Fixture fx;
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.num_workers = 2;
  lo.augment = true;
  lo.seed = 7;
  DataLoader a(fx.dataset, fx.transform, lo);
  const int64_t per_epoch = a.batches_per_epoch();
  CHECK(per_epoch == 30 / 4);
  for (int i = 0; i < per_epoch + 2; ++i) a.next();
  LoaderPosition saved = a.position();
  CHECK(saved == LoaderPosition{1, 2});
  pi0::model::Batch expected = a.next();
  pi0::model::Batch expected2 = a.next();

  DataLoader b(fx.dataset, fx.transform, lo, saved);
  CHECK(same(b.next(), expected));
  CHECK(same(b.next(), expected2));
  b.seek(saved);
  CHECK(same(b.next(), expected));
}

TEST_CASE("shuffling: a permutation per epoch, from the seed", "[unit][data]") {
  auto p0 = DataLoader::permutation(100, 1, 0);
  auto p1 = DataLoader::permutation(100, 1, 1);
  CHECK(p0 == DataLoader::permutation(100, 1, 0));
  CHECK(p0 != p1);
  CHECK(p0 != DataLoader::permutation(100, 2, 0));
  CHECK(std::set<int64_t>(p0.begin(), p0.end()).size() == 100);
}

TEST_CASE("rank sharding is disjoint and covers the epoch with drop_last", "[unit][data]") {
  Fixture fx(4, 10);  // 40 samples
  const int64_t world = 3, bs = 4;  // 12 per global batch -> 3 batches, 36 samples, 4 dropped
  std::set<int64_t> seen;
  int64_t count = 0;
  for (int64_t r = 0; r < world; ++r) {
    LoaderOptions lo;
    lo.batch_size = bs;
    lo.world_size = world;
    lo.rank = r;
    lo.num_workers = 0;
    lo.seed = 3;
    DataLoader l(fx.dataset, fx.transform, lo);
    REQUIRE(l.batches_per_epoch() == 3);
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t idx : l.batch_indices({0, b})) {
        seen.insert(idx);
        ++count;
      }
  }
  CHECK(count == 36);
  CHECK(seen.size() == 36);  // disjoint
  auto perm = DataLoader::permutation(40, 3, 0);
  CHECK(seen == std::set<int64_t>(perm.begin(), perm.begin() + 36));  // covering: all but the dropped tail
}

TEST_CASE("without shuffle and drop_last the order is sequential and wraps", "[unit][data]") {
  Fixture fx(1, 10);
  LoaderOptions lo;
  lo.batch_size = 4;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.num_workers = 1;
  DataLoader l(fx.dataset, fx.transform, lo);
  CHECK(l.batches_per_epoch() == 3);
  CHECK(l.batch_indices({0, 0}) == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(l.batch_indices({0, 2}) == std::vector<int64_t>{8, 9, 0, 1});
}
