// Weighted mixtures of datasets in the loader and the validation split (data/loader.h, data/split.h): the drawn
// proportions, sampling without replacement within a source, determinism across workers, ranks and a resume, and
// held-out episodes that never reach a training batch.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <ostream>
#include <set>

#include "data_test_util.h"
#include "pi0/common/check.h"
#include "pi0/data/example_data.h"
#include "pi0/data/loader.h"
#include "pi0/data/split.h"

using namespace pi0::data;
using Catch::Contains;

namespace pi0::data {
// For Catch's messages (found by argument-dependent lookup).
std::ostream& operator<<(std::ostream& os, const SampleRef& r) { return os << "{" << r.source << ", " << r.index << "}"; }
}  // namespace pi0::data

namespace {

// A LIBERO source (8-d state, 7-d actions, two cameras) and an ALOHA one (14-d, three cameras): different dims and
// cameras in one batch, padded to action_dim 16.
struct Mixture {
  pi0::test::TempDir dir;
  std::vector<DataSource> sources;

  explicit Mixture(double libero_weight = 1.0, double aloha_weight = 3.0) {
    sources.push_back(make("libero", libero_weight, 3, 10));
    sources.push_back(make("aloha", aloha_weight, 2, 10));
  }
  DataSource make(const std::string& format, double weight, int64_t episodes, int64_t steps) {
    ExampleDataOptions eo;
    eo.episodes = episodes;
    eo.steps = steps;
    eo.image_size = 16;
    DatasetOptions o;
    o.format = format;
    o.paths = {format == "libero" ? write_example_libero(dir.file(format), eo) : write_example_aloha(dir.file(format), eo)};
    o.prompt = format == "aloha" ? "fold" : "";
    o.action_horizon = 4;
    DataSource s;
    s.name = format;
    s.weight = weight;
    s.dataset = std::make_shared<RobotDataset>(o);
    TransformOptions t;
    t.image_size = 28;
    t.action_dim = 16;
    t.max_token_len = 16;
    s.transform = std::make_shared<SampleTransform>(t, compute_norm_stats(*s.dataset), pi0::test::tiny_tokenizer());
    return s;
  }
};

LoaderOptions options(int64_t batch, int64_t workers = 0, int64_t rank = 0, int64_t world = 1) {
  LoaderOptions lo;
  lo.batch_size = batch;
  lo.num_workers = workers;
  lo.seed = 7;
  lo.rank = rank;
  lo.world_size = world;
  return lo;
}

}  // namespace

TEST_CASE("mixture: each sample comes from source i with probability w_i / sum w", "[unit][data]") {
  Mixture mx(1.0, 3.0);  // 30 LIBERO frames, 20 ALOHA frames: an epoch of 50 samples
  DataLoader loader(mx.sources, options(5));
  REQUIRE(loader.epoch_size() == 50);
  REQUIRE(loader.batches_per_epoch() == 10);
  // 60 epochs: 3000 independent draws with p = 0.25 for LIBERO. The counts are a fixed function of the seed; the
  // bound (4.5 standard deviations of the binomial, sqrt(3000 · 0.25 · 0.75) = 23.7) is what any seed must meet.
  int64_t libero = 0, draws = 0;
  for (int64_t epoch = 0; epoch < 60; ++epoch) {
    std::map<std::pair<int64_t, int64_t>, int64_t> per_frame;  // (source, index) -> draws this epoch
    std::vector<int64_t> per_source(2, 0);
    for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      for (const auto& r : loader.batch_samples({epoch, b})) {
        REQUIRE((r.source == 0 || r.source == 1));
        REQUIRE(r.index >= 0);
        REQUIRE(r.index < mx.sources[static_cast<size_t>(r.source)].size());
        ++per_frame[{r.source, r.index}];
        ++per_source[static_cast<size_t>(r.source)];
        libero += r.source == 0;
        ++draws;
      }
    }
    // Without replacement within a source: a source drawn c times in an epoch gives each of its n frames
    // floor(c / n) or ceil(c / n) draws.
    for (int64_t s = 0; s < 2; ++s) {
      const int64_t n = mx.sources[static_cast<size_t>(s)].size(), c = per_source[static_cast<size_t>(s)];
      for (int64_t i = 0; i < n; ++i) {
        const int64_t got = per_frame.count({s, i}) ? per_frame[{s, i}] : 0;
        CHECK(got >= c / n);
        CHECK(got <= (c + n - 1) / n);
      }
    }
  }
  REQUIRE(draws == 3000);
  const double sd = std::sqrt(3000 * 0.25 * 0.75);
  CHECK(std::abs(static_cast<double>(libero) - 750.0) < 4.5 * sd);
  // The other weighting gives the other share: the weights, not the sizes, decide.
  DataLoader even(Mixture(3.0, 1.0).sources, options(5));
  int64_t libero_even = 0;
  for (int64_t epoch = 0; epoch < 60; ++epoch)
    for (int64_t b = 0; b < even.batches_per_epoch(); ++b)
      for (const auto& r : even.batch_samples({epoch, b})) libero_even += r.source == 0;
  CHECK(std::abs(static_cast<double>(libero_even) - 2250.0) < 4.5 * sd);
}

TEST_CASE("mixture: batches are the same with any worker count, split over ranks and after a seek", "[unit][data]") {
  Mixture mx;
  DataLoader serial(mx.sources, options(4, 0)), threaded(mx.sources, options(4, 2));
  std::vector<pi0::model::Batch> first;
  for (int i = 0; i < 14; ++i) {  // past the first epoch (12 batches of 4)
    auto a = serial.next(), b = threaded.next();
    CHECK(torch::equal(a.actions, b.actions));
    CHECK(torch::equal(a.observation.state, b.observation.state));
    CHECK(torch::equal(a.observation.images[2], b.observation.images[2]));
    CHECK(torch::equal(a.action_dims, b.action_dims));
    first.push_back(a);
  }
  // A restored position gives exactly the batch that came next.
  DataLoader resumed(mx.sources, options(4, 1), {1, 1});
  CHECK(torch::equal(resumed.next().actions, first[13].actions));
  // Two ranks of batch 2 take the halves of one rank's batch 4.
  DataLoader r0(mx.sources, options(2, 0, 0, 2)), r1(mx.sources, options(2, 0, 1, 2));
  for (int64_t b = 0; b < 3; ++b) {
    auto whole = serial.batch_samples({0, b});
    auto a = r0.batch_samples({0, b}), c = r1.batch_samples({0, b});
    a.insert(a.end(), c.begin(), c.end());
    CHECK(a == whole);
  }
}

TEST_CASE("mixture: each sample goes through its own source's transform, dims and cameras", "[unit][data]") {
  Mixture mx;
  DataLoader loader(mx.sources, options(8));
  const auto refs = loader.batch_samples({0, 0});
  const auto batch = loader.next();
  bool seen[2] = {false, false};
  for (size_t b = 0; b < refs.size(); ++b) {
    const auto& src = mx.sources[static_cast<size_t>(refs[b].source)];
    seen[refs[b].source] = true;
    const auto expected = (*src.transform)(src.dataset->get(refs[b].index));
    INFO("sample " << b << " of " << src.name);
    CHECK(torch::equal(batch.actions[static_cast<int64_t>(b)], expected.actions));
    CHECK(torch::equal(batch.observation.state[static_cast<int64_t>(b)], expected.state));
    CHECK(batch.action_dims[static_cast<int64_t>(b)].item<int64_t>() == (src.name == "libero" ? 7 : 14));
    // LIBERO has no right wrist camera: masked, as openpi does for absent cameras.
    CHECK(batch.observation.image_masks[2][static_cast<int64_t>(b)].item<bool>() == (src.name == "aloha"));
  }
  CHECK((seen[0] && seen[1]));
}

TEST_CASE("mixture: refuses no sources, a weight <= 0 and a source with no frames", "[unit][data]") {
  Mixture mx;
  CHECK_THROWS_WITH(DataLoader(std::vector<DataSource>{}, options(2)), Contains("no dataset"));
  auto bad = mx.sources;
  bad[1].weight = 0;
  CHECK_THROWS_WITH(DataLoader(bad, options(2)), Contains("dataset 'aloha' has weight 0"));
}

TEST_CASE("held-out episodes: a seeded share or a list, sorted, never all", "[unit][data]") {
  const auto a = held_out_episodes(20, 0.1, {}, 42, 0, "data.dataset");
  REQUIRE(a.size() == 2);
  CHECK(a == held_out_episodes(20, 0.1, {}, 42, 0, "data.dataset"));  // a function of the seed and the entry
  CHECK(std::is_sorted(a.begin(), a.end()));
  CHECK(a != held_out_episodes(20, 0.1, {}, 42, 1, "data.datasets[1]"));
  CHECK(held_out_episodes(20, 0.0, {}, 42, 0, "k").empty());
  CHECK(held_out_episodes(5, 0.01, {}, 42, 0, "k").size() == 1);  // at least one when asked for
  CHECK(held_out_episodes(20, 0.5, {7, 3, 7}, 42, 0, "k") == std::vector<int64_t>{3, 7});  // the list wins
  CHECK_THROWS_WITH(held_out_episodes(5, 0, {5}, 42, 1, "data.datasets[1]"),
                    Contains("data.datasets[1].validation_episodes: episode 5 does not exist (expected 0..4"));
  CHECK_THROWS_WITH(held_out_episodes(1, 0.2, {}, 42, 0, "data.dataset"),
                    Contains("data.dataset: all 1 episodes would be held out"));
}

TEST_CASE("validation split: held-out frames never reach a training batch, the validation set is fixed",
          "[unit][data]") {
  Mixture mx;
  std::vector<std::vector<int64_t>> held(2);
  std::vector<std::set<int64_t>> held_episodes(2);
  for (size_t s = 0; s < 2; ++s) {
    const auto& ds = *mx.sources[s].dataset;
    const auto episodes = held_out_episodes(ds.num_episodes(), 0.34, {}, 7, static_cast<int64_t>(s), "k");
    REQUIRE(episodes.size() == 1);
    held_episodes[s].insert(episodes.begin(), episodes.end());
    mx.sources[s].frames = episode_frames(ds, episodes, false);
    held[s] = episode_frames(ds, episodes, true);
    CHECK(static_cast<int64_t>(mx.sources[s].frames.size() + held[s].size()) == ds.size());
    for (const int64_t i : held[s]) CHECK(held_episodes[s].count(ds.locate(i).first) == 1);
  }
  DataLoader loader(mx.sources, options(4));
  CHECK(loader.epoch_size() == 20 + 10);
  int64_t checked = 0;
  for (int64_t epoch = 0; epoch < 5; ++epoch) {
    for (int64_t b = 0; b < loader.batches_per_epoch(); ++b) {
      for (const auto& r : loader.batch_samples({epoch, b})) {
        const auto& ds = *mx.sources[static_cast<size_t>(r.source)].dataset;
        CHECK(held_episodes[static_cast<size_t>(r.source)].count(ds.locate(r.index).first) == 0);
        ++checked;
      }
    }
  }
  CHECK(checked == 5 * 7 * 4);
  // The validation samples: evenly spaced over every source's held-out frames, the same on every call.
  const auto all = validation_samples(held, 0);
  CHECK(all.size() == held[0].size() + held[1].size());
  const auto some = validation_samples(held, 5);
  REQUIRE(some.size() == 5);
  CHECK(some == validation_samples(held, 5));
  CHECK(some.front() == all.front());
  CHECK(some[1] == all[all.size() / 5]);
  CHECK(validation_samples(held, 1000).size() == all.size());
}
