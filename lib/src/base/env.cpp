#include "ddp/env.h"

#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/settings.h"

#include <fstream>
#include <sstream>

namespace ddp {
namespace {

constexpr long kMaxWorld = 1 << 20;

// The names one MPI launcher gives a process's place, when torchrun's are unset.
struct MpiNames {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};
constexpr MpiNames kMpiNames[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"MPICH (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
    {"PMIx", "PMIX_RANK", "", "", ""},
};

// The first host of the MPI hostfile Open MPI was given (mpirun passes OMPI_MCA_* on to the
// ranks; the file itself is only where mpirun's host has it); "" when none.
std::string first_hostfile_host() {
  for (const char* var : {"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_prte_default_hostfile"}) {
    const auto path = env::get(var);
    if (!path) continue;
    std::ifstream in(*path);
    if (!in) {
      // An MPIJob mounts its hostfile on the launcher pod only, where no rank runs.
      throw ConfigError(std::string(var) + "=" + *path +
                        " cannot be read on this host; set MASTER_ADDR to rank 0's host instead "
                        "(mpirun -x MASTER_ADDR=<host>; an MPIJob mounts the hostfile on its "
                        "launcher only)");
    }
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line.substr(0, line.find('#')));
      std::string host;
      if (words >> host) return host;
    }
  }
  return "";
}

// Rank, size and local rank from an MPI launcher (mpirun, mpiexec, an MPIJob), for a program
// started without ddprun or torchrun. false when none set them.
bool read_mpi_place(DistributedEnv& e) {
  for (const auto& names : kMpiNames) {
    const auto rank = env::get_int(names.rank, 0, kMaxWorld);
    if (!rank) continue;
    e.rank = static_cast<int>(*rank);
    const auto size = names.size[0] != '\0' ? env::get_int(names.size, 1, kMaxWorld)
                                            : env::get_int("WORLD_SIZE", 1, kMaxWorld);
    if (!size) {
      throw ConfigError(std::string(names.rank) + " is set (" + names.launcher +
                        ") but not the world size; set WORLD_SIZE, or start the job with ddprun");
    }
    e.world_size = static_cast<int>(*size);
    if (names.local_rank[0] != '\0') {
      e.local_rank = static_cast<int>(env::get_int(names.local_rank, 0, kMaxWorld).value_or(0));
      e.local_world_size =
          static_cast<int>(env::get_int(names.local_size, 1, kMaxWorld).value_or(1));
    }
    if (e.rank >= e.world_size) {
      throw ConfigError(std::string(names.rank) + "=" + std::to_string(e.rank) +
                        " is not below the world size " + std::to_string(e.world_size));
    }
    e.mpi_launcher = names.launcher;
    return true;
  }
  return false;
}

}  // namespace

DistributedEnv DistributedEnv::from_environment() {
  DistributedEnv e;
  if (!env::get("RANK") && !env::get("WORLD_SIZE") && read_mpi_place(e)) {
    // Started by MPI: rank 0 hosts the store at MASTER_ADDR (else the hostfile's first host,
    // else this host when every rank is local), MASTER_PORT (else 29500).
    e.master_port = static_cast<int>(env::get_int("MASTER_PORT", 1, 65535).value_or(29500));
    if (auto addr = env::get("MASTER_ADDR")) {
      e.master_addr = *addr;
    } else if (const std::string host = first_hostfile_host(); !host.empty()) {
      e.master_addr = host;
    } else if (e.world_size > 1 && e.local_world_size != e.world_size) {
      throw ConfigError(std::string("started by ") + e.mpi_launcher + " across hosts, but " +
                        "MASTER_ADDR is unset and no hostfile names rank 0's host; run mpirun "
                        "with -x MASTER_ADDR=<rank 0's host>");
    }
    e.restart_count =
        static_cast<int>(env::get_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30).value_or(0));
    return e;
  }
  e.world_size = static_cast<int>(env::get_int("WORLD_SIZE", 1, kMaxWorld).value_or(1));
  e.rank = static_cast<int>(env::get_int("RANK", 0, kMaxWorld).value_or(0));
  if (e.rank >= e.world_size) {
    throw ConfigError("RANK=" + std::to_string(e.rank) + " is not below WORLD_SIZE=" +
                      std::to_string(e.world_size) + "; ranks run from 0 to WORLD_SIZE-1");
  }
  e.local_world_size =
      static_cast<int>(env::get_int("LOCAL_WORLD_SIZE", 1, e.world_size).value_or(1));
  e.local_rank = static_cast<int>(env::get_int("LOCAL_RANK", 0, kMaxWorld).value_or(0));
  if (env::get("LOCAL_WORLD_SIZE") && e.local_rank >= e.local_world_size) {
    throw ConfigError("LOCAL_RANK=" + std::to_string(e.local_rank) +
                      " is not below LOCAL_WORLD_SIZE=" + std::to_string(e.local_world_size));
  }
  if (auto addr = env::get("MASTER_ADDR")) e.master_addr = *addr;
  e.master_port = static_cast<int>(env::get_int("MASTER_PORT", 1, 65535).value_or(29500));
  if (e.world_size > 1 && (!env::get("MASTER_ADDR") || !env::get("MASTER_PORT"))) {
    throw ConfigError("WORLD_SIZE=" + std::to_string(e.world_size) +
                      " but MASTER_ADDR/MASTER_PORT are not set; start the job with ddprun or "
                      "export both to the rendezvous host and port");
  }
  e.use_agent_store = env::get_bool("TORCHELASTIC_USE_AGENT_STORE").value_or(false);
  e.restart_count =
      static_cast<int>(env::get_int("TORCHELASTIC_RESTART_COUNT", 0, 1 << 30).value_or(0));
  e.run_id = env::get("TORCHELASTIC_RUN_ID").value_or("");
  return e;
}

std::string DistributedEnv::describe() const {
  return "rank " + std::to_string(rank) + "/" + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + "/" + std::to_string(local_world_size) + "), master " +
         master_addr + ":" + std::to_string(master_port) +
         (mpi_launcher.empty() ? "" : ", from " + mpi_launcher);
}

std::chrono::milliseconds collective_timeout_from_environment() {
  const long seconds = settings::integer_or_default(settings::kTimeoutSec);
  return std::chrono::seconds(seconds);
}

}  // namespace ddp
