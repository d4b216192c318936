#include "pi0/io/sharded_state.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "pi0/common/check.h"
#include "pi0/common/fs.h"
#include "pi0/io/safetensors.h"

namespace pi0::io {
namespace fs = pi0::posix_fs;

namespace {
constexpr const char* kPiecesKey = "pieces";
}


std::string state_file_name(const std::string& prefix, int64_t rank, int64_t world_size) {
  if (world_size == 1) return prefix + ".safetensors";
  return prefix + ".rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

std::vector<std::string> state_files(const std::string& dir, const std::string& prefix) {
  const fs::path d(dir);
  const bool single = fs::exists(d / (prefix + ".safetensors"));
  const std::regex shard_re(prefix + R"(\.rank(\d+)-of-(\d+)\.safetensors)");
  std::map<int64_t, std::string> ranks;
  int64_t world = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(d, ec)) {
    const auto name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, shard_re)) continue;
    const int64_t r = std::stoll(m[1]), w = std::stoll(m[2]);
    if (world != 0 && w != world)
      throw UserError((d / name).string() + ": written by a world of " + std::to_string(w) + " ranks, but " +
                      ranks.begin()->second + " by " + std::to_string(world));
    world = w;
    ranks[r] = e.path().string();
  }
  if (single && !ranks.empty())
    throw UserError(dir + ": holds both " + prefix + ".safetensors and per-rank " + prefix +
                    ".rank*-of-*.safetensors files; expected one form");
  if (single) return {(d / (prefix + ".safetensors")).string()};
  std::vector<std::string> out;
  for (int64_t r = 0; r < world; ++r) {
    auto it = ranks.find(r);
    if (it == ranks.end())
      throw UserError((d / state_file_name(prefix, r, world)).string() + ": missing from the checkpoint");
    out.push_back(it->second);
  }
  if (static_cast<int64_t>(ranks.size()) != world)
    throw UserError(dir + ": " + prefix + " files for ranks beyond the world size " + std::to_string(world));
  return out;
}

FileDigest save_state_pieces(const std::string& path, const std::vector<StatePiece>& pieces,
                             const std::vector<std::pair<std::string, torch::Tensor>>& whole,
                             std::map<std::string, std::string> metadata) {
  nlohmann::json ranges = nlohmann::json::object();
  std::vector<std::pair<std::string, torch::Tensor>> tensors = whole;
  for (const auto& p : pieces) {
    PI0_CHECK(p.data.dim() == 1, "save_state_pieces: piece of '", p.name, "' is not 1-D");
    ranges[p.name] = {p.begin, p.begin + p.data.numel(), p.numel};
    tensors.emplace_back(p.name, p.data);
  }
  metadata[kPiecesKey] = ranges.dump();
  return save_safetensors(path, tensors, metadata);
}

StateReader::StateReader(const std::vector<std::string>& files) : files_(files) {
  for (size_t f = 0; f < files.size(); ++f) {
    opened_.push_back(std::make_unique<SafetensorsFile>(files[f], AccessPattern::kSequential));
    const auto& file = *opened_.back();
    nlohmann::json ranges = nlohmann::json::object();
    if (auto it = file.metadata().find(kPiecesKey); it != file.metadata().end()) {
      try {
        ranges = nlohmann::json::parse(it->second);
      } catch (const std::exception& e) {
        throw UserError(file.path() + ": metadata '" + kPiecesKey + "' is not valid JSON (" + e.what() + ")");
      }
      if (!ranges.is_object()) throw UserError(file.path() + ": metadata '" + kPiecesKey + "' must be a JSON object");
    }
    for (const auto& key : file.names()) {
      Stored s;
      s.file = f;
      s.key = key;
      int64_t numel = file.info(key).numel();
      if (ranges.contains(key)) {
        const auto& r = ranges[key];
        if (!r.is_array() || r.size() != 3 || !r[0].is_number_integer() || !r[1].is_number_integer() ||
            !r[2].is_number_integer() || r[0].get<int64_t>() < 0 || r[1].get<int64_t>() < r[0].get<int64_t>() ||
            r[2].get<int64_t>() < r[1].get<int64_t>() || r[1].get<int64_t>() - r[0].get<int64_t>() != numel) {
          throw UserError(file.path() + ": range of '" + key + "' in metadata '" + kPiecesKey + "' is " + r.dump() +
                          "; expected [begin, end, numel] matching its " + std::to_string(numel) + " elements");
        }
        s.begin = r[0].get<int64_t>();
        s.end = r[1].get<int64_t>();
        numel = r[2].get<int64_t>();
      } else {
        s.end = numel;
        s.whole = true;
      }
      auto [it, fresh] = numels_.emplace(key, numel);
      if (!fresh && it->second != numel)
        throw UserError(file.path() + ": '" + key + "' has " + std::to_string(numel) + " elements, but " +
                        std::to_string(it->second) + " in another shard of the same state");
      stored_[key].push_back(s);
    }
  }
}

StateReader::~StateReader() = default;
StateReader::StateReader(StateReader&&) noexcept = default;
StateReader& StateReader::operator=(StateReader&&) noexcept = default;

std::string StateReader::describe() const {
  std::string out;
  for (const auto& f : files_) out += (out.empty() ? "" : ", ") + f;
  return out;
}

void StateReader::read(const std::vector<Request>& requests, bool exact_dtype) const {
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> streamed(opened_.size());
  torch::NoGradGuard no_grad;
  for (const auto& req : requests) {
    const auto it = stored_.find(req.name);
    if (it == stored_.end()) throw UserError(describe() + ": no tensor '" + req.name + "'");
    PI0_CHECK(req.dst.is_contiguous(), "StateReader: destination of '", req.name, "' is not contiguous");
    const int64_t begin = req.begin, end = req.begin + req.dst.numel();
    auto flat = req.dst.view({-1});
    int64_t covered = 0;
    bool exact = false;
    for (const auto& s : it->second) {
      const auto& file = *opened_[s.file];
      if (exact_dtype && file.info(s.key).scalar_type != req.dst.scalar_type()) {
        throw UserError(file.path() + ": tensor '" + s.key + "' is stored as " +
                        std::string(c10::toString(file.info(s.key).scalar_type)) + ", expected " +
                        std::string(c10::toString(req.dst.scalar_type())) +
                        " (a checkpoint holds exactly the dtypes its trainer wrote: the file was altered)");
      }
      if (s.begin == begin && s.end == end) {
        // The common case (same partition, or whole tensors): stream it in file order below.
        const auto& shape = file.info(s.key).shape;
        streamed[s.file].emplace_back(s.key, s.whole ? req.dst.view(shape) : flat);
        exact = true;
        break;
      }
      const int64_t lo = std::max(begin, s.begin), hi = std::min(end, s.end);
      if (lo >= hi) continue;
      flat.narrow(0, lo - begin, hi - lo).copy_(file.get(s.key).view({-1}).narrow(0, lo - s.begin, hi - lo));
      covered += hi - lo;
    }
    if (!exact && covered != end - begin) {
      // Stored pieces never overlap (one owner per element), so a shortfall means missing elements.
      throw UserError(describe() + ": elements " + std::to_string(begin) + " to " + std::to_string(end) + " of '" +
                      req.name + "' are not all stored (" + std::to_string(covered) + " of " +
                      std::to_string(end - begin) + " found): a shard file is incomplete or from another run");
    }
  }
  for (size_t f = 0; f < streamed.size(); ++f)
    if (!streamed[f].empty()) opened_[f]->read_into_many(streamed[f]);
}

}  // namespace pi0::io
