#include "pi0/train/metrics.h"

#include <filesystem>

#include "pi0/common/check.h"
#include "pi0/common/fs.h"

namespace pi0::train {

MetricsWriter::MetricsWriter(const std::string& path, int64_t drop_from_step) : path_(path) {
  namespace fs = pi0::posix_fs;
  const fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (drop_from_step >= 0 && fs::exists(p)) {
    std::vector<nlohmann::json> kept;
    for (auto& r : read_metrics(path))
      if (!(r.contains("step") && r["step"].is_number() && r["step"].get<int64_t>() >= drop_from_step))
        kept.push_back(std::move(r));
    const auto tmp = path + ".tmp";
    {
      std::ofstream rewrite(tmp, std::ios::trunc);
      for (const auto& r : kept) rewrite << r.dump() << "\n";
      if (!rewrite) throw UserError("cannot write metrics file '" + tmp + "'");
    }
    fs::rename(tmp, p);
  }
  out_.open(path, std::ios::app);
  if (!out_) throw UserError("cannot open metrics file '" + path + "' for writing");
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << "\n";
  out_.flush();
}

void MetricsWriter::write(int64_t step, const std::map<std::string, double>& values) {
  nlohmann::json record;
  record["step"] = step;
  for (const auto& [k, v] : values) record[k] = v;
  write(record);
}

std::vector<nlohmann::json> read_metrics(const std::string& path) {
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
