// Where this process sits in a data-parallel job: rank, world size, local rank and the rendezvous address, read
// from the launcher's environment (torchrun or SLURM srun). No torch includes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace pi0::distributed {

struct DistEnv {
  int64_t rank = 0;             ///< global rank, 0 … world_size − 1
  int64_t world_size = 1;       ///< number of processes in the job
  int64_t local_rank = 0;       ///< rank on this node: picks the GPU (cuda:local_rank)
  std::string master_addr = "127.0.0.1";  ///< host of rank 0's TCPStore (rendezvous)
  int64_t master_port = 29500;  ///< port of the TCPStore
  /// torchrun's agent already hosts a TCPStore at master_addr:master_port (TORCHELASTIC_USE_AGENT_STORE=True):
  /// every rank connects as a client instead of rank 0 hosting one.
  bool agent_store = false;
  int64_t restart_count = 0;    ///< TORCHELASTIC_RESTART_COUNT: store keys are prefixed per attempt
  std::string launcher = "none";  ///< "torchrun", "slurm" or "none" (single process)

  bool distributed() const { return world_size > 1; }
};

/// Reads the environment: torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT when RANK or
/// WORLD_SIZE is set, else SLURM's SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, the master being MASTER_ADDR or
/// the first host of SLURM_JOB_NODELIST and the port MASTER_PORT or 20000 + SLURM_JOB_ID mod 20000 (so two jobs
/// sharing a node do not collide). Nothing set → a single process. Throws pi0::UserError naming the variable on a
/// malformed or inconsistent value.
DistEnv dist_env_from_environment();
/// Same with an injectable getenv (tests).
DistEnv dist_env_from(const std::function<const char*(const char*)>& getenv);

/// First host of a SLURM node list: "gpu[003-005,9],cpu1" → "gpu003"; "node7" → "node7".
std::string first_host_of_nodelist(const std::string& nodelist);

}  // namespace pi0::distributed
