// fast_undecodable's counting (train/fast_decoding.h): teacher-forced predictions that equal their targets are
// undecodable exactly where FAST itself cannot round-trip the chunk; a prediction that breaks the sequence makes its
// example undecodable; positions that are not targets, and ids past the SentencePiece vocabulary, do not count.
// Over tests/data/tokenizer/tiny_spm_fast.model (pi0-FAST's text round trip is exact there) and the 256-id FAST
// tokenizer "a" of tests/data/golden/fast.
#include <catch2/catch.hpp>

#include <memory>
#include <vector>

#include "pi0/data/fast_prompt.h"
#include "pi0/train/fast_decoding.h"

using pi0::data::FastPromptTokenizer;

namespace {

constexpr int64_t kH = 8, kD = 4, kPadded = 6, kB = 12;

struct Fixture {
  std::shared_ptr<const pi0::data::Tokenizer> spm = std::make_shared<const pi0::data::Tokenizer>(
      std::string(PI0_SOURCE_DIR) + "/tests/data/tokenizer/tiny_spm_fast.model");
  std::shared_ptr<const pi0::data::FastTokenizer> fast = std::make_shared<const pi0::data::FastTokenizer>(
      std::string(PI0_SOURCE_DIR) + "/tests/data/golden/fast/tokenizer_a");
  FastPromptTokenizer reader{spm, fast};
  std::vector<torch::Tensor> chunks;  // [H, D] normalized, float64
  int64_t fast_undecodable = 0;       // chunks FAST's own decode of their encoding rejects

  Fixture() {
    torch::manual_seed(11);
    for (int64_t b = 0; b < kB; ++b) {
      // Smooth chunks in [-1, 1], as normalized robot actions are, and every third one far outside: coefficients
      // whose code points need bytes the 256 ids of tokenizer "a" (fitted on [-1, 1] data) may not hold.
      auto a = (torch::randn({kH, kD}, torch::kFloat64) * 0.2).cumsum(0).clamp(-1, 1);
      if (b % 3 == 2) a = a * 6;
      chunks.push_back(a);
      if (!fast->decode(fast->encode(a), kH, kD).decodable) ++fast_undecodable;
    }
  }

  pi0::model::Batch batch() const {
    pi0::model::Batch b;
    b.actions = torch::zeros({kB, kH, kPadded});
    for (int64_t i = 0; i < kB; ++i) b.actions[i].narrow(1, 0, kD).copy_(chunks[static_cast<size_t>(i)]);
    b.action_dims = torch::full({kB}, kD, torch::kLong);
    return b;
  }
};

}  // namespace

TEST_CASE("fast_undecodable pi0_fast: predictions equal to the targets fail where FAST itself does", "[unit][train][fast]") {
  Fixture fx;
  auto batch = fx.batch();
  std::vector<pi0::data::FastTokenized> rows;
  const auto state = torch::zeros({kD});
  int64_t len = 0;
  for (const auto& a : fx.chunks) {
    rows.push_back(fx.reader.tokenize("pick up the cube", state, a, 160));
    REQUIRE(rows.back().n_tokens <= 160);
    len = rows.back().tokens.size(0);
  }
  // Pi0FastImpl::Loss::predicted's layout: entry j predicts token j + 1, -1 where that is not a loss target.
  auto predicted = torch::full({kB, len - 1}, -1, torch::kLong);
  for (int64_t b = 0; b < kB; ++b) {
    const auto& r = rows[static_cast<size_t>(b)];
    const auto at = r.loss_mask.narrow(0, 1, len - 1);
    predicted[b].masked_scatter_(at, r.tokens.narrow(0, 1, len - 1).masked_select(at));
  }
  auto counted = pi0::train::count_undecodable_fast(fx.reader, predicted, batch);
  CHECK(counted.sequences == kB);
  CHECK(counted.undecodable == fx.fast_undecodable);
  INFO("chunks FAST cannot round-trip: " << fx.fast_undecodable);
  CHECK(fx.fast_undecodable > 0);  // the fixture has chunks of both kinds
  CHECK(fx.fast_undecodable < kB);

  SECTION("an id past the SentencePiece vocabulary has no text and is left out") {
    for (int64_t b = 0; b < kB; ++b) {
      // The prediction of the row's last target (EOS) replaced: the round trip reads up to "|" and never sees it.
      const auto idx = (predicted[b] >= 0).nonzero().max().item<int64_t>();
      predicted[b][idx] = fx.spm->vocab_size() + 3;
    }
    counted = pi0::train::count_undecodable_fast(fx.reader, predicted, batch);
    CHECK(counted.undecodable == fx.fast_undecodable);
  }
  SECTION("a \"|\" predicted in place of the first FAST id ends the actions before they start") {
    const int64_t bar = fx.spm->encode("|").front();
    const int64_t marker = static_cast<int64_t>(fx.spm->encode("Action: ").size());
    for (int64_t b = 0; b < kB; ++b) {
      const auto first = (predicted[b] >= 0).nonzero().min().item<int64_t>();
      predicted[b][first + marker] = bar;
    }
    counted = pi0::train::count_undecodable_fast(fx.reader, predicted, batch);
    CHECK(counted.undecodable == kB);
  }
  SECTION("rows without targets are not sequences") {
    predicted.narrow(0, 0, 3).fill_(-1);
    counted = pi0::train::count_undecodable_fast(fx.reader, predicted, batch);
    CHECK(counted.sequences == kB - 3);
  }
}

TEST_CASE("fast_undecodable train.ki: the FAST ids of each block are decoded, not its closing tokens", "[unit][train][fast]") {
  Fixture fx;
  auto batch = fx.batch();
  const int64_t vocab = fx.spm->vocab_size(), f = 48;
  // train.ki's block as data::SampleTransform writes it: pg(FAST ids) + "|" + EOS, right-padded; the last example's
  // truncated to 5 tokens (its end lost).
  batch.fast_tokens = torch::zeros({kB, f}, torch::kLong);
  batch.fast_mask = torch::zeros({kB, f}, torch::kBool);
  std::vector<int64_t> n_fast;
  for (int64_t b = 0; b < kB; ++b) {
    std::vector<int64_t> block;
    for (const int64_t id : fx.fast->encode(fx.chunks[static_cast<size_t>(b)])) block.push_back(pi0::data::fast_to_paligemma(id, vocab));
    n_fast.push_back(static_cast<int64_t>(block.size()));
    for (const int id : fx.spm->encode("|")) block.push_back(id);
    block.push_back(fx.spm->eos_id());
    if (b == kB - 1) block.resize(5), n_fast.back() = 5;
    REQUIRE(static_cast<int64_t>(block.size()) <= f);
    for (size_t i = 0; i < block.size(); ++i) {
      batch.fast_tokens[b][static_cast<int64_t>(i)] = block[i];
      batch.fast_mask[b][static_cast<int64_t>(i)] = true;
    }
  }
  // KiLoss::predicted's layout: the argmax at each valid block target, -1 elsewhere. Here: the targets themselves,
  // but "|" and EOS predicted wrongly (they are not FAST ids and must not be read as such).
  auto predicted = torch::where(batch.fast_mask, batch.fast_tokens, torch::full({1}, -1, torch::kLong));
  for (int64_t b = 0; b + 1 < kB; ++b) predicted[b].narrow(0, n_fast[static_cast<size_t>(b)], 2).fill_(vocab - 200);
  const auto truncated = fx.reader.decode_paligemma(
      std::vector<int64_t>(batch.fast_tokens[kB - 1].data_ptr<int64_t>(), batch.fast_tokens[kB - 1].data_ptr<int64_t>() + 5),
      kH, kD);
  auto counted = pi0::train::count_undecodable_ki(fx.reader, predicted, batch);
  CHECK(counted.sequences == kB);
  CHECK(counted.undecodable == fx.fast_undecodable + (truncated.decodable ? 0 : 1) -
                                   (fx.fast->decode(fx.fast->encode(fx.chunks.back()), kH, kD).decodable ? 0 : 1));
  CHECK_FALSE(truncated.decodable);  // 5 tokens hold fewer than H * D = 32 coefficients

  SECTION("a first FAST id predicted as a token outside FAST's range makes every example undecodable") {
    // spm vocab - 1 is the last reserved tail token: mapped back through pg it is a negative FAST id.
    predicted.select(1, 0).fill_(vocab - 1);
    counted = pi0::train::count_undecodable_ki(fx.reader, predicted, batch);
    CHECK(counted.undecodable == kB);
  }
  SECTION("predictions must match the block's width") {
    CHECK_THROWS(pi0::train::count_undecodable_ki(fx.reader, predicted.narrow(1, 0, f - 1), batch));
  }
}
