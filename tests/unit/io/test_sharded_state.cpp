// Sharded training state on disk (io/sharded_state.h): pieces written by the ranks of one partition read back
// into any other partition, whole tensors included, and every inconsistency named.
#include <catch2/catch.hpp>

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/distributed/shard_layout.h"
#include "pi0/io/safetensors.h"
#include "pi0/io/sharded_state.h"
#include "support/test_support.h"

using namespace pi0;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// Tensors "a" [6, 5] and "b" [7] as the ranks of a `world`-rank layout write them, plus a whole "step".
std::map<std::string, torch::Tensor> write_state(const std::string& dir, int64_t world) {
  std::map<std::string, torch::Tensor> full = {{"a", torch::arange(30, torch::kFloat32).view({6, 5})},
                                               {"b", torch::arange(100, 107, torch::kFloat32)}};
  const std::vector<std::string> names = {"a", "b"};
  const distributed::ShardLayout layout({30, 7}, {4, 4}, world);
  for (int64_t r = 0; r < world; ++r) {
    std::vector<io::StatePiece> pieces;
    for (const auto& p : layout.owned_by(r)) {
      const auto& name = names[p.param];
      pieces.push_back({name, p.begin, full[name].numel(), full[name].reshape({-1}).narrow(0, p.begin, p.numel())});
    }
    io::save_state_pieces((fs::path(dir) / io::state_file_name("opt", r, world)).string(), pieces,
                          {{"step", torch::tensor(int64_t{9})}}, {{"step", "9"}});
  }
  return full;
}

}  // namespace

TEST_CASE("sharded state: any partition reads back what any other wrote", "[unit][io][shard]") {
  const int64_t written = GENERATE(1, 2, 3);
  testing::TempDir dir("pi0shst");
  std::map<std::string, torch::Tensor> full;
  if (written == 1) {
    full = {{"a", torch::arange(30, torch::kFloat32).view({6, 5})}, {"b", torch::arange(100, 107, torch::kFloat32)}};
    io::save_safetensors(dir.str("opt.safetensors"), {{"a", full["a"]}, {"b", full["b"]}, {"step", torch::tensor(int64_t{9})}});
  } else {
    full = write_state(dir.str(), written);
  }
  const auto files = io::state_files(dir.str(), "opt");
  REQUIRE(static_cast<int64_t>(files.size()) == written);
  io::StateReader reader(files);
  CHECK(reader.numels().at("a") == 30);
  CHECK(reader.numels().at("b") == 7);
  CHECK(reader.numels().at("step") == 1);
  for (int64_t world : {1, 2, 4}) {
    INFO("written by " << written << " ranks, read by " << world);
    const distributed::ShardLayout layout({30, 7}, {4, 4}, world);
    const std::vector<std::string> names = {"a", "b"};
    for (int64_t r = 0; r < world; ++r) {
      std::vector<io::StateReader::Request> requests;
      std::vector<std::pair<std::string, distributed::Piece>> wanted;
      for (const auto& p : layout.owned_by(r)) {
        requests.push_back({names[p.param], p.begin, torch::zeros({p.numel()})});
        wanted.emplace_back(names[p.param], p);
      }
      auto step = torch::zeros({1}, torch::kInt64);
      requests.push_back({"step", 0, step});
      reader.read(requests, /*exact_dtype=*/true);
      CHECK(step.item<int64_t>() == 9);
      for (size_t k = 0; k < wanted.size(); ++k) {
        const auto& [name, p] = wanted[k];
        CHECK(torch::equal(requests[k].dst, full[name].reshape({-1}).narrow(0, p.begin, p.numel())));
      }
    }
  }
  // Whole tensors, in another dtype when the reader allows it (export to bf16).
  auto a = torch::zeros({6, 5}, torch::kBFloat16);
  reader.read({{"a", 0, a}}, /*exact_dtype=*/false);
  CHECK(torch::equal(a, full["a"].to(torch::kBFloat16)));
  CHECK_THROWS_WITH(reader.read({{"a", 0, torch::zeros({30}, torch::kBFloat16)}}, /*exact_dtype=*/true),
                    Contains("is stored as Float, expected BFloat16"));
}

TEST_CASE("sharded state: missing or inconsistent files are named", "[unit][io][shard]") {
  testing::TempDir dir("pi0shst_bad");
  CHECK(io::state_files(dir.str(), "opt").empty());
  write_state(dir.str(), 3);
  fs::remove(dir.str(io::state_file_name("opt", 1, 3)));
  CHECK_THROWS_WITH(io::state_files(dir.str(), "opt"), Contains("opt.rank1-of-3.safetensors: missing from the checkpoint"));
  // The surviving files alone do not hold every element.
  io::StateReader partial({dir.str(io::state_file_name("opt", 0, 3)), dir.str(io::state_file_name("opt", 2, 3))});
  const auto both = partial.numels().count("a") ? "a" : "b";
  CHECK_THROWS_WITH(partial.read({{both, 0, torch::zeros({partial.numels().at(both)})}}, true),
                    Contains("are not all stored"));
  // A file of another world size beside them.
  write_state(dir.str(), 2);
  CHECK_THROWS_WITH(io::state_files(dir.str(), "opt"), Contains("written by a world of"));
  testing::TempDir mixed("pi0shst_mixed");
  write_state(mixed.str(), 2);
  io::save_safetensors(mixed.str("opt.safetensors"), {{"a", torch::zeros({30})}});
  CHECK_THROWS_WITH(io::state_files(mixed.str(), "opt"), Contains("expected one form"));
  // A range that does not match the stored tensor.
  testing::TempDir forged("pi0shst_forged");
  io::save_safetensors(forged.str("opt.rank0-of-1.safetensors"), {{"a", torch::zeros({4})}},
                       {{"pieces", R"({"a": [0, 5, 30]})"}});
  CHECK_THROWS_WITH(io::StateReader({forged.str("opt.rank0-of-1.safetensors")}),
                    Contains("range of 'a' in metadata 'pieces' is [0,5,30]"));
}
