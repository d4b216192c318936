// Prompt formats of openpi's PaligemmaTokenizer with the tiny SentencePiece model.
#include <catch2/catch.hpp>

#include "data_test_util.h"
#include "pi0/data/tokenizer.h"

using namespace pi0::data;

TEST_CASE("tiny tokenizer has the Gemma special ids and byte fallback", "[unit][data]") {
  auto tok = pi0::test::tiny_tokenizer();
  CHECK(tok->bos_id() == 2);
  CHECK(tok->vocab_size() < 1100);
  CHECK(tok->decode(tok->encode("pick up the black bowl")) == "pick up the black bowl");
  CHECK(tok->decode(tok->encode("Ünïcode ☃\n")) == "Ünïcode ☃\n");  // byte fallback
}

TEST_CASE("prompt cleaning and state discretization", "[unit][data]") {
  CHECK(Tokenizer::clean("  pick_up the\nbowl \n") == "pick up the bowl");
  CHECK(Tokenizer::discretize(-1.0) == 0);
  CHECK(Tokenizer::discretize(-1.0000001) == -1);  // not clipped (np.digitize semantics)
  CHECK(Tokenizer::discretize(-0.5) == 64);
  CHECK(Tokenizer::discretize(0.0) == 128);
  CHECK(Tokenizer::discretize(0.99) == 254);
  CHECK(Tokenizer::discretize(0.9921875) == 255);
  CHECK(Tokenizer::discretize(3.0) == 255);
  CHECK(Tokenizer::pi05_prompt("pick up", torch::tensor({-1.f, 0.f, 1.f})) == "Task: pick up, State: 0 128 255;\nAction: ");
}

TEST_CASE("pi0 prompt: BOS, cleaned text, separate newline, padding", "[unit][data]") {
  auto tok = pi0::test::tiny_tokenizer();
  TokenizedPrompt tp = tok->tokenize(" open_the drawer ", 48);
  std::vector<int> expected = tok->encode("open the drawer", true);
  std::vector<int> nl = tok->encode("\n");
  REQUIRE(nl.size() == 1);
  expected.push_back(nl[0]);
  const int64_t n = static_cast<int64_t>(expected.size());
  REQUIRE(tp.tokens.size(0) == 48);
  for (int64_t i = 0; i < n; ++i) CHECK(tp.tokens[i].item<int64_t>() == expected[static_cast<size_t>(i)]);
  CHECK(tp.tokens[0].item<int64_t>() == 2);
  CHECK(tp.mask.sum().item<int64_t>() == n);
  CHECK(tp.tokens.narrow(0, n, 48 - n).abs().sum().item<int64_t>() == 0);
  CHECK_FALSE(tp.mask[n].item<bool>());
}

TEST_CASE("pi0.5 prompt: Task/State/Action text with discretized state", "[unit][data]") {
  auto tok = pi0::test::tiny_tokenizer();
  torch::Tensor state = torch::tensor({-1.f, 0.f, 0.5f});
  TokenizedPrompt tp = tok->tokenize("reach the red blob", 200, state);
  std::vector<int> expected = tok->encode("Task: reach the red blob, State: 0 128 192;\nAction: ", true);
  const int64_t n = static_cast<int64_t>(expected.size());
  CHECK(tp.mask.sum().item<int64_t>() == n);
  for (int64_t i = 0; i < n; ++i) CHECK(tp.tokens[i].item<int64_t>() == expected[static_cast<size_t>(i)]);
}

TEST_CASE("long prompts are truncated with all-true mask", "[unit][data]") {
  auto tok = pi0::test::tiny_tokenizer();
  TokenizedPrompt tp = tok->tokenize("put the black bowl on the plate and then put the moka pot on the stove", 6);
  CHECK(tp.tokens.size(0) == 6);
  CHECK(tp.mask.all().item<bool>());
  CHECK(tp.tokens[0].item<int64_t>() == 2);
}
