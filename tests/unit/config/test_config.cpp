// Config: layering (defaults → YAML → --set), strict keys with did-you-mean, type and range errors naming the
// key and value, and round trip of the resolved config.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/config/config.h"
#include "support/test_support.h"

using namespace pi0::config;
using Catch::Contains;

namespace {
Config parse(const std::string& yaml, std::vector<std::string> overrides = {}) {
  return parse_config(YAML::Load(yaml), "run.yaml", overrides);
}
}  // namespace

TEST_CASE("config layers defaults, YAML and --set overrides", "[unit][config]") {
  auto c = parse("train:\n  batch_size: 8\n  lr_peak: 1.0e-4\nmodel:\n  type: pi05\n",
                 {"train.batch_size=4", "checkpoint.run_dir=/tmp/x", "data.delta_action_mask=[true, false]"});
  CHECK(c.train.batch_size == 4);            // --set wins over YAML
  CHECK(c.train.lr_peak == Approx(1e-4));    // YAML wins over default
  CHECK(c.train.num_steps == 30000);         // default
  CHECK(c.model.type == "pi05");
  CHECK(c.checkpoint.run_dir == "/tmp/x");
  CHECK(c.data.delta_action_mask == std::vector<bool>{true, false});
}

TEST_CASE("resolved config round-trips through YAML", "[unit][config]") {
  auto c = parse(R"(
data:
  dataset:
    format: aloha
    paths: [a/*.hdf5, b.hdf5]
    cameras: {base_0_rgb: cam_high}
    prompt: fold the towel
train: {freeze: lora, trainable_include: ['.*lora.*']}
)");
  auto again = parse_config(to_yaml(c), "dump");
  CHECK(YAML::Dump(to_yaml(again)) == YAML::Dump(to_yaml(c)));
  CHECK(again.data.dataset.cameras.at("base_0_rgb") == "cam_high");
  CHECK(again.data.dataset.paths.size() == 2);
  CHECK(again.train.trainable_include == std::vector<std::string>{".*lora.*"});
}

TEST_CASE("unknown keys are rejected with a did-you-mean", "[unit][config]") {
  REQUIRE_THROWS_WITH(parse("train:\n  bach_size: 3\n"),
                      Contains("run.yaml: unknown key 'train.bach_size' (did you mean 'train.batch_size'?)"));
  REQUIRE_THROWS_WITH(parse("trian:\n  batch_size: 3\n"), Contains("unknown key 'trian' (did you mean 'train'?)"));
  REQUIRE_THROWS_WITH(parse("data:\n  dataset: {format: libero, paths: [x], cmaeras: {}}\n"),
                      Contains("unknown key 'data.dataset.cmaeras' (did you mean 'data.dataset.cameras'?)"));
  REQUIRE_THROWS_WITH(parse("", {"train.zzzzzzzzzz=1"}), Contains("unknown key 'train.zzzzzzzzzz'"));
}

TEST_CASE("wrong types name the key, the value and the expected type", "[unit][config]") {
  REQUIRE_THROWS_WITH(parse("train:\n  batch_size: eight\n"),
                      Contains("run.yaml: train.batch_size must be an integer (got 'eight')"));
  REQUIRE_THROWS_WITH(parse("train:\n  lr_peak: fast\n"), Contains("train.lr_peak must be a number (got 'fast')"));
  REQUIRE_THROWS_WITH(parse("train:\n  gradient_checkpointing: maybe\n"),
                      Contains("train.gradient_checkpointing must be false, true or auto (got 'maybe')"));
  REQUIRE_THROWS_WITH(parse("data:\n  dataset: {paths: x}\n"), Contains("data.dataset.paths must be a list"));
  REQUIRE_THROWS_WITH(parse("train: 3\n"), Contains("train must be a mapping"));
}

TEST_CASE("train.gradient_checkpointing takes false, true or auto, and every YAML bool spelling", "[unit][config]") {
  CHECK(parse("").train.gradient_checkpointing == "false");
  for (const std::string value : {"false", "true", "auto"}) {
    CHECK(parse("train:\n  gradient_checkpointing: " + value + "\n").train.gradient_checkpointing == value);
    CHECK(parse("", {"train.gradient_checkpointing=" + value}).train.gradient_checkpointing == value);
  }
  // Configs from when it was a bool keep their meaning, and the dump reads back.
  CHECK(parse("train: {gradient_checkpointing: True}\n").train.gradient_checkpointing == "true");
  CHECK(parse("train: {gradient_checkpointing: off}\n").train.gradient_checkpointing == "false");
  const auto c = parse("train: {gradient_checkpointing: auto}\n");
  CHECK(parse_config(to_yaml(c), "dump").train.gradient_checkpointing == "auto");
  CHECK_THROWS_WITH(parse("", {"train.gradient_checkpointing=maybe"}),
                    Contains("train.gradient_checkpointing must be false, true or auto (got 'maybe')") &&
                        !Contains("\n"));
}

TEST_CASE("out-of-range values name the key and what was expected", "[unit][config]") {
  REQUIRE_THROWS_WITH(parse("train: {batch_size: 0}"), Contains("train.batch_size must be > 0 (got 0)"));
  REQUIRE_THROWS_WITH(parse("train: {lr_warmup_steps: -5}"), Contains("train.lr_warmup_steps must be >= 0 (got -5)"));
  REQUIRE_THROWS_WITH(parse("train: {precision: fp16}"),
                      Contains("train.precision must be float32, bf16-mixed or bf16 (got 'fp16')"));
  REQUIRE_THROWS_WITH(parse("train: {ema_decay: 1.5}"), Contains("train.ema_decay must be in [0, 1)"));
  REQUIRE_THROWS_WITH(parse("train: {batch_size: 6, grad_accum_steps: 4}"),
                      Contains("train.batch_size must be a multiple of train.grad_accum_steps (4) (got 6)"));
  REQUIRE_THROWS_WITH(parse("model: {type: pi1}"), Contains("model.type must be pi0, pi05 or pi0_fast (got 'pi1')"));
  REQUIRE_THROWS_WITH(parse("data:\n  dataset: {format: rlds, paths: [x]}\n"),
                      Contains("data.dataset.format must be libero, aloha or lerobot (got 'rlds')"));
  REQUIRE_THROWS_WITH(parse("", {"train.batch_size"}), Contains("--set expects section.key=value"));
}

TEST_CASE("a missing or malformed config file gives a one-line error", "[unit][config]") {
  REQUIRE_THROWS_WITH(load_config("/nonexistent/run.yaml"),
                      Contains("config file '/nonexistent/run.yaml' does not exist"));
  REQUIRE_THROWS_AS(load_config("/nonexistent/run.yaml"), pi0::UserError);
  // Issue 49 item 11: a relative path says where it was looked for.
  const std::string cwd = std::filesystem::current_path().string();
  REQUIRE_THROWS_WITH(load_config("no_such_dir/run.yaml"),
                      "config file 'no_such_dir/run.yaml' does not exist (relative paths are resolved from the "
                      "working directory '" + cwd + "')");
  CHECK(pi0::relative_path_note("/abs/x.json").empty());
  CHECK(pi0::relative_path_note("assets/x/norm_stats.json") ==
        " (relative paths are resolved from the working directory '" + cwd + "', not from the config file's folder)");
  // A directory opens as a stream on Linux and used to fail while reading, as an internal error.
  const auto dir = std::filesystem::temp_directory_path().string();
  REQUIRE_THROWS_AS(load_config(dir), pi0::UserError);
  REQUIRE_THROWS_WITH(load_config(dir), Contains("config file '" + dir + "' is a directory; expected a YAML file"));
}

TEST_CASE("an empty config file is an error, not a run with every default", "[unit][config]") {
  pi0::testing::TempDir dir("pi0config");
  for (const std::string text : {"", "\n\n", "# nothing here yet\n", "---\n"}) {
    INFO("file text: '" << text << "'");
    std::ofstream(dir.str("run.yaml")) << text;
    REQUIRE_THROWS_AS(load_config(dir.str("run.yaml")), pi0::UserError);
    REQUIRE_THROWS_WITH(load_config(dir.str("run.yaml"), {"train.batch_size=4"}),
                        Contains("config file '" + dir.str("run.yaml") + "' is empty") &&
                            Contains("configs/debug.yaml"));
  }
}

TEST_CASE("an empty --set value is an error, not a reset to the default", "[unit][config]") {
  for (const std::string value : {"", "~", "null"}) {
    INFO("value '" << value << "'");
    REQUIRE_THROWS_WITH(parse("checkpoint: {run_dir: runs/mine}", {"checkpoint.run_dir=" + value}),
                        Contains("--set checkpoint.run_dir=" + value + ": empty value") &&
                            Contains("checkpoint.run_dir='' for an empty string"));
  }
  REQUIRE_THROWS_WITH(parse("", {"train.lr_peak="}), Contains("--set train.lr_peak=: empty value"));
  // An empty string is still a value.
  CHECK(parse("checkpoint: {init_weights: w.safetensors}", {"checkpoint.init_weights=''"}).checkpoint.init_weights ==
        "");
}

TEST_CASE("a key with no value in the file is an error naming its line", "[unit][config]") {
  REQUIRE_THROWS_WITH(parse("train:\n  batch_size: 4\n  lr_peak:\n"),
                      Contains("run.yaml: train.lr_peak has no value (line 3)") && Contains("remove the key"));
  REQUIRE_THROWS_WITH(parse("checkpoint:\n  run_dir:\n"), Contains("checkpoint.run_dir has no value (line 2)"));
  // An empty section is no setting at all, and stays allowed.
  CHECK(parse("train:\n  batch_size: 4\ndist:\n").train.batch_size == 4);
}

TEST_CASE("duplicate YAML keys are errors naming both lines", "[unit][config]") {
  // yaml-cpp keeps both and returns the first: the second train: section used to be ignored.
  REQUIRE_THROWS_WITH(parse("train:\n  batch_size: 4\nmodel:\n  type: pi05\ntrain:\n  num_steps: 9\n"),
                      Contains("run.yaml: duplicate key 'train' at lines 1 and 5"));
  REQUIRE_THROWS_WITH(parse("train:\n  batch_size: 4\n  lr_peak: 1.0e-4\n  batch_size: 8\n"),
                      Contains("run.yaml: duplicate key 'train.batch_size' at lines 2 and 4"));
  REQUIRE_THROWS_WITH(parse("model:\n  paligemma_variant: {width: 8, width: 16}\n"),
                      Contains("duplicate key 'model.paligemma_variant.width' at lines 2 and 2"));
  REQUIRE_THROWS_WITH(parse("data:\n  dataset:\n    cameras: {base_0_rgb: a, base_0_rgb: b}\n"),
                      Contains("duplicate key 'data.dataset.cameras.base_0_rgb'"));
  pi0::testing::TempDir dir("pi0config");
  std::ofstream(dir.str("dup.yaml")) << "train:\n  batch_size: 4\n\n# later\ntrain:\n  batch_size: 8\n";
  REQUIRE_THROWS_WITH(load_config(dir.str("dup.yaml")),
                      Contains(dir.str("dup.yaml") + ": duplicate key 'train' at lines 1 and 5"));
}

TEST_CASE("non-finite numbers are errors everywhere in the config", "[unit][config]") {
  REQUIRE_THROWS_WITH(parse("train: {lr_peak: .inf}"), Contains("train.lr_peak must be a finite number (got inf)"));
  REQUIRE_THROWS_WITH(parse("", {"train.lr_peak=.inf"}), Contains("train.lr_peak must be a finite number"));
  REQUIRE_THROWS_WITH(parse("train: {lr_end: -.inf}"), Contains("train.lr_end must be a finite number (got -inf)"));
  REQUIRE_THROWS_WITH(parse("train: {adam_eps: .nan}"), Contains("train.adam_eps must be a finite number (got nan)"));
  REQUIRE_THROWS_WITH(parse("train: {clip_grad_norm: .Inf}"), Contains("train.clip_grad_norm must be a finite"));
  REQUIRE_THROWS_WITH(parse("train: {weight_decay: .NaN}"), Contains("train.weight_decay must be a finite"));
  REQUIRE_THROWS_WITH(parse("model:\n  paligemma_variant: {width: 8, depth: 1, mlp_dim: 8, num_heads: 1, "
                            "num_kv_heads: 1, head_dim: 8, lora_rank: 2, lora_alpha: .inf}\n"),
                      Contains("model.paligemma_variant.lora_alpha must be a finite number (got inf)"));
  // A config built in code goes through the same check.
  Config c;
  c.train.ema_decay = std::numeric_limits<double>::quiet_NaN();
  REQUIRE_THROWS_WITH(validate(c), Contains("train.ema_decay must be a finite number (got nan)"));
}

TEST_CASE("config reference lists every key with its default", "[unit][config]") {
  auto ref = config_reference();
  bool found = false;
  for (auto& [key, def, doc] : ref) {
    CHECK(!doc.empty());
    if (key == "train.lr_warmup_steps") found = def == "1000";
  }
  CHECK(found);
}

TEST_CASE("docs/config.md lists every key with its current default", "[unit][config]") {
  std::ifstream f(std::string(PI0_SOURCE_DIR) + "/docs/config.md");
  REQUIRE(f);
  const std::string doc((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const auto& [key, def, text] : config_reference()) {
    INFO("regenerate with: pi0-train --config-reference (key " << key << ")");
    CHECK(doc.find("| `" + key + "` | `" + def + "` | " + text + " |") != std::string::npos);
  }
}

TEST_CASE("checkpoint.asset_id must be a plain folder name, refused at load naming the key", "[unit][config]") {
  // It names assets/<asset_id>/ inside every checkpoint and bundle: these put norm_stats.json outside them.
  for (const std::string bad : {"../../../escaped", "/etc", "a/b", "..", ".", "''", "\"tab\\there\"", "\"nl\\nx\""}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse("", {"checkpoint.asset_id=" + bad}),
                      Contains("checkpoint.asset_id must be a plain folder name") && !Contains("\n"));
  }
  CHECK_THROWS_WITH(parse("checkpoint: {asset_id: ../x}\n"),
                    Contains("checkpoint.asset_id must be a plain folder name") && Contains("'../x'"));
  CHECK(parse("", {"checkpoint.asset_id=libero"}).checkpoint.asset_id == "libero");
  CHECK(parse("", {"checkpoint.asset_id=trossen.v2_x"}).checkpoint.asset_id == "trossen.v2_x");
  // A file name holds at most 255 bytes (NAME_MAX): a longer id would fail at the first checkpoint save.
  CHECK(parse("", {"checkpoint.asset_id=" + std::string(255, 'a')}).checkpoint.asset_id.size() == 255);
  CHECK_THROWS_WITH(parse("", {"checkpoint.asset_id=" + std::string(256, 'a')}),
                    Contains("checkpoint.asset_id must be a folder name of at most 255 bytes (got 256 bytes: 'aaaa") &&
                        !Contains(std::string(256, 'a')) && !Contains("\n"));
  const std::string wide = "\u00e9" + std::string(254, 'a');  // 2 + 254 bytes: 255 characters, 256 bytes
  CHECK_THROWS_WITH(parse("checkpoint: {asset_id: \"" + wide + "\"}\n"),
                    Contains("checkpoint.asset_id must be a folder name of at most 255 bytes (got 256 bytes"));
}

TEST_CASE("paths with control characters are refused at load, the value escaped", "[unit][config]") {
  for (const std::string key : {"checkpoint.run_dir", "checkpoint.init_weights", "data.norm_stats", "data.tokenizer"}) {
    INFO(key);
    CHECK_THROWS_WITH(parse("", {key + "=\"runs/a\\nb\""}),
                      key + " must be a path without control characters (newline, tab, escape) (got 'runs/a\\nb')");
  }
  CHECK_THROWS_WITH(parse("", {"data.dataset.paths=[ok.hdf5, \"x\\ty.hdf5\"]"}),
                    Contains("data.dataset.paths[1] must be a path without control characters"));
  CHECK(parse("", {"checkpoint.run_dir=runs/été 2026"}).checkpoint.run_dir == "runs/été 2026");  // UTF-8 is fine
}

TEST_CASE("a YAML alias bomb is refused at once, and anchors in a real config still work", "[unit][config]") {
  // 9 levels of 9 aliases: 9^9 values once expanded. The duplicate-key check used to walk all of them (minutes).
  std::string laughs = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (char level = 'b'; level <= 'i'; ++level) {
    laughs += std::string(1, level) + ": &" + level + " [";
    for (int i = 0; i < 9; ++i) laughs += std::string(i ? ", " : "") + "*" + static_cast<char>(level - 1);
    laughs += "]\n";
  }
  // Five levels of 9 in a list, aliased twice from a real section (about 200000 values): refused before the
  // unknown key x is even looked at.
  std::string six = "train:\n  trainable_include: &f [*e, *e]\n";
  std::string defs = "x:\n  - &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  for (char level = 'b'; level <= 'e'; ++level) {
    defs += std::string("  - &") + level + " [";
    for (int i = 0; i < 9; ++i) defs += std::string(i ? ", " : "") + "*" + static_cast<char>(level - 1);
    defs += "]\n";
  }
  CHECK_THROWS_WITH(parse(defs + six), Contains("more than 100000 values"));
  // Nine levels: refused at the same bound, after walking at most 100000 values (it used to take minutes).
  CHECK_THROWS_WITH(parse(laughs), Contains("run.yaml: more than 100000 values once its YAML aliases") &&
                                       Contains("alias bomb"));
  // The same bomb in a --set value.
  CHECK_THROWS_WITH(parse("", {"train.trainable_include=" + std::string("[&a [x,x,x,x,x,x,x,x,x,x], ") +
                               "&b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], " +
                               "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]]"}),
                    Contains("--set train.trainable_include: more than 100000 values"));
  // An alias inside the node it names (yaml-cpp accepts it): endless nesting, which overflowed the stack before the
  // value bound (found by fuzz/config_alias). Refused by depth, in the file and in a --set value.
  CHECK_THROWS_WITH(parse("a: &a [lol, lol]\nb: &b [*a, *b, *a]\n"),
                    Contains("run.yaml: nested more than 64 levels deep") && Contains("alias inside the node"));
  CHECK_THROWS_WITH(parse("", {"train.trainable_include=&b [x, *b]"}), Contains("nested more than 64 levels"));
  // Anchors and aliases in a legitimate config.
  const auto c = parse("train: {lr_peak: &lr 2.0e-4, lr_end: *lr, trainable_include: &inc ['a.*'], "
                       "trainable_exclude: *inc}\nmodel: {action_dim: &d 16, action_horizon: *d}\n");
  CHECK(c.train.lr_end == Approx(2e-4));
  CHECK(c.train.trainable_exclude == std::vector<std::string>{"a.*"});
  CHECK(c.model.action_horizon == 16);
}

TEST_CASE("train.ki is off by default and validated naming its keys", "[unit][config][ki]") {
  const auto d = parse("");
  CHECK_FALSE(d.train.ki.enabled);
  CHECK(d.train.ki.ce_weight == 1.0);
  CHECK(d.train.ki.flow_weight == 10.0);  // the paper's alpha
  const std::string pi05 = "model: {type: pi05}\n";
  const auto ok = parse(pi05, {"train.ki.enabled=true", "train.ki.fast_tokenizer=fast", "train.ki.max_fast_tokens=32"});
  CHECK(ok.train.ki.enabled);
  CHECK(ok.train.ki.max_fast_tokens == 32);
  // (Catch's composed matchers hold references to their parts: each is spelled out in its own CHECK.)
  CHECK_THROWS_WITH(parse("model: {type: pi0}\n", {"train.ki.enabled=true", "train.ki.fast_tokenizer=fast"}),
                    Contains("train.ki.enabled must be model.type pi05") && !Contains("\n") && Contains("'pi0'"));
  CHECK_THROWS_WITH(parse(pi05, {"train.ki.enabled=true"}),
                    Contains("train.ki.fast_tokenizer must be a FAST tokenizer folder") && !Contains("\n"));
  CHECK_THROWS_WITH(parse(pi05, {"train.ki.enabled=true", "train.ki.fast_tokenizer=f", "train.ki.max_fast_tokens=2"}),
                    Contains("train.ki.max_fast_tokens must be >= 3") && !Contains("\n") && Contains("(got 2)"));
  CHECK_THROWS_WITH(parse(pi05, {"train.ki.enabled=true", "train.ki.fast_tokenizer=f", "train.ki.ce_weight=-1"}),
                    Contains("train.ki.ce_weight must be >= 0") && !Contains("\n"));
  CHECK_THROWS_WITH(parse(pi05, {"train.ki.enabled=true", "train.ki.fast_tokenizer=f", "train.ki.flow_weight=-1"}),
                    Contains("train.ki.flow_weight must be >= 0") && !Contains("\n"));
  CHECK_THROWS_WITH(parse(pi05, {"train.ki.enabled=true", "train.ki.fast_tokenizer=f", "train.ki.flow_weight=0",
                                 "train.ki.ce_weight=0"}),
                    Contains("train.ki.ce_weight must be > 0 when train.ki.flow_weight is 0") && !Contains("\n"));
  CHECK_THROWS_WITH(parse("train: {ki: {enabld: true}}\n"), Contains("train.ki.enabld") && Contains("train.ki.enabled"));
  // Off: the block is ignored, whatever it holds (a config can keep its KI settings and switch them off).
  CHECK_NOTHROW(parse("", {"train.ki.max_fast_tokens=0"}));
}
