// manifest.json and the dtype rules of weight loading: every kind of damage a checkpoint or bundle can suffer is
// caught and named (issue 11 items 1, 2, 4).
#include <catch2/catch.hpp>

#include <filesystem>
#include <cstring>
#include <fstream>
#include <limits>

#include "pi0/common/check.h"
#include "pi0/io/manifest.h"
#include "pi0/io/model_weights.h"
#include "pi0/io/safetensors.h"
#include "support/corrupt.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// A checkpoint-like directory of step 7: two safetensors files (written with their digests) and a JSON file.
void make_dir(const testing::TempDir& dir) {
  std::map<std::string, io::FileDigest> digests;
  digests["model.safetensors"] = io::save_safetensors(
      dir.str("model.safetensors"), {{"w", torch::randn({64, 8})}, {"b", torch::randn({8}).to(torch::kBFloat16)}},
      {{"step", "7"}});
  digests["optimizer.safetensors"] =
      io::save_safetensors(dir.str("optimizer.safetensors"), {{"w.exp_avg", torch::randn({64, 8})}}, {{"step", "7"}});
  fs::create_directories(dir.path() / "assets" / "x");
  std::ofstream(dir.str("assets/x/norm_stats.json")) << "{}\n";
  io::write_manifest(dir.str(), 7, digests);
}

void verify(const testing::TempDir& dir) {
  const auto m = io::read_manifest(dir.str());
  REQUIRE(m);
  io::check_manifest(dir.str(), *m);
  io::verify_contents(dir.str(), m);
}

}  // namespace

TEST_CASE("manifest: digests computed while writing equal a re-read, an intact directory verifies", "[unit][io]") {
  testing::TempDir dir;
  make_dir(dir);
  const auto m = io::read_manifest(dir.str());
  REQUIRE(m);
  CHECK(m->step == 7);
  CHECK(m->files.size() == 3);
  for (const auto& [rel, d] : m->files) {
    const auto reread = io::digest_file(dir.str(rel));
    CHECK(reread.size == d.size);
    CHECK(reread.xxh3 == d.xxh3);
    CHECK(d.xxh3.size() == 16);
  }
  CHECK(io::scan_safetensors(dir.str("model.safetensors")).xxh3 == m->files.at("model.safetensors").xxh3);
  CHECK_NOTHROW(verify(dir));
  // The same bytes give the same checksum; one byte more does not.
  std::ofstream(dir.str("a")) << "abc";
  std::ofstream(dir.str("b")) << "abcd";
  CHECK(io::digest_file(dir.str("a")).xxh3 != io::digest_file(dir.str("b")).xxh3);
}

TEST_CASE("manifest: a flipped data bit is named with the file", "[unit][io]") {
  testing::TempDir dir;
  make_dir(dir);
  testing::flip_data_bit(dir.str("optimizer.safetensors"), "w.exp_avg");
  CHECK_NOTHROW(io::check_manifest(dir.str(), *io::read_manifest(dir.str())));  // same size, same header
  CHECK_THROWS_WITH(io::verify_contents(dir.str(), io::read_manifest(dir.str())),
                    Contains(dir.str("optimizer.safetensors")) && Contains("contents differ") &&
                        Contains("changed after it was saved"));
}

TEST_CASE("manifest: a file from another step, a resized, missing or unlisted file", "[unit][io]") {
  testing::TempDir dir;
  make_dir(dir);
  SECTION("copied from step 3") {
    io::save_safetensors(dir.str("optimizer.safetensors"), {{"w.exp_avg", torch::randn({64, 8})}}, {{"step", "3"}});
    CHECK_THROWS_WITH(verify(dir), Contains("optimizer.safetensors") && Contains("holds the state of step 3") &&
                                       Contains("is for step 7"));
  }
  SECTION("resized") {
    std::ofstream(dir.str("assets/x/norm_stats.json"), std::ios::app) << " ";
    CHECK_THROWS_WITH(verify(dir), Contains("norm_stats.json") && Contains("lists"));
  }
  SECTION("missing") {
    fs::remove(dir.str("optimizer.safetensors"));
    CHECK_THROWS_WITH(verify(dir), Contains("optimizer.safetensors") && Contains("missing"));
  }
  SECTION("unlisted") {
    std::ofstream(dir.str("ema.safetensors")) << "x";
    CHECK_THROWS_WITH(verify(dir), Contains("ema.safetensors") && Contains("not listed"));
  }
  SECTION("malformed manifest") {
    std::ofstream(dir.str("manifest.json")) << "{\"format\": 1}";
    CHECK_THROWS_WITH(io::read_manifest(dir.str()), Contains("manifest.json") && Contains("malformed"));
  }
}

TEST_CASE("verification names a non-finite tensor, float32 and bfloat16, with or without a manifest",
          "[unit][io]") {
  testing::TempDir dir;
  make_dir(dir);
  SECTION("float32, manifest") {
    testing::write_nan(dir.str("model.safetensors"), "w", 100);
    // Reported as NaN, not merely as a checksum mismatch: the scan finds it before the hash is compared.
    CHECK_THROWS_WITH(verify(dir), Contains(dir.str("model.safetensors")) && Contains("tensor 'w'") &&
                                       Contains("non-finite"));
  }
  SECTION("bfloat16, no manifest") {
    fs::remove(dir.str("manifest.json"));
    testing::write_nan(dir.str("model.safetensors"), "b", 3);
    CHECK_THROWS_WITH(io::verify_contents(dir.str(), std::nullopt),
                      Contains("model.safetensors") && Contains("tensor 'b'") && Contains("BF16") &&
                          Contains("non-finite"));
  }
  SECTION("infinity in the optimizer state") {
    std::string bytes = testing::read_bytes(dir.str("optimizer.safetensors"));
    io::SafetensorsFile f(dir.str("optimizer.safetensors"));
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(&bytes[f.data_start() + f.info("w.exp_avg").data_begin + 40], &inf, 4);
    testing::write_bytes(dir.str("optimizer.safetensors"), bytes);
    CHECK_THROWS_WITH(io::verify_contents(dir.str(), std::nullopt),
                      Contains("optimizer.safetensors") && Contains("tensor 'w.exp_avg'") && Contains("non-finite"));
  }
}

TEST_CASE("weights: an integer tensor never fills a float parameter, exact dtypes for own checkpoints",
          "[unit][io]") {
  testing::TempDir dir;
  const auto o = model::dummy_options(false);
  model::Pi0 src(o);
  const std::string path = dir.str("model.safetensors");
  io::SaveOptions so;
  so.openpi_layout = false;
  io::save_model_weights(*src, path, so);
  model::Pi0 dst(o);
  SECTION("F32 relabelled I32 (same size): refused, file and tensor named") {
    testing::relabel_dtype(path, "action_in_proj.weight", "F32", "I32");
    CHECK_THROWS_WITH(io::load_model_weights(*dst, path),
                      Contains(path) && Contains("'action_in_proj.weight'") && Contains("Int") &&
                          Contains("floating-point"));
  }
  SECTION("float to float converts for external weights, but not for our own checkpoints") {
    std::vector<std::pair<std::string, torch::Tensor>> bf16;
    for (auto& p : src->named_parameters()) bf16.emplace_back(p.key(), p.value().detach().to(torch::kBFloat16));
    io::save_safetensors(path, bf16);
    testing::relabel_dtype(path, "action_in_proj.weight", "BF16", "F16");
    CHECK_NOTHROW(io::load_model_weights(*dst, path));  // external weights: float types convert
    {
      torch::NoGradGuard no_grad;
      for (auto& p : dst->parameters()) p.set_data(p.data().to(torch::kBFloat16));  // what the file was written from
    }
    io::LoadOptions exact;
    exact.exact_dtypes = true;
    CHECK_THROWS_WITH(io::load_model_weights(*dst, path, exact),
                      Contains(path) && Contains("'action_in_proj.weight'") && Contains("Half") &&
                          Contains("exactly the dtypes its trainer wrote"));
  }
}

TEST_CASE("a negative size in manifest.json is refused as such, not shown as 18446744073709551615",
          "[unit][io]") {
  testing::TempDir dir("pi0manifest");
  make_dir(dir);
  std::string text = testing::read_bytes(dir.str("manifest.json"));
  const auto files = text.find("\"model.safetensors\"");
  REQUIRE(files != std::string::npos);
  const auto size = text.find("\"size\": ", files);
  REQUIRE(size != std::string::npos);
  const auto end = text.find_first_of(",\n}", size + 8);
  text.replace(size + 8, end - (size + 8), "-1");
  testing::write_bytes(dir.str("manifest.json"), text);
  CHECK_THROWS_WITH(io::read_manifest(dir.str()),
                    Contains("manifest.json: malformed (files['model.safetensors'].size is -1, expected a byte count "
                             ">= 0)") && !Contains("18446744073709551615"));
}
