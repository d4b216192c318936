#include "pi0/distributed/dist_env.h"

#include <cstdlib>

#include "pi0/common/check.h"

namespace pi0::distributed {
namespace {

using Getenv = std::function<const char*(const char*)>;

bool has(const Getenv& getenv, const char* name) {
  const char* v = getenv(name);
  return v && *v;
}

int64_t int_var(const Getenv& getenv, const char* name, int64_t fallback, int64_t min_value) {
  const char* v = getenv(name);
  if (!v || !*v) return fallback;
  const std::string s(v);
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != s.size() || used == 0) {
    throw UserError(std::string("environment variable ") + name + " must be an integer (got '" + s + "')");
  }
  if (x < min_value) {
    throw UserError(std::string("environment variable ") + name + " must be >= " + std::to_string(min_value) +
                    " (got " + s + ")");
  }
  return x;
}

}  // namespace

std::string first_host_of_nodelist(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  std::string first;
  int depth = 0;
  for (char c : nodelist) {
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (c == ',' && depth == 0) break;
    first += c;
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  const auto close = first.find(']', open);
  if (close == std::string::npos) throw UserError("SLURM_JOB_NODELIST is malformed (got '" + nodelist + "')");
  std::string range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find(','));
  range = range.substr(0, range.find('-'));  // the range's start keeps its zero padding: "003"
  if (range.empty()) throw UserError("SLURM_JOB_NODELIST is malformed (got '" + nodelist + "')");
  return first.substr(0, open) + range + first.substr(close + 1);
}

DistEnv dist_env_from(const Getenv& getenv) {
  DistEnv e;
  if (has(getenv, "RANK") || has(getenv, "WORLD_SIZE")) {
    e.launcher = "torchrun";
    e.rank = int_var(getenv, "RANK", 0, 0);
    e.world_size = int_var(getenv, "WORLD_SIZE", 1, 1);
    e.local_rank = int_var(getenv, "LOCAL_RANK", 0, 0);
    e.restart_count = int_var(getenv, "TORCHELASTIC_RESTART_COUNT", 0, 0);
    const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent && std::string(agent) == "True";
  } else if (has(getenv, "SLURM_PROCID") || has(getenv, "SLURM_NTASKS")) {
    e.launcher = "slurm";
    e.rank = int_var(getenv, "SLURM_PROCID", 0, 0);
    e.world_size = int_var(getenv, "SLURM_NTASKS", 1, 1);
    e.local_rank = int_var(getenv, "SLURM_LOCALID", 0, 0);
    if (!has(getenv, "MASTER_ADDR") && e.world_size > 1) {
      if (!has(getenv, "SLURM_JOB_NODELIST")) {
        throw UserError("SLURM_NTASKS=" + std::to_string(e.world_size) +
                        " but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; export MASTER_ADDR=<host of rank 0>");
      }
      e.master_addr = first_host_of_nodelist(getenv("SLURM_JOB_NODELIST"));
    }
    e.master_port = 20000 + int_var(getenv, "SLURM_JOB_ID", 9500, 0) % 20000;
  } else {
    return e;
  }
  if (has(getenv, "MASTER_ADDR")) e.master_addr = getenv("MASTER_ADDR");
  e.master_port = int_var(getenv, "MASTER_PORT", e.master_port, 1);
  if (e.master_port > 65535) {
    throw UserError("environment variable MASTER_PORT must be a TCP port, 1 … 65535 (got " +
                    std::to_string(e.master_port) + ")");
  }
  const char* rank_var = e.launcher == "torchrun" ? "RANK" : "SLURM_PROCID";
  const char* world_var = e.launcher == "torchrun" ? "WORLD_SIZE" : "SLURM_NTASKS";
  if (e.rank >= e.world_size) {
    throw UserError(std::string("environment variable ") + rank_var + "=" + std::to_string(e.rank) +
                    " must be < " + world_var + "=" + std::to_string(e.world_size));
  }
  return e;
}

DistEnv dist_env_from_environment() {
  return dist_env_from([](const char* name) { return std::getenv(name); });
}

}  // namespace pi0::distributed
