// data::FastPromptTokenizer against openpi's own FASTTokenizer (tokenizer.py at 15a9616): the cases in
// tests/data/golden/pi0_fast/tokenize.json come from tests/data/pi0_fast_reference.py, run with the shared
// SentencePiece fixture (../shared/fixtures/openpi/tokenizer_spm.model) and the FAST tokenizer "a" of
// tests/data/golden/fast/. Tokens and masks exact; extracted actions within 1e-12 (both sides float64).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/log_line.h"
#include "pi0/data/fast_prompt.h"
#include "support/openpi_fixture.h"
#include "support/test_support.h"

using pi0::data::FastPromptTokenizer;
using json = nlohmann::json;

namespace {

std::string golden(const std::string& name) {
  return std::string(PI0_SOURCE_DIR) + "/tests/data/golden/pi0_fast/" + name;
}

std::vector<int64_t> to_vec(const torch::Tensor& t) {
  const auto l = t.to(torch::kLong).contiguous();
  return {l.data_ptr<int64_t>(), l.data_ptr<int64_t>() + l.numel()};
}

std::vector<int64_t> bools(const json& j) {
  std::vector<int64_t> out;
  for (const auto& b : j) out.push_back(b.is_boolean() ? int64_t{b.get<bool>()} : b.get<int64_t>());
  return out;
}

torch::Tensor f64(const std::vector<double>& v, std::vector<int64_t> shape) {
  return torch::tensor(v, torch::kFloat64).reshape(shape);
}

/// The shared SentencePiece fixture plus FAST tokenizer "a", or null (a visible skip) without the fixture.
std::unique_ptr<FastPromptTokenizer> reference_tokenizer(const json& file) {
  if (!pi0::testing::openpi_fixture_present("tokenizer_spm.model")) return nullptr;
  auto spm = std::make_shared<pi0::data::Tokenizer>(pi0::testing::openpi_fixtures_dir() + "/tokenizer_spm.model");
  REQUIRE(spm->vocab_size() == file["spm_vocab"].get<int64_t>());
  REQUIRE(spm->eos_id() == file["eos_id"].get<int>());
  auto fast = std::make_shared<pi0::data::FastTokenizer>(golden(file["fast_tokenizer"].get<std::string>()));
  return std::make_unique<FastPromptTokenizer>(spm, fast);
}

}  // namespace

TEST_CASE("pi0fast_tokenize_parity: openpi FASTTokenizer.tokenize tokens and masks on every golden case", "[fast][data]") {
  const json file = pi0::testing::read_json(golden("tokenize.json"));
  const auto tok = reference_tokenizer(file);
  if (!tok) return;
  const int64_t H = file["h"], D = file["d"];
  int n = 0, truncated = 0, without_actions = 0;
  for (const json& c : file["tokenize"]) {
    const std::string name = c["name"];
    const auto state = c["state"].get<std::vector<double>>();
    torch::Tensor actions;
    if (c.contains("actions")) actions = f64(c["actions"].get<std::vector<double>>(), {H, D});
    const int64_t max_len = c["max_len"];
    const auto ours = tok->tokenize(c["prompt"].get<std::string>(), f64(state, {static_cast<int64_t>(state.size())}),
                                    actions, max_len);
    INFO(name << ": ours " << ours.tokens << "\nopenpi " << c["tokens"].dump());
    CHECK(to_vec(ours.tokens) == c["tokens"].get<std::vector<int64_t>>());
    CHECK(to_vec(ours.mask) == bools(c["mask"]));
    CHECK(to_vec(ours.ar_mask) == bools(c["ar_mask"]));
    CHECK(to_vec(ours.loss_mask) == bools(c["loss_mask"]));
    if (c.contains("fast_ids")) {
      CHECK(ours.n_fast == static_cast<int64_t>(c["fast_ids"].size()));
    } else {
      ++without_actions;
      CHECK(ours.n_fast == 0);
      CHECK(ours.loss_mask.sum().item<int64_t>() == 0);
    }
    truncated += ours.n_tokens > max_len;
    ++n;
  }
  CHECK(n == 21);
  CHECK(truncated == 2);
  CHECK(without_actions == 1);
}

TEST_CASE("pi0fast_tokenize_parity: openpi FASTTokenizer.extract_actions on every golden row", "[fast][data]") {
  const json file = pi0::testing::read_json(golden("tokenize.json"));
  const auto tok = reference_tokenizer(file);
  if (!tok) return;
  const int64_t H = file["h"], D = file["d"];
  int n = 0, zeros = 0, lossy = 0;
  for (const json& c : file["extract"]) {
    const std::string name = c["name"];
    const auto ours = tok->extract_actions(c["tokens"].get<std::vector<int64_t>>(), H, D);
    const auto want = c["actions"].get<std::vector<double>>();
    INFO(name << ": text '" << c["text"].get<std::string>() << "' openpi fast ids "
              << (c.contains("fast_ids") ? c["fast_ids"].dump() : "(no marker)"));
    CHECK(ours.found_marker == c.contains("fast_ids"));
    if (c.contains("fast_ids")) CHECK(ours.fast_ids == c["fast_ids"].get<std::vector<int64_t>>());
    REQUIRE(ours.decoded.actions.size() == want.size());
    double max_diff = 0.0;
    for (size_t i = 0; i < want.size(); ++i)
      max_diff = std::max(max_diff, std::abs(ours.decoded.actions[i] - want[i]) / std::max(1.0, std::abs(want[i])));
    CHECK(max_diff <= 1e-12);
    const bool all_zero = std::all_of(want.begin(), want.end(), [](double x) { return x == 0.0; });
    CHECK(ours.decoded.decodable == (ours.found_marker && !all_zero));
    zeros += all_zero;
    lossy += name.rfind("decodable_lossy", 0) == 0;
    ++n;
  }
  CHECK(n == 29);
  CHECK(zeros == 16);  // the marker-less rows, the rows whose round trip leaves the FAST range, wrong lengths
  CHECK(lossy == 2);
}

TEST_CASE("fast prompt: Python lower and strip semantics", "[fast][data]") {
  CHECK(FastPromptTokenizer::clean("  Open_The_DRAWER\t ") == "open the drawer");
  CHECK(FastPromptTokenizer::clean("put\nit_down\n") == "put\nit down");  // '\n' inside stays (pi0.5 replaces it)
  CHECK(FastPromptTokenizer::strip("\xC2\xA0\xE3\x80\x80x y\xE2\x80\x83\xC2\x85") == "x y");  // U+00A0 U+3000 U+2003 U+0085
  CHECK(FastPromptTokenizer::strip("\x1C" "a\x1F") == "a");  // Python's isspace includes 0x1C..0x1F
  CHECK(FastPromptTokenizer::strip("\xE2\x80\x8B" "a") == "\xE2\x80\x8B" "a");  // U+200B is not whitespace
  CHECK(FastPromptTokenizer::lower("\xC4\xB0") == "i\xCC\x87");  // U+0130 -> i + combining dot
  // Final sigma: word-final capital sigma -> U+03C2, else U+03C3; a lone sigma stays U+03C3.
  CHECK(FastPromptTokenizer::lower("\xCE\x9F\xCE\xA3 \xCE\xA3") == "\xCE\xBF\xCF\x82 \xCF\x83");
  CHECK(FastPromptTokenizer::lower("\xCE\xA3\xCE\x9F") == "\xCF\x83\xCE\xBF");
  CHECK(FastPromptTokenizer::lower("\xC3\x89" "CLAIR \xC7\x85") == "\xC3\xA9" "clair \xC7\x86");
  CHECK(FastPromptTokenizer::lower("\xFF" "AB") == "\xFF" "ab");  // invalid UTF-8 passes through
}

TEST_CASE("fast prompt: truncation is warned once and counted", "[fast][data]") {
  const json file = pi0::testing::read_json(golden("tokenize.json"));
  const auto tok = reference_tokenizer(file);
  if (!tok) return;
  const std::string key = "fast prompt: truncated to max_token_len";
  const int64_t before = pi0::warn_once_count(key);
  const auto actions = torch::zeros({file["h"].get<int64_t>(), file["d"].get<int64_t>()}, torch::kFloat64);
  const auto t = tok->tokenize("pick", torch::zeros({2}), actions, 8);
  CHECK(t.n_tokens > 8);
  CHECK(t.mask.all().item<bool>());
  CHECK(pi0::warn_once_count(key) == before + 1);
  tok->tokenize("pick", torch::zeros({2}), actions, 200);
  CHECK(pi0::warn_once_count(key) == before + 1);
}

TEST_CASE("fast prompt: a FAST vocabulary too large for the SentencePiece model is refused", "[fast][data]") {
  if (!pi0::testing::openpi_fixture_present("tokenizer_spm.model")) return;
  auto spm = std::make_shared<pi0::data::Tokenizer>(pi0::testing::openpi_fixtures_dir() + "/tokenizer_spm.model");
  // Tokenizer "b" has vocab_size 1024; the 793-piece model has room for 665.
  auto fast = std::make_shared<pi0::data::FastTokenizer>(std::string(PI0_SOURCE_DIR) +
                                                          "/tests/data/golden/fast/tokenizer_b");
  try {
    FastPromptTokenizer bad(spm, fast);
    FAIL("accepted");
  } catch (const pi0::UserError& e) {
    CHECK(std::string(e.what()) ==
          std::string(PI0_SOURCE_DIR) +
              "/tests/data/golden/fast/tokenizer_b/processor_config.json: vocab_size is 1024, but the SentencePiece "
              "model has room for 665 FAST tokens (its vocabulary 793 less the 128 reserved tail tokens); use a FAST "
              "tokenizer with vocab_size <= 665 or PaliGemma's tokenizer");
  }
}

TEST_CASE("pi0fast prefix_only: a batch of training rows cut to what tokenize gives without actions", "[fast][data]") {
  auto spm = std::make_shared<pi0::data::Tokenizer>(std::string(PI0_SOURCE_DIR) + "/tests/data/tokenizer/tiny_spm_fast.model");
  auto fast = std::make_shared<pi0::data::FastTokenizer>(golden("../fast/tokenizer_a"));
  const FastPromptTokenizer tok(spm, fast);
  torch::manual_seed(3);
  std::vector<torch::Tensor> tokens, mask, loss, want_tokens, want_mask, want_ar;
  const std::vector<std::string> prompts = {"pick up the cube", "Open the DRAWER_now", "", "stack\tthe bowls please"};
  for (const auto& prompt : prompts) {
    const auto state = torch::rand({5}) * 2 - 1;
    const auto full = tok.tokenize(prompt, state, (torch::randn({6, 3}) * 0.3).cumsum(0).clamp(-1, 1), 96);
    const auto prefix = tok.tokenize(prompt, state, torch::Tensor(), 96);
    REQUIRE(full.n_fast > 0);
    tokens.push_back(full.tokens), mask.push_back(full.mask), loss.push_back(full.loss_mask);
    want_tokens.push_back(prefix.tokens), want_mask.push_back(prefix.mask), want_ar.push_back(prefix.ar_mask);
  }
  const auto cut = FastPromptTokenizer::prefix_only(torch::stack(tokens), torch::stack(mask), torch::stack(loss));
  CHECK(torch::equal(cut.tokens, torch::stack(want_tokens)));
  CHECK(torch::equal(cut.mask, torch::stack(want_mask)));
  CHECK(torch::equal(cut.ar_mask, torch::stack(want_ar)));
  CHECK(cut.mask.sum().item<int64_t>() < torch::stack(mask).sum().item<int64_t>());  // the postfixes are gone
}
