// pi0-FAST bundles in pi0-infer and pi0-serve (docs/pi0_fast.md, "Sampling it"): the checkpoint and the bundle carry
// the FAST tokenizer; a request's prompt is laid out as training laid it out (prefix only); predict decodes the
// tokens sample_fast_tokens decodes and extracts actions by openpi's text round trip (infer::fast_actions), zeros and
// a false flag where the tokens hold none; the apps' replies and refusals.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pi0/common/threads.h"
#include "pi0/data/config_options.h"
#include "pi0/data/dataset.h"
#include "pi0/data/fast_prompt.h"
#include "pi0/data/fast_tokenizer.h"
#include "pi0/data/tokenizer.h"
#include "pi0/infer/inference.h"
#include "pi0/io/bundle.h"
#include "pi0/io/checkpoint_files.h"
#include "pi0/io/safetensors.h"
#include "pi0/serve/msgpack_numpy.h"
#include "pi0/serve/policy.h"
#include "pi0/train/trainer.h"
#include "support/app_process.h"
#include "support/tiny_run.h"

using namespace pi0;
using Catch::Contains;
using pi0::testing::kTestFastTokenizer;
using pi0::testing::TinyRun;
namespace fs = std::filesystem;

namespace {

const std::string kPrompt = "reach the red blob";
constexpr int64_t kRobotDims = 7;  // the example data's LIBERO actions (state: 8)

// A tiny pi0-FAST trained for `steps` on the example data and exported. The FAST tokenizer is read from a copy that
// is deleted before the export: the checkpoint's own copy must be what the bundle gets. `tokenizer` overrides
// data.tokenizer (with room for it in model.vocab_size).
std::string fast_bundle(TinyRun& run, int64_t steps, const std::string& tokenizer = "") {
  const auto folder = run.dir.str("fast_tokenizer_copy");
  fs::create_directories(folder);
  for (const auto& f : data::FastTokenizer::file_names())
    if (fs::exists(kTestFastTokenizer + "/" + f)) fs::copy_file(kTestFastTokenizer + "/" + f, folder + "/" + f);
  std::vector<std::string> set = {"model.type=pi0_fast", "model.fast_tokenizer=" + folder, "model.max_token_len=128",
                                  "model.max_decoding_steps=48", "train.num_steps=" + std::to_string(steps),
                                  "checkpoint.save_interval=" + std::to_string(steps)};
  if (!tokenizer.empty()) set.insert(set.end(), {"data.tokenizer=" + tokenizer, "model.vocab_size=1280"});
  train::Trainer(run.config("run", set)).run();
  fs::remove_all(folder);
  const auto bundle = run.dir.str("bundle");
  io::export_run(run.dir.str("run"), bundle);
  return bundle;
}

// Two rows of raw LIBERO observations (openpi keys), the right wrist absent.
std::map<std::string, torch::Tensor> observation(int64_t seed) {
  torch::manual_seed(seed);
  return {{"state", torch::rand({2, 8}) * 0.4 - 0.2},
          {"image/base_0_rgb", torch::randint(0, 256, {2, 32, 32, 3}).to(torch::kUInt8)},
          {"image/left_wrist_0_rgb", torch::randint(0, 256, {2, 32, 32, 3}).to(torch::kUInt8)}};
}

}  // namespace

TEST_CASE("pi0_fast bundle: it carries the FAST tokenizer and predict decodes the tokens the model decodes",
          "[integration][infer][fast]") {
  TinyRun run;
  const auto bundle = fast_bundle(run, 2);
  // The checkpoint and the bundle hold the folder's files; the bundle's config names its own copy.
  const auto ckpt = run.dir.str("run") + "/checkpoints/2/" + io::kFastTokenizerDir;
  for (const char* f : {"processor_config.json", "tokenizer.json"}) {
    CHECK(fs::exists(ckpt + "/" + f));
    CHECK(fs::exists(bundle + "/" + io::kFastTokenizerDir + "/" + f));
  }
  std::ifstream cj(bundle + "/config.json");
  CHECK(nlohmann::json::parse(cj).at("model_type") == "pi0_fast");

  auto b = io::load_bundle(bundle);
  CHECK(b.config.model.fast_tokenizer == io::kFastTokenizerDir);
  REQUIRE(b.fast_prompt != nullptr);
  CHECK(io::action_dims(b) == kRobotDims);

  const auto tensors = observation(3);
  const auto in = infer::make_inputs(b, tensors, "obs", kPrompt, nullptr);
  // The prompt as training lays it out, prefix only, from tokenizers built here from the source files; bidirectional;
  // the absent camera seen as a black image (pi0-FAST: data::absent_camera_seen).
  const data::FastPromptTokenizer ref(
      std::make_shared<const data::Tokenizer>(std::string(PI0_SOURCE_DIR) + "/data/tokenizer/tiny_spm.model"),
      std::make_shared<const data::FastTokenizer>(kTestFastTokenizer));
  const auto& state_stats = b.norm_stats.at("state");
  for (int64_t row = 0; row < 2; ++row) {
    const auto norm = data::normalize(tensors.at("state")[row], state_stats, data::NormMode::kQuantile, "state");
    const auto want = ref.tokenize(kPrompt, norm, torch::Tensor(), 128);
    CHECK(torch::equal(in.observation.tokenized_prompt[row], want.tokens));
    CHECK(torch::equal(in.observation.tokenized_prompt_mask[row], want.mask));
  }
  REQUIRE(in.token_ar_mask.defined());
  CHECK_FALSE(in.token_ar_mask.any().item<bool>());
  CHECK(in.observation.image_masks[2].all().item<bool>());

  const auto predicted = infer::predict(b, in, std::nullopt, 10);
  torch::NoGradGuard no_grad;
  const auto decoded = b.model->sample_fast_tokens(in.observation, in.token_ar_mask, 48, 0.0);
  CHECK(torch::equal(predicted.fast_tokens, decoded.tokens));
  const auto extracted = infer::fast_actions(b, decoded.tokens);
  CHECK(predicted.fast_decodable == extracted.decodable);
  CHECK(torch::equal(predicted.actions, extracted.actions));
  CHECK(predicted.actions.sizes() == torch::IntArrayRef({2, 8, kRobotDims}));
  CHECK(torch::equal(predicted.robot_actions, infer::robot_actions(b, extracted.actions, in.raw_state)));

  // Tokens without the marker (what a 2-step model emits) hold no actions: zeros and false, as openpi falls back.
  const auto none = infer::fast_actions(b, torch::full({1, 5}, int64_t{7}));
  CHECK(none.decodable == std::vector<bool>{false});
  CHECK(none.actions.abs().sum().item<double>() == 0.0);

  // Real-time chunking is not offered and a previous chunk is refused in one line.
  CHECK(infer::rtc_metadata(b, {}).at("modes") == nlohmann::json::array());
  model::RtcRequest rtc;
  rtc.mode = model::RtcMode::kGuided;
  rtc.prev = torch::zeros({2, 3, 8});
  CHECK_THROWS_WITH(infer::predict(b, in, std::nullopt, 10, nullptr, &rtc),
                    Contains("real-time chunking: not available for a pi0-FAST model") && !Contains("\n"));
}

TEST_CASE("pi0_fast bundle: fast_actions gives back a trained chunk through openpi's text round trip",
          "[integration][infer][fast]") {
  // tests/data/tokenizer/tiny_spm_fast.model maps FAST ids onto pieces that re-encode to themselves (as PaliGemma's
  // tail tokens do); over tiny_spm.model the round trip merges them into other pieces and decodes nothing.
  TinyRun run;
  const std::string spm = std::string(PI0_SOURCE_DIR) + "/tests/data/tokenizer/tiny_spm_fast.model";
  const auto bundle = fast_bundle(run, 1, spm);
  const auto b = io::load_bundle(bundle);
  const auto cfg = run.config("x", {"data.tokenizer=" + spm, "model.vocab_size=1280"});
  auto dopts = data::dataset_options(cfg);
  dopts.action_horizon = b.config.model.action_horizon;
  const data::RobotDataset ds(dopts);
  const auto& stats = b.norm_stats;
  int64_t decodable = 0;
  for (int64_t index = 0; index < ds.size(); index += 7) {
    const auto raw = ds.get(index);
    const auto state = data::normalize(raw.state, stats.at("state"), data::NormMode::kQuantile, "state");
    const auto actions = data::normalize(raw.actions, stats.at("actions"), data::NormMode::kQuantile, "actions");
    // The postfix a perfect model generates: the training layout's loss-masked tokens ("Action: ", FAST, "|", EOS).
    const auto t = b.fast_prompt->tokenize(raw.prompt, state, actions, 128);
    const auto postfix = t.tokens.masked_select(t.loss_mask).unsqueeze(0);
    const auto got = infer::fast_actions(b, postfix);
    // FAST's own decode of its encoding (float64 inverse DCT): the round trip through the text adds nothing to it.
    // The 256-id test tokenizer lacks some byte-level pieces, so some chunks' ids decode to fewer code points than
    // H·D: undecodable by FAST itself, and then by the round trip too.
    const auto& fast = b.fast_prompt->fast();
    const auto H = raw.actions.size(0);
    const auto dec = fast.decode(fast.encode(actions), H, kRobotDims);
    INFO("frame index " << index);
    REQUIRE(got.decodable == std::vector<bool>{dec.decodable});
    if (!dec.decodable) {
      CHECK(got.actions.abs().sum().item<double>() == 0.0);
      continue;
    }
    ++decodable;
    const auto want = torch::tensor(dec.actions, torch::kFloat64).view({H, kRobotDims}).to(torch::kFloat32);
    CHECK(torch::equal(got.actions[0], want));
    // And within FAST's rounding of the recorded chunk: each DCT coefficient is rounded to 1/scale, so by
    // Cauchy-Schwarz over the orthonormal inverse an element moves at most 0.5/scale·sqrt(H) in normalized units.
    const double bound = 0.5 / fast.scale() * std::sqrt(static_cast<double>(H)) + 1e-6;
    CHECK((got.actions[0] - actions).abs().max().item<double>() <= bound);
  }
  std::printf("fast_actions round trip: %lld of %lld chunks decodable by FAST itself\n",
              static_cast<long long>(decodable), static_cast<long long>((ds.size() + 6) / 7));
  CHECK(decodable >= 3);
}

TEST_CASE("pi0_fast bundle: pi0-infer writes the tokens and pi0-serve answers with fast_decodable",
          "[integration][infer][serve][fast]") {
  TinyRun run;
  const auto bundle = fast_bundle(run, 1);
  const auto obs = run.dir.str("obs.safetensors"), out = run.dir.str("out.safetensors");
  auto tensors = observation(5);
  tensors["state"] = tensors["state"].narrow(0, 0, 1);
  for (const char* cam : {"image/base_0_rgb", "image/left_wrist_0_rgb"}) tensors[cam] = tensors[cam].narrow(0, 0, 1);
  io::save_safetensors(obs, std::vector<std::pair<std::string, torch::Tensor>>(tensors.begin(), tensors.end()));

  const auto r = testing::run_app_process(
      "pi0-infer", "--bundle " + bundle + " --obs " + obs + " --prompt '" + kPrompt + "' --out " + out, run.dir);
  INFO(r.out << r.err);
  REQUIRE(r.code == 0);
  CHECK_THAT(r.out, Contains("fast[0]: ") && Contains("48 decoding steps"));
  const auto written = io::read_safetensors(out);
  REQUIRE(written.count("fast_tokens") == 1);
  CHECK(written.at("actions_unnormalized").sizes() == torch::IntArrayRef({1, 8, kRobotDims}));
  const auto meta = io::SafetensorsFile(out).metadata();
  REQUIRE(meta.count("fast_decodable") == 1);
  CHECK(nlohmann::json::parse(meta.at("fast_decodable")).size() == 1);
  for (const auto& [flag, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--loss", "--loss: " + bundle + " is a pi0-FAST bundle, which has no flow-matching loss"},
           {"--noise " + obs, "--noise: " + bundle + " is a pi0-FAST bundle; it decodes action tokens"}}) {
    const auto bad = testing::run_app_process(
        "pi0-infer", "--bundle " + bundle + " --obs " + obs + " --prompt x --out " + out + " " + flag, run.dir);
    CHECK(bad.code == 2);
    CHECK_THAT(bad.err, Contains(expected));
  }

  // pi0-serve's policy: the same answer as predict for the same request, the flag in the reply, the metadata.
  serve::PolicyOptions po;
  po.robot = serve::Robot::kLibero;
  serve::Policy policy(io::load_bundle(bundle), po);
  const auto& md = policy.metadata();
  CHECK(md.at("model_type") == "pi0_fast");
  CHECK(md.at("fast").at("max_decoding_steps") == 48);
  CHECK(md.at("fast").at("action_dim") == kRobotDims);
  CHECK(md.at("rtc").at("modes") == nlohmann::json::array());
  serve::Fields f;
  f["observation/image"].tensor = tensors.at("image/base_0_rgb")[0];
  f["observation/wrist_image"].tensor = tensors.at("image/left_wrist_0_rgb")[0];
  f["observation/state"].tensor = tensors.at("state")[0];
  f["prompt"].text = kPrompt;
  const auto answer = policy.infer(f);
  CHECK(answer.actions.sizes() == torch::IntArrayRef({8, kRobotDims}));
  CHECK(torch::equal(answer.actions, written.at("actions_unnormalized")[0]));
  REQUIRE(answer.fast_decodable.is_boolean());
  serve::Response resp;
  resp.actions = answer.actions;
  resp.fast_decodable = answer.fast_decodable;
  const auto frame = serve::encode_response(resp);
  const auto decoded = serve::decode_frame(frame.data(), frame.size());
  REQUIRE(decoded.count("fast_decodable") == 1);
  CHECK(decoded.at("fast_decodable").tensor.item<bool>() == answer.fast_decodable.get<bool>());

  po.noise = torch::zeros({8, 8});
  CHECK_THROWS_WITH(serve::Policy(io::load_bundle(bundle), po),
                    Contains("--noise: a pi0-FAST bundle decodes action tokens") && !Contains("\n"));
}
