// model.type pi0_fast in the trainer (docs/pi0_fast.md): batches in openpi's pi0-FAST token layout, the FAST
// cross-entropy and fast_acc in metrics.jsonl, bit-exact resume, the tokenizer folder's errors, pi0-train
// --print-params, --dump-batches, validation, and a learning smoke run of configs/debug_pi0_fast.yaml on the generated example data.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/threads.h"
#include "pi0/data/loader.h"
#include "pi0/data/tokenizer.h"
#include "pi0/io/bundle.h"
#include "pi0/io/safetensors.h"
#include "pi0/train/data_setup.h"
#include "pi0/train/metrics.h"
#include "pi0/train/sample_dump.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::kTestFastTokenizer;
using pi0::testing::metrics_column;
using pi0::testing::TinyRun;

namespace {

// configs/debug.yaml (through TinyRun) turned into the tiny pi0-FAST: its dummy action expert is ignored.
std::vector<std::string> fast_on(const std::vector<std::string>& more = {}) {
  return testing::with({"model.type=pi0_fast", "model.fast_tokenizer=" + kTestFastTokenizer, "model.max_token_len=128"},
                       more);
}

}  // namespace

TEST_CASE("pi0_fast: batches hold openpi's pi0-FAST token layout", "[integration][train][fast]") {
  TinyRun run;
  const auto cfg = run.config("run", fast_on());
  auto pipe = train::make_data_pipeline(cfg, 4, 0, 1);
  const auto batch = pipe.loader->next();
  REQUIRE(batch.token_ar_mask.defined());
  const auto& tokens = batch.observation.tokenized_prompt;
  const auto& mask = batch.observation.tokenized_prompt_mask;
  CHECK(tokens.sizes() == torch::IntArrayRef({4, 128}));
  const data::Tokenizer spm(cfg.data.tokenizer);
  const auto marker = spm.encode("Action: ");
  for (int64_t b = 0; b < 4; ++b) {
    INFO("example " << b);
    const int64_t n = mask[b].sum().item<int64_t>();
    REQUIRE(n < 128);  // nothing truncated at this length
    CHECK(mask[b].narrow(0, 0, n).all().item<bool>());
    CHECK(tokens[b][0].item<int64_t>() == spm.bos_id());
    CHECK(tokens[b][n - 1].item<int64_t>() == spm.eos_id());
    // The postfix (ar 1, loss 1) starts with "Action: " and runs to EOS; the prefix and the padding are ar 0, loss 0.
    CHECK(torch::equal(batch.token_ar_mask[b], batch.token_loss_mask[b]));
    const int64_t start = n - batch.token_loss_mask[b].sum().item<int64_t>();
    REQUIRE(start > 0);
    CHECK(batch.token_loss_mask[b].narrow(0, start, n - start).all().item<bool>());
    for (size_t k = 0; k < marker.size(); ++k)
      CHECK(tokens[b][start + static_cast<int64_t>(k)].item<int64_t>() == marker[k]);
  }
  // Quantile normalization, as openpi's pi0-FAST (use_quantile_norm = model_type != PI0).
  CHECK(pipe.sources[0].transform->options().norm == "quantile");
}

TEST_CASE("pi0_fast: --dump-batches shows the postfix and the actions inference would read from it",
          "[integration][train][fast]") {
  TinyRun run;
  const auto dir = run.dir.str("dump");
  // tiny_spm_fast.model: FAST ids land on pieces that re-encode to themselves, so openpi's text round trip is exact.
  const std::string spm_path = std::string(PI0_SOURCE_DIR) + "/tests/data/tokenizer/tiny_spm_fast.model";
  const auto cfg = run.config("run", fast_on({"data.tokenizer=" + spm_path, "model.vocab_size=1280"}));
  REQUIRE(train::dump_samples(cfg, 2, dir) == 2);
  const data::Tokenizer spm(spm_path);
  const auto marker = spm.encode("Action: "), bar = spm.encode("|");
  for (const char* sample : {"sample_000", "sample_001"}) {
    INFO(sample);
    const auto j = nlohmann::json::parse(std::ifstream(dir + "/" + sample + "/sample.json"));
    REQUIRE(j.contains("fast_tokens"));
    // "Action: ", the FAST ids, "|", EOS.
    CHECK(j.at("fast_tokens").size() == marker.size() + j.at("fast_ids").size() + bar.size() + 1);
    CHECK(j.at("fast_tokens").back().get<int64_t>() == spm.eos_id());
    CHECK(j.at("fast_decodable").get<bool>());
    // FAST is lossy by design (scale 10: coefficients rounded to 0.1): the decoded chunk is near the robot's 7 dims.
    CHECK(testing::fast_chunk_error(j, 7) < 0.15);
  }
}

TEST_CASE("pi0_fast: validation is its cross-entropy and the greedy decoding pi0-infer runs", "[integration][train][fast]") {
  TinyRun run;
  const std::string spm_path = std::string(PI0_SOURCE_DIR) + "/tests/data/tokenizer/tiny_spm_fast.model";
  const auto cfg = run.config(
      "val", fast_on({"data.tokenizer=" + spm_path, "model.vocab_size=1280", "model.max_decoding_steps=48",
                      "data.validation_split=0.34", "train.val_samples=6", "train.num_steps=2",
                      "checkpoint.save_interval=2"}));
  train::Trainer t(cfg);
  t.run();
  for (const char* key : {"val_loss", "val_action_mse", "val_fast_undecodable"}) {
    INFO(key);
    CHECK(metrics_column(run.dir.str("val"), key).size() == 1);
  }
  const auto v = t.validate(), again = t.validate();
  REQUIRE(v.has_value());
  CHECK(v->samples == 6);
  REQUIRE(v->fast_undecodable.has_value());
  CHECK((*v->fast_undecodable >= 0 && *v->fast_undecodable <= 1));
  CHECK(v->loss == again->loss);  // greedy: the same every pass
  CHECK(v->action_mse == again->action_mse);
  CHECK(*v->fast_undecodable == *again->fast_undecodable);

  // val_loss is training's loss on the held-out samples (one chunk: the 6 fit one local batch of 8, same order).
  auto pipe = train::make_data_pipeline(cfg, 8, 0, 1);
  REQUIRE(pipe.validation.size() == 6);
  const auto batch = data::make_batch(pipe.sources, pipe.validation);
  torch::NoGradGuard no_grad;
  const auto fl = t.model()->compute_fast_loss(batch.observation, batch.token_ar_mask, batch.token_loss_mask);
  CHECK(v->loss == Approx(fl.loss.mean().item<double>()).epsilon(1e-6));
  // Decoded actions against the recorded ones over the robot's dims; a row without actions counts as zeros, as
  // pi0-infer answers. An all-undecodable pass is the recorded actions' mean square.
  if (*v->fast_undecodable == 1.0) {
    const auto dims = batch.action_dims[0].item<int64_t>();
    CHECK(v->action_mse == Approx(batch.actions.narrow(2, 0, dims).pow(2).mean().item<double>()).epsilon(1e-6));
  }
}

TEST_CASE("pi0_fast: resume is bit-exact and metrics.jsonl has loss, fast_acc and fast_undecodable", "[integration][train][fast]") {
  TinyRun run;
  const auto cfg = [&](const std::string& name, int64_t steps) {
    return run.config(name, fast_on({"train.num_steps=" + std::to_string(steps), "checkpoint.save_interval=2",
                                     "train.precision=bf16-mixed"}));
  };
  {
    train::Trainer t(cfg("straight", 4));
    CHECK(t.run() == 4);
    // bf16-mixed: float32 masters of what trains.
    for (const auto& [name, w] : t.trainable_weights()) CHECK(w.scalar_type() == torch::kFloat32);
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
  for (const char* key : {"loss", "fast_acc", "fast_undecodable", "grad_norm"}) {
    INFO(key);
    const auto a = metrics_column(run.dir.str("straight"), key), b = metrics_column(run.dir.str("resumed"), key);
    REQUIRE(a.size() == 4);
    CHECK(a == b);  // exact
  }
  for (const double acc : metrics_column(run.dir.str("straight"), "fast_acc")) CHECK((acc >= 0 && acc <= 1));
  for (const double u : metrics_column(run.dir.str("straight"), "fast_undecodable")) CHECK((u >= 0 && u <= 1));
  CHECK(metrics_column(run.dir.str("straight"), "flow_loss").empty());
  const auto ck_a = run.dir.str("straight") + "/checkpoints/4/", ck_b = run.dir.str("resumed") + "/checkpoints/4/";
  const auto wa = io::read_safetensors(ck_a + "model.safetensors"), wb = io::read_safetensors(ck_b + "model.safetensors");
  REQUIRE(wa.size() == wb.size());
  for (const auto& [k, v] : wa) {
    INFO(k);
    CHECK(k.find("gemma_expert") == std::string::npos);
    CHECK(torch::equal(v, wb.at(k)));
  }
}

TEST_CASE("pi0_fast: model.fast_tokenizer must load and fit the vocabulary, one line naming the key",
          "[integration][train][fast]") {
  TinyRun run;
  auto bad = [&](const std::string& dir) { return run.config("bad", fast_on({"model.fast_tokenizer=" + dir})); };
  CHECK_THROWS_WITH(train::Trainer(bad(run.dir.str("nowhere"))),
                    Contains("model.fast_tokenizer: folder '") && Contains("does not exist") && !Contains("\n"));
  CHECK_THROWS_WITH(train::Trainer(bad(std::string(PI0_SOURCE_DIR) + "/tests/data/golden/fast/tokenizer_b")),
                    Contains("model.fast_tokenizer: the FAST vocabulary has 1024 ids") && !Contains("\n"));
  CHECK_FALSE(std::filesystem::exists(run.dir.str("bad")));
}

TEST_CASE("pi0_fast: pi0-train --print-params counts PaliGemma alone", "[integration][app][fast]") {
  TinyRun run;
  const auto config = run.write_config("fast.yaml", "run", fast_on());
  const auto r = testing::run_app_process("pi0-train", "--config " + config + " --print-params", run.dir);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("action_expert        0          0"));
  CHECK_THAT(r.out, Contains("projections          0          0"));
  CHECK_THAT(r.out, Contains("total          276,768    276,768"));
}

TEST_CASE("pi0_fast smoke: configs/debug_pi0_fast.yaml trains 100 steps and the FAST loss falls",
          "[integration][train][fast][slow]") {
  TinyRun run;
  const int threads_before = pi0::thread_counts().aten;
  pi0::set_num_threads(1);
  const auto cfg =
      config::load_config(std::string(PI0_SOURCE_DIR) + "/configs/debug_pi0_fast.yaml",
                          {"data.dataset.paths=[" + run.data_glob + "]", "data.norm_stats=" + run.norm_stats,
                           "data.tokenizer=" + std::string(PI0_SOURCE_DIR) + "/tests/data/tokenizer/tiny_spm_fast.model",
                           "model.fast_tokenizer=" + kTestFastTokenizer, "checkpoint.run_dir=" + run.dir.str("smoke"),
                           "train.num_steps=100", "train.lr_decay_steps=100", "train.log_interval=10",
                           "train.metrics_interval=0", "checkpoint.save_interval=1000"});
  train::Trainer t(cfg);
  t.run();
  pi0::set_num_threads(threads_before);
  const auto loss = metrics_column(run.dir.str("smoke"), "loss"),
             acc = metrics_column(run.dir.str("smoke"), "fast_acc"),
             undecodable = metrics_column(run.dir.str("smoke"), "fast_undecodable");
  REQUIRE(loss.size() == 10);
  REQUIRE(undecodable.size() == 10);
  std::printf("pi0_fast smoke: loss %.3f -> %.3f, fast_acc %.3f -> %.3f, fast_undecodable %.3f -> %.3f\n",
              loss.front(), loss.back(), acc.front(), acc.back(), undecodable.front(), undecodable.back());
  CHECK(loss.back() * 2 < loss.front());
  CHECK(acc.back() > acc.front());
}

TEST_CASE("pi0_fast: pi0-export writes openpi's pi0-FAST names", "[integration][train][fast][io]") {
  TinyRun run;
  {
    train::Trainer t(run.config("run", fast_on({"train.num_steps=1", "checkpoint.save_interval=1"})));
    t.run();
  }
  const auto bundle = run.dir.str("bundle");
  io::export_run(run.dir.str("run"), bundle);
  const auto weights = io::read_safetensors(bundle + "/model.safetensors");
  const auto golden_names =
      io::read_safetensors(std::string(PI0_SOURCE_DIR) + "/tests/data/golden/pi0_fast/model_weights.safetensors");
  REQUIRE(weights.size() == golden_names.size());  // the same layout (the golden's dimensions differ)
  for (const auto& [name, t] : golden_names) CHECK(weights.count(name) == 1);
}
