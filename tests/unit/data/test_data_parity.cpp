// Parity of the input pipeline with openpi (../shared/fixtures/openpi): resize_with_pad byte for byte on seven
// image shapes (openpi_client.image_tools, PIL bilinear), and the prompt tokenizer (PaligemmaTokenizer.tokenize)
// id for id, mask for mask, on nine prompts in both the pi0 and the pi0.5 discrete-state format.
#include <catch2/catch.hpp>

#include "pi0/data/tokenizer.h"
#include "pi0/data/transforms.h"
#include "pi0/io/safetensors.h"
#include "support/openpi_fixture.h"

using namespace pi0;

TEST_CASE("openpi parity: resize_with_pad is byte-identical on every fixture image", "[parity][data]") {
  if (!testing::openpi_fixture_present("resize_with_pad.safetensors")) return;
  const auto t = io::read_safetensors(testing::openpi_fixtures_dir() + "/resize_with_pad.safetensors");
  int64_t images = 0;
  for (const auto& [key, input] : t) {
    if (key.rfind("input/", 0) != 0) continue;
    const std::string name = key.substr(6);
    const auto& expected = t.at("output/" + name);
    const auto ours = data::resize_with_pad(input, expected.size(0));
    INFO(name << ": input " << input.sizes() << ", max |diff| "
              << (ours.to(torch::kInt) - expected.to(torch::kInt)).abs().max().item<int>());
    REQUIRE(ours.sizes() == expected.sizes());
    CHECK(torch::equal(ours, expected));
    ++images;
  }
  CHECK(images == 7);
}

TEST_CASE("openpi parity: tokenizer ids and masks on every fixture case", "[parity][data]") {
  if (!testing::openpi_fixture_present("tokenizer_cases.safetensors")) return;
  const std::string dir = testing::openpi_fixtures_dir();
  const data::Tokenizer tok(dir + "/tokenizer_spm.model");
  const auto cases = testing::read_json(dir + "/tokenizer_cases.json");
  const auto t = io::read_safetensors(dir + "/tokenizer_cases.safetensors");
  for (const auto& c : cases) {
    const std::string p = "case" + std::to_string(c.at("case").get<int>()) + "/";
    const auto prompt = c.at("prompt").get<std::string>();
    const auto max_len = c.at("max_len").get<int64_t>();
    torch::Tensor state;
    if (c.at("format") == "pi05") state = t.at(p + "state");
    const auto ours = tok.tokenize(prompt, max_len, state);
    const auto tokens = t.at(p + "tokens").to(torch::kLong);
    const auto mask = t.at(p + "mask").to(torch::kBool);
    INFO(p << " '" << prompt << "' (" << c.at("format") << ", max_len " << max_len << "): ours " << ours.tokens
           << " openpi " << tokens);
    REQUIRE(ours.tokens.sizes() == tokens.sizes());
    CHECK(torch::equal(ours.tokens, tokens));
    CHECK(torch::equal(ours.mask, mask));
  }
  CHECK(cases.size() == 9);
}
