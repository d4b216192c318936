// data::FastTokenizer against HF `tokenizers` + scipy: the cases in tests/data/golden/fast/ come from
// tests/data/fast_reference.py (two tokenizers fitted as the FAST processor fits them; "a" saved with "a b" merges,
// "b" with ["a", "b"] pairs). Token ids exact; DCT and decoded actions within 1e-12 (relative above 1).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "data_test_util.h"
#include "pi0/common/check.h"
#include "pi0/data/fast_tokenizer.h"
#include "support/test_support.h"

using pi0::data::FastTokenizer;
using json = nlohmann::json;

namespace {

std::string golden(const std::string& name) { return std::string(PI0_SOURCE_DIR) + "/tests/data/golden/fast/" + name; }

void write(const std::string& path, const json& j) {
  std::ofstream out(path);
  out << j.dump();
}

bool within_1e12(double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); }

int64_t n_code_points(const std::string& s) { return static_cast<int64_t>(FastTokenizer::utf8_lossy_code_points(s).size()); }

/// Every case of cases_<name>.json: stages, ids, decode.
void check_cases(const std::string& name) {
  const json file = pi0::testing::read_json(golden("cases_" + name + ".json"));
  const FastTokenizer tok(golden(file["tokenizer"].get<std::string>()));
  const int64_t H = file["h"], D = file["d"];
  REQUIRE(tok.min_token() == file["min_token"].get<int64_t>());
  REQUIRE(tok.vocab_len() == file["vocab_len"].get<int64_t>());
  int n_encode = 0, n_undecodable = 0;
  for (const json& c : file["cases"]) {
    const std::string kind = c["kind"];
    INFO(name << " case " << kind << " ids " << c["ids"].dump());
    if (c.contains("actions")) {
      ++n_encode;
      const auto a = c["actions"].get<std::vector<double>>();
      if (c.contains("dct")) {
        const auto want = c["dct"].get<std::vector<double>>();
        const auto got = FastTokenizer::dct(a, H, D);
        for (size_t i = 0; i < want.size(); ++i) CHECK(within_1e12(got[i], want[i]));
      }
      const auto q = tok.quantize(a, H, D);
      CHECK(q == c["q"].get<std::vector<int64_t>>());
      const std::string s = tok.code_point_string(q);
      std::vector<int64_t> cps;
      for (char32_t cp : FastTokenizer::utf8_lossy_code_points(s)) cps.push_back(static_cast<int64_t>(cp));
      CHECK(cps == c["code_points"].get<std::vector<int64_t>>());
      std::vector<int64_t> splits;
      for (const std::string& piece : tok.pre_tokenize(s)) splits.push_back(n_code_points(piece));
      CHECK(splits == c["splits"].get<std::vector<int64_t>>());
      CHECK(tok.encode(a, H, D) == c["ids"].get<std::vector<int64_t>>());
    }
    // The configured dims (tokenizer "a") or explicit ones ("b", null in processor_config.json like the released one).
    const auto dec = tok.time_horizon() > 0 ? tok.decode(c["ids"].get<std::vector<int64_t>>())
                                            : tok.decode(c["ids"].get<std::vector<int64_t>>(), H, D);
    CHECK(dec.decodable == c["decodable"].get<bool>());
    CHECK(dec.n_code_points == c["n_code_points"].get<int64_t>());
    const auto want = c["decoded"].get<std::vector<double>>();
    REQUIRE(dec.actions.size() == want.size());
    for (size_t i = 0; i < want.size(); ++i) CHECK(within_1e12(dec.actions[i], want[i]));
    n_undecodable += dec.decodable ? 0 : 1;
  }
  CHECK(n_encode >= 110);
  CHECK(n_undecodable >= 20);
}

/// A copy of tokenizer "a" with `edit` applied to tokenizer.json / processor_config.json.
template <typename F>
std::string edited_copy(const pi0::test::TempDir& dir, F edit) {
  json tok = pi0::testing::read_json(golden("tokenizer_a/tokenizer.json"));
  json proc = pi0::testing::read_json(golden("tokenizer_a/processor_config.json"));
  edit(tok, proc);
  write(dir.file("tokenizer.json"), tok);
  write(dir.file("processor_config.json"), proc);
  return dir.str();
}

template <typename F>
std::string load_error(F edit) {
  pi0::test::TempDir dir;
  const std::string path = edited_copy(dir, edit);
  try {
    FastTokenizer tok(path);
  } catch (const pi0::UserError& e) {
    std::string msg = e.what();
    const size_t at = msg.find(path);
    CHECK(at == 0);
    CHECK(msg.find('\n') == std::string::npos);
    return msg.substr(path.size());  // without the temporary folder
  }
  FAIL("no error");
  return "";
}

}  // namespace

TEST_CASE("FAST DCT-II and DCT-III match scipy's orthonormal dct and idct", "[unit][data][fast]") {
  for (const json& c : pi0::testing::read_json(golden("dct.json"))) {
    const int64_t H = c["h"], D = c["d"];
    INFO("H " << H);
    const auto x = c["x"].get<std::vector<double>>();
    const auto dct = FastTokenizer::dct(x, H, D), idct = FastTokenizer::idct(x, H, D);
    const auto want_dct = c["dct"].get<std::vector<double>>(), want_idct = c["idct"].get<std::vector<double>>();
    for (size_t i = 0; i < x.size(); ++i) {
      CHECK(within_1e12(dct[i], want_dct[i]));
      CHECK(within_1e12(idct[i], want_idct[i]));
    }
    const auto back = FastTokenizer::idct(dct, H, D);
    for (size_t i = 0; i < x.size(); ++i) CHECK(within_1e12(back[i], x[i]));
  }
}

TEST_CASE("FAST tokenizer a (merges as strings) encodes and decodes as HF tokenizers and scipy", "[unit][data][fast]") {
  check_cases("a");
}

TEST_CASE("FAST tokenizer b (merges as pairs) encodes and decodes as HF tokenizers and scipy", "[unit][data][fast]") {
  check_cases("b");
}

TEST_CASE("FAST quantization rounds .5 ties to even", "[unit][data][fast]") {
  // H = 9: the DC coefficient of a constant 0.25 / 0.75 column is exactly 0.75 / 2.25; x 10 gives 7.5 and 22.5.
  const FastTokenizer tok(golden("tokenizer_a"));
  std::vector<double> a;
  for (int n = 0; n < 9; ++n) a.insert(a.end(), {0.25, 0.75, -0.25, -0.75});
  const auto q = tok.quantize(a, 9, 4);
  CHECK(std::vector<int64_t>(q.begin(), q.begin() + 4) == std::vector<int64_t>{8, 22, -8, -22});
  // The golden file holds the same tie chunk, so HF + scipy agree.
  bool found = false;
  const json cases = pi0::testing::read_json(golden("cases_a.json"));
  for (const json& c : cases["cases"])
    if (c["kind"] == "tie" && c["actions"].get<std::vector<double>>() == a) {
      found = true;
      CHECK(c["q"].get<std::vector<int64_t>>() == q);
    }
  CHECK(found);
}

TEST_CASE("FAST pre-tokenizer splits code points 0 to 4095 as HF's ByteLevel GPT-2 regex", "[unit][data][fast]") {
  const FastTokenizer tok(golden("tokenizer_a"));
  for (const json& c : pi0::testing::read_json(golden("pretokenizer_sweep.json"))) {
    std::string s;
    for (int64_t cp = c["first"]; cp <= c["last"].get<int64_t>(); ++cp) {
      s += c["context"].get<std::string>();
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else if (cp < 0x800) {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      } else {
        s += static_cast<char>(0xE0 | (cp >> 12));
        s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
    }
    std::vector<int64_t> splits;
    for (const std::string& piece : tok.pre_tokenize(s)) splits.push_back(n_code_points(piece));
    INFO("context " << c["context"].dump() << " code points " << c["first"] << ".." << c["last"]);
    CHECK(splits == c["splits"].get<std::vector<int64_t>>());
  }
}

TEST_CASE("FAST tokenizer reads both merges formats to the same ids", "[unit][data][fast]") {
  pi0::test::TempDir dir;
  const std::string path = edited_copy(dir, [](json& tok, json&) {
    json pairs = json::array();
    for (const json& m : tok["model"]["merges"]) {
      const std::string s = m;
      pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
    tok["model"]["merges"] = pairs;
  });
  const FastTokenizer strings(golden("tokenizer_a")), pairs(path);
  const json cases = pi0::testing::read_json(golden("cases_a.json"));
  for (const json& c : cases["cases"])
    if (c.contains("actions")) {
      const auto a = c["actions"].get<std::vector<double>>();
      CHECK(pairs.encode(a, 9, 4) == strings.encode(a, 9, 4));
    }
}

TEST_CASE("FAST encode of a tensor equals the float64 path", "[unit][data][fast]") {
  const FastTokenizer tok(golden("tokenizer_a"));
  const json c = pi0::testing::read_json(golden("cases_a.json"))["cases"][0];
  const auto a = c["actions"].get<std::vector<double>>();
  const torch::Tensor t = torch::tensor(a, torch::kFloat64).reshape({9, 4});
  CHECK(tok.encode(t) == c["ids"].get<std::vector<int64_t>>());
}

TEST_CASE("FAST tokenizer encodes and decodes from several threads at once", "[unit][data][fast]") {
  const FastTokenizer tok(golden("tokenizer_b"));
  const json cases = pi0::testing::read_json(golden("cases_b.json"));
  std::vector<std::vector<double>> chunks;
  std::vector<std::vector<int64_t>> want;
  for (const json& c : cases["cases"])
    if (c.contains("actions")) {
      chunks.push_back(c["actions"].get<std::vector<double>>());
      want.push_back(c["ids"].get<std::vector<int64_t>>());
    }
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t i = 0; i < chunks.size(); ++i) {
          const auto ids = tok.encode(chunks[i], 10, 7);
          mismatches[static_cast<size_t>(t)] += (ids != want[i]) + !tok.decode(ids, 10, 7).decodable;
        }
    });
  for (auto& th : threads) th.join();
  CHECK(mismatches == std::vector<int>(4, 0));
}

TEST_CASE("FAST lossy UTF-8 replaces each maximal invalid subpart once", "[unit][data][fast]") {
  auto cps = [](const std::string& s) { return FastTokenizer::utf8_lossy_code_points(s); };
  CHECK(cps("a\xC3\xA9") == std::vector<char32_t>{'a', 0xE9});
  CHECK(cps("\xE2\x82") == std::vector<char32_t>{0xFFFD});             // truncated 3-byte sequence: one
  CHECK(cps("\xE2\x82" "a") == std::vector<char32_t>{0xFFFD, 'a'});
  CHECK(cps("\x80\x80") == std::vector<char32_t>{0xFFFD, 0xFFFD});     // lone continuation bytes: one each
  CHECK(cps("\xC0\xAF") == std::vector<char32_t>{0xFFFD, 0xFFFD});     // overlong lead
  CHECK(cps("\xED\xA0\x80") == std::vector<char32_t>{0xFFFD, 0xFFFD, 0xFFFD});  // surrogate
  CHECK(cps("\xF0\x9F\x98") == std::vector<char32_t>{0xFFFD});
}

TEST_CASE("FAST tokenizer rejects what it does not support with one line naming file and field", "[unit][data][fast]") {
  CHECK(load_error([](json& t, json&) { t["normalizer"] = {{"type", "NFC"}}; }) ==
        "/tokenizer.json: normalizer is {\"type\":\"NFC\"}; FastTokenizer supports only null");
  CHECK(load_error([](json& t, json&) { t["pre_tokenizer"]["add_prefix_space"] = true; }) ==
        "/tokenizer.json: pre_tokenizer.add_prefix_space is true; FastTokenizer supports only false");
  CHECK(load_error([](json& t, json&) { t["pre_tokenizer"] = {{"type", "Metaspace"}}; }) ==
        "/tokenizer.json: pre_tokenizer is {\"type\":\"Metaspace\"}; FastTokenizer supports only {\"type\": "
        "\"ByteLevel\", \"add_prefix_space\": false}");
  CHECK(load_error([](json& t, json&) { t["model"]["type"] = "WordPiece"; }) ==
        "/tokenizer.json: model.type is \"WordPiece\"; FastTokenizer supports only \"BPE\"");
  CHECK(load_error([](json& t, json&) { t["model"]["unk_token"] = "<unk>"; }) ==
        "/tokenizer.json: model.unk_token is \"<unk>\"; FastTokenizer supports only null (unknown symbols are dropped, "
        "as upstream)");
  CHECK(load_error([](json& t, json&) { t["model"]["byte_fallback"] = true; }) ==
        "/tokenizer.json: model.byte_fallback is true; FastTokenizer supports only false");
  CHECK(load_error([](json& t, json&) { t["model"]["dropout"] = 0.1; }) ==
        "/tokenizer.json: model.dropout is 0.1; FastTokenizer supports only null");
  CHECK(load_error([](json& t, json&) { t["decoder"] = {{"type", "Metaspace"}}; }) ==
        "/tokenizer.json: decoder is {\"type\":\"Metaspace\"}; FastTokenizer supports only {\"type\": \"ByteLevel\"}");
  CHECK(load_error([](json& t, json&) { t["post_processor"] = {{"type", "TemplateProcessing"}}; }) ==
        "/tokenizer.json: post_processor is {\"type\":\"TemplateProcessing\"}; FastTokenizer supports only null or "
        "{\"type\": \"ByteLevel\"}");
  CHECK(load_error([](json& t, json&) { t["added_tokens"] = json::array({{{"id", 0}}}); }) ==
        "/tokenizer.json: added_tokens is [{\"id\":0}]; FastTokenizer supports only [] (FAST tokenizers have no "
        "special tokens)");
  CHECK(load_error([](json& t, json&) { t["model"]["merges"][0] = "a b c"; }) ==
        "/tokenizer.json: model.merges[0] is \"a b c\"; FastTokenizer supports only \"left right\" (one space) or "
        "[\"left\", \"right\"]");
  CHECK(load_error([](json& t, json&) { t["model"]["merges"][1] = json::array({"\xC4\x80", "zz"}); }) ==
        "/tokenizer.json: model.merges[1] [\"\xC4\x80\",\"zz\"] names a token missing from model.vocab; expected both "
        "parts and their concatenation in it");
  // vocab_size below the vocabulary: the first id at or past it is named (the order is the JSON object's).
  const std::string small = load_error([](json&, json& p) { p["vocab_size"] = 100; });
  CHECK(small.find("/tokenizer.json: model.vocab[") == 0);
  CHECK_THAT(small, Catch::Matches(R"(.*\] is 1\d\d; expected an id in \[0, 100\) \(processor_config.json )"
                                   R"(vocab_size\) for a non-empty token)"));
  CHECK(load_error([](json&, json& p) { p.erase("scale"); }) ==
        "/processor_config.json: scale is null; FastTokenizer supports only a number > 0 (the released tokenizer has 10)");
  CHECK(load_error([](json&, json& p) { p["min_token"] = -3.5; }) ==
        "/processor_config.json: min_token is -3.5; FastTokenizer supports only an integer (the released tokenizer "
        "has -354)");
  CHECK(load_error([](json&, json& p) { p["time_horizon"] = 0; }) ==
        "/processor_config.json: time_horizon is 0; FastTokenizer supports only null or an integer > 0");

  pi0::test::TempDir dir;
  const std::string path = edited_copy(dir, [](json&, json&) {});
  write(dir.file("tokenizer_config.json"), json{{"clean_up_tokenization_spaces", true}});
  CHECK_THROWS_WITH(FastTokenizer(path), path + "/tokenizer_config.json: clean_up_tokenization_spaces is true; "
                                                "FastTokenizer supports only false");
  CHECK_THROWS_WITH(FastTokenizer(dir.file("missing")),
                    dir.file("missing") + "/processor_config.json: cannot read (a FAST tokenizer folder holds "
                                          "tokenizer.json and processor_config.json)");
}

TEST_CASE("FAST encode and decode reject unusable input with one line", "[unit][data][fast]") {
  const FastTokenizer a(golden("tokenizer_a")), b(golden("tokenizer_b"));
  std::vector<double> x(36, 0.0);
  x[5] = std::numeric_limits<double>::quiet_NaN();
  CHECK_THROWS_WITH(a.encode(x, 9, 4), "FAST encode (" + golden("tokenizer_a") +
                                           "): an action value is nan; expected finite normalized actions");
  x[5] = 1e6;  // DCT token ~ 3.3e6 > U+10FFFF
  CHECK_THROWS_WITH(a.encode(x, 9, 4), Catch::Contains("gives code point") && Catch::Contains("not a Unicode scalar value"));
  CHECK_THROWS_WITH(a.encode(x, 4, 4), "FAST encode (" + golden("tokenizer_a") +
                                           "): an action chunk of 36 values is not H x D = 4 x 4");
  CHECK_THROWS_WITH(b.decode({1, 2, 3}), golden("tokenizer_b") +
                                             "/processor_config.json: time_horizon and action_dim are null; the FAST "
                                             "decode needs the chunk's H and D (pass them, or set them in "
                                             "processor_config.json)");
}

TEST_CASE("FAST ids map into PaliGemma's vocabulary as openpi's FASTTokenizer does", "[unit][data][fast]") {
  // openpi: pg(id) = vocab - 1 - 128 - id; LeRobot's pi0-FAST test expects FAST ids 2003 and 1434 at 255020 and 255589.
  CHECK(pi0::data::fast_to_paligemma(0, 257152) == 257023);
  CHECK(pi0::data::fast_to_paligemma(2003, 257152) == 255020);
  CHECK(pi0::data::fast_to_paligemma(1434, 257152) == 255589);
  CHECK(pi0::data::paligemma_to_fast(255020, 257152) == 2003);
  for (int64_t id : {0, 1, 1023, 1024, 2047, 3967})
    CHECK(pi0::data::paligemma_to_fast(pi0::data::fast_to_paligemma(id, 4096), 4096) == id);
  CHECK_THROWS_WITH(pi0::data::fast_to_paligemma(3968, 4096), Catch::Contains("expected 0..3967"));
  CHECK_THROWS_WITH(pi0::data::fast_to_paligemma(-1, 257152), Catch::Contains("FAST id -1"));
  CHECK_THROWS_WITH(pi0::data::paligemma_to_fast(257024, 257152), Catch::Contains("not a FAST token"));
}
