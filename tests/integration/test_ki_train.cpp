// Knowledge insulation in the trainer (train.ki, docs/ki.md): the FAST block in the batches, the loss parts in
// metrics.jsonl, bit-exact resume, the config errors that need the tokenizer folder, and a learning smoke run of the
// tiny pi0.5 on the generated example data (acceptance tests A16 partly and A18 of ../shared/docs/pi05-ki-fast.md).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/metrics.h"
#include "pi0/train/sample_dump.h"
#include "pi0/train/trainer.h"
#include "support/log_capture.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::kTestFastTokenizer;
using pi0::testing::metrics_column;
using pi0::testing::TinyRun;

namespace {

// tests/data/golden/fast/tokenizer_a: a FAST tokenizer fitted by tests/data/fast_reference.py (vocab 256, which fits
// below the tiny SentencePiece model's ~790 tokens as openpi's map needs).
std::vector<std::string> ki_on(const std::vector<std::string>& more = {}) {
  return testing::with({"train.ki.enabled=true", "train.ki.fast_tokenizer=" + kTestFastTokenizer,
                        "train.ki.max_fast_tokens=48"},
                       more);
}

}  // namespace

TEST_CASE("train.ki: batches carry the FAST block of the robot's own action dims", "[integration][train][ki]") {
  TinyRun run;
  const auto cfg = run.config("run", ki_on());
  auto pipe = train::make_data_pipeline(cfg, 4, 0, 1);
  const auto batch = pipe.loader->next();
  REQUIRE(batch.fast_tokens.defined());
  CHECK(batch.fast_tokens.sizes() == torch::IntArrayRef({4, 48}));
  CHECK(batch.fast_mask.sizes() == torch::IntArrayRef({4, 48}));
  // Each row: pg(FAST ids of the normalized [H, 7] chunk) + spm("|") + EOS, then zero padding.
  const data::Tokenizer spm(cfg.data.tokenizer);
  const data::FastTokenizer fast(kTestFastTokenizer);
  const auto bar = spm.encode("|");
  for (int64_t b = 0; b < 4; ++b) {
    INFO("example " << b);
    const int64_t n = batch.fast_mask[b].sum().item<int64_t>();
    REQUIRE(n >= 3);
    CHECK(batch.fast_mask[b].narrow(0, 0, n).all().item<bool>());
    CHECK(batch.fast_tokens[b].narrow(0, n, 48 - n).abs().sum().item<int64_t>() == 0);
    CHECK(batch.fast_tokens[b][n - 1].item<int64_t>() == spm.eos_id());
    CHECK(batch.fast_tokens[b][n - 2].item<int64_t>() == bar.back());
    const auto ids = batch.fast_tokens[b].narrow(0, 0, n - 1 - static_cast<int64_t>(bar.size()));
    const auto dims = batch.action_dims[b].item<int64_t>();
    CHECK(dims == 7);
    const auto expected = fast.encode(batch.actions[b].narrow(1, 0, dims));
    REQUIRE(static_cast<int64_t>(expected.size()) == ids.size(0));
    for (int64_t j = 0; j < ids.size(0); ++j)
      CHECK(ids[j].item<int64_t>() == data::fast_to_paligemma(expected[static_cast<size_t>(j)], spm.vocab_size()));
  }
  // Off: no FAST block.
  auto off = train::make_data_pipeline(run.config("off"), 4, 0, 1);
  CHECK_FALSE(off.loader->next().fast_tokens.defined());
}

TEST_CASE("train.ki: --dump-batches shows the FAST block and the actions it decodes to", "[integration][train][ki]") {
  TinyRun run;
  const auto dir = run.dir.str("dump");
  REQUIRE(train::dump_samples(run.config("run", ki_on()), 2, dir) == 2);
  for (const char* sample : {"sample_000", "sample_001"}) {
    INFO(sample);
    const auto j = nlohmann::json::parse(std::ifstream(dir + "/" + sample + "/sample.json"));
    REQUIRE(j.contains("fast_tokens"));
    CHECK(j.at("fast_tokens").size() == j.at("fast_ids").size() + 2);  // "|" and EOS close the block
    CHECK_FALSE(j.at("fast_truncated").get<bool>());
    CHECK(j.at("fast_decodable").get<bool>());
    // FAST is lossy by design (scale 10: coefficients rounded to 0.1): the decoded chunk is near the robot's 7 dims.
    CHECK(testing::fast_chunk_error(j, 7) < 0.15);
  }
}

TEST_CASE("train.ki: a block longer than max_fast_tokens is truncated, counted and warned once",
          "[integration][train][ki]") {
  TinyRun run;
  testing::LogCapture log;
  auto pipe = train::make_data_pipeline(run.config("run", ki_on({"train.ki.max_fast_tokens=3"})), 4, 0, 1);
  const auto batch = pipe.loader->next();
  CHECK(batch.fast_mask.all().item<bool>());  // every block longer than 3: cut to 3, its EOS lost
  CHECK(pipe.sources[0].transform->fast_truncations() >= 4);
  const auto text = log.text();
  CHECK_THAT(text, Contains("longer than train.ki.max_fast_tokens (3) and is truncated"));
  CHECK(text.find("longer than train.ki.max_fast_tokens") == text.rfind("longer than train.ki.max_fast_tokens"));
}

TEST_CASE("train.ki: the tokenizer folder must load and fit the vocabulary, one line naming the key",
          "[integration][train][ki]") {
  TinyRun run;
  auto bad = [&](const std::string& dir) {
    auto o = ki_on();
    o[1] = "train.ki.fast_tokenizer=" + dir;
    return run.config("bad", o);
  };
  CHECK_THROWS_WITH(train::Trainer(bad(run.dir.str("nowhere"))),
                    Contains("train.ki.fast_tokenizer: folder '") && Contains("does not exist") && !Contains("\n"));
  CHECK_THROWS_WITH(train::Trainer(bad(run.dir.str("data"))),
                    Contains("train.ki.fast_tokenizer: ") && Contains("processor_config.json") && !Contains("\n"));
  // tokenizer_b has 1024 FAST ids; the tiny SentencePiece model leaves room for fewer below its 128 tail tokens.
  CHECK_THROWS_WITH(train::Trainer(bad(std::string(PI0_SOURCE_DIR) + "/tests/data/golden/fast/tokenizer_b")),
                    Contains("train.ki.fast_tokenizer: the FAST vocabulary has 1024 ids") && !Contains("\n"));
  CHECK_FALSE(std::filesystem::exists(run.dir.str("bad")));
}

TEST_CASE("train.ki: resume is bit-exact and metrics.jsonl has the loss parts", "[integration][train][ki]") {
  TinyRun run;
  const auto cfg = [&](const std::string& name, int64_t steps) {
    return run.config(name, ki_on({"train.num_steps=" + std::to_string(steps), "checkpoint.save_interval=2"}));
  };
  {
    train::Trainer t(cfg("straight", 4));
    CHECK(t.run() == 4);
  }
  {
    train::Trainer t(cfg("resumed", 2));
    CHECK(t.run() == 2);
  }
  train::RunOptions resume;
  resume.resume = true;
  {
    train::Trainer t(cfg("resumed", 4), resume);
    CHECK(t.run() == 4);
  }
  for (const char* key : {"loss", "ce_fast", "flow_loss", "fast_acc", "fast_undecodable"}) {
    INFO(key);
    const auto a = metrics_column(run.dir.str("straight"), key), b = metrics_column(run.dir.str("resumed"), key);
    REQUIRE(a.size() == 4);
    CHECK(a == b);  // exact
  }
  // loss = ce_weight·ce_fast + flow_weight·flow_loss (1 and 10 by default), summed in float32.
  const auto loss = metrics_column(run.dir.str("straight"), "loss"),
             ce = metrics_column(run.dir.str("straight"), "ce_fast"),
             flow = metrics_column(run.dir.str("straight"), "flow_loss");
  for (size_t i = 0; i < loss.size(); ++i) CHECK(loss[i] == Approx(ce[i] + 10 * flow[i]).epsilon(1e-6));
  const auto ck_a = run.dir.str("straight") + "/checkpoints/4/", ck_b = run.dir.str("resumed") + "/checkpoints/4/";
  const auto wa = io::read_safetensors(ck_a + "model.safetensors"), wb = io::read_safetensors(ck_b + "model.safetensors");
  REQUIRE(wa.size() == wb.size());
  for (const auto& [k, v] : wa) CHECK(torch::equal(v, wb.at(k)));
}

TEST_CASE("train.ki smoke: the tiny pi0.5 trains 150 steps with insulation and both losses fall",
          "[integration][train][ki][slow]") {
  TinyRun run;
  const int threads_before = pi0::thread_counts().aten;
  pi0::set_num_threads(1);
  train::Trainer t(run.config("smoke", ki_on({"model.image_size=28", "model.max_token_len=48", "train.num_steps=150",
                                              "train.batch_size=16", "train.log_interval=10",
                                              "train.metrics_interval=0", "checkpoint.save_interval=1000"})));
  t.run();
  pi0::set_num_threads(threads_before);
  const auto ce = metrics_column(run.dir.str("smoke"), "ce_fast"),
             flow = metrics_column(run.dir.str("smoke"), "flow_loss"),
             acc = metrics_column(run.dir.str("smoke"), "fast_acc"),
             undecodable = metrics_column(run.dir.str("smoke"), "fast_undecodable");
  REQUIRE(ce.size() == 15);
  REQUIRE(undecodable.size() == 15);
  INFO("ce_fast " << ce.front() << " -> " << ce.back() << ", flow " << flow.front() << " -> " << flow.back()
                  << ", fast_acc " << acc.front() << " -> " << acc.back());
  std::printf("ki smoke: ce_fast %.3f -> %.3f, flow_loss %.3f -> %.3f, fast_acc %.3f -> %.3f (chance %.4f), "
              "fast_undecodable %.3f -> %.3f\n",
              ce.front(), ce.back(), flow.front(), flow.back(), acc.front(), acc.back(), 1.0 / 1024,
              undecodable.front(), undecodable.back());
  CHECK(ce.back() * 2 < ce.front());
  CHECK(flow.back() * 2 < flow.front());
  // Far above chance (1 in the 1024-token vocabulary) and above where it started.
  CHECK(acc.back() > 0.2);
  CHECK(acc.back() > acc.front());
}
