#pragma once
// The worker side of torchrun's environment contract: what a process started by ddprun (or
// torchrun) reads to find its place in the job.
#include <chrono>
#include <string>

namespace ddp {

struct DistributedEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // TORCHELASTIC_USE_AGENT_STORE=True: the launcher hosts the store, every worker is a client.
  bool use_agent_store = false;
  int restart_count = 0;
  std::string run_id;
  // "Open MPI", "MPICH (PMI)" or "PMIx" when the place came from an MPI launcher; "" otherwise.
  std::string mpi_launcher;

  // Reads RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
  // TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID.
  // With none of them set, describes a single process (rank 0 of 1), unless an MPI launcher
  // placed it: then OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (Open MPI), else
  // PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS (MPICH), else PMIX_RANK with WORLD_SIZE;
  // MASTER_ADDR, else the first host of Open MPI's hostfile (OMPI_MCA_orte_default_hostfile),
  // else this host when all ranks are local; MASTER_PORT, else 29500. Rank 0 hosts the store.
  // Throws ConfigError naming the variable when a value is malformed or contradictory.
  static DistributedEnv from_environment();

  // "rank 1/4 (local 1/2), master 10.0.0.1:29500"
  std::string describe() const;
};

// DDP_TIMEOUT_SEC, else the default of 30 minutes (torch's default collective timeout).
std::chrono::milliseconds collective_timeout_from_environment();

}  // namespace ddp
