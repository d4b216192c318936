// Damaging files on purpose, as disks, copies and hand edits do: tests of checkpoint and bundle verification.
#pragma once
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "pi0/io/checkpoint_dir.h"
#include "pi0/io/checkpoint_files.h"
#include "pi0/io/manifest.h"
#include "pi0/io/safetensors.h"

namespace pi0::testing {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.flush());
}

/// Rewrites the header dtype of tensor `name` from `from` to `to` (same element size, e.g. F32 -> I32,
/// BF16 -> F16), in place: the file stays a valid safetensors file of the same size.
inline void relabel_dtype(const std::string& path, const std::string& name, const std::string& from,
                          const std::string& to) {
  REQUIRE(from.size() >= to.size());
  std::string bytes = read_bytes(path);
  const auto entry = bytes.find("\"" + name + "\":");
  REQUIRE(entry != std::string::npos);
  const auto dtype = bytes.find("\"dtype\":\"" + from + "\"", entry);
  REQUIRE(dtype != std::string::npos);
  REQUIRE(dtype < bytes.find('}', entry));  // inside this tensor's entry
  // A shorter name (BF16 -> F16) is padded with JSON whitespace before it, so the header keeps its length.
  bytes.replace(dtype + 8, from.size() + 2, std::string(from.size() - to.size(), ' ') + "\"" + to + "\"");
  write_bytes(path, bytes);
}

/// Flips one bit of the data of tensor `name` (its first byte).
inline void flip_data_bit(const std::string& path, const std::string& name) {
  uint64_t at = 0;
  {
    io::SafetensorsFile f(path);
    at = f.data_start() + f.info(name).data_begin;
  }
  std::string bytes = read_bytes(path);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x10);
  write_bytes(path, bytes);
}

/// Writes a NaN over element `index` of the float32 or bfloat16 tensor `name`.
inline void write_nan(const std::string& path, const std::string& name, int64_t index = 0) {
  uint64_t at = 0;
  size_t elem = 0;
  {
    io::SafetensorsFile f(path);
    const auto& info = f.info(name);
    REQUIRE((info.dtype == "F32" || info.dtype == "BF16"));
    elem = info.dtype == "F32" ? 4 : 2;
    at = f.data_start() + info.data_begin + static_cast<uint64_t>(index) * elem;
  }
  std::string bytes = read_bytes(path);
  const uint32_t nan = 0x7fc00000u;  // a quiet NaN; its top two bytes are bfloat16's quiet NaN
  if (elem == 4) std::memcpy(&bytes[at], &nan, 4);
  else std::memcpy(&bytes[at], reinterpret_cast<const char*>(&nan) + 2, 2);
  write_bytes(path, bytes);
}

/// Sets trainer_state.json's "val_loss" of checkpoint `step` in `run_dir`. With `reseal` the manifest is written
/// anew (a checkpoint that verifies with that value, as if its pass had measured it); without it the file no longer
/// matches the manifest (edited after the fact).
inline void set_val_loss(const std::string& run_dir, int64_t step, double value, bool reseal) {
  const auto dir = io::checkpoint_path(run_dir, step);
  const auto file = dir + "/" + io::kTrainerStateFile;
  nlohmann::json j;
  std::ifstream(file) >> j;
  j["val_loss"] = value;
  std::ofstream(file) << j.dump(2) << "\n";
  if (reseal) io::write_manifest(dir, step);
}

}  // namespace pi0::testing
