#include "pi0/train/metrics.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/files.h"
#include "pi0/common/fs.h"

namespace pi0::train {

MetricsWriter::MetricsWriter(const std::string& path, int64_t drop_from_step) : path_(path) {
  namespace fs = pi0::posix_fs;
  const fs::path p(path);
  if (p.has_parent_path()) create_directories_or_throw(p.parent_path().string(), "metrics directory");
  require_output_file(path);  // appending to a FIFO would block, to a device would lose the records
  if (drop_from_step >= 0 && fs::exists(p)) {
    std::vector<nlohmann::json> kept;
    for (auto& r : read_metrics(path))
      if (!(r.contains("step") && r["step"].is_number() && r["step"].get<int64_t>() >= drop_from_step))
        kept.push_back(std::move(r));
    std::string text;
    for (const auto& r : kept) text += r.dump() + "\n";
    write_file_atomic(path, text);
  }
  out_.open(path, std::ios::app);
  if (!out_) throw UserError("cannot open metrics file '" + path + "' for writing");
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << "\n";
  out_.flush();
  if (!tensorboard_ || !record.contains("step") || !record["step"].is_number_integer()) return;
  std::map<std::string, double> values;
  for (auto it = record.begin(); it != record.end(); ++it)
    if (it.key() != "step" && it.value().is_number()) values[it.key()] = it.value().get<double>();
  if (!values.empty()) tensorboard_->add_scalars(record["step"].get<int64_t>(), values);
}

void MetricsWriter::write(int64_t step, const std::map<std::string, double>& values) {
  nlohmann::json record;
  record["step"] = step;
  for (const auto& [k, v] : values) record[k] = v;
  write(record);
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
  if (const auto problem = input_file_problem(path); !problem.empty())
    throw UserError("cannot read metrics file '" + path + "' (" + problem + ")");
  std::ifstream in(path);
  if (!in) throw UserError("cannot read metrics file '" + path + "'");
  std::vector<nlohmann::json> records;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object()) records.push_back(std::move(j));
  }
  return records;
}

}  // namespace pi0::train
