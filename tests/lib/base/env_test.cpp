#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "ddp/env.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"

namespace ddp {
namespace {

// Sets variables for one test and restores the previous environment afterwards.
class ScopedEnv {
 public:
  ScopedEnv() {
    for (const char* name : kNames) {
      const char* v = std::getenv(name);
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const auto& [name, value] : saved_) {
      if (value)
        setenv(name, value->c_str(), 1);
      else
        unsetenv(name);
    }
  }
  void set(const char* name, const char* value) { setenv(name, value, 1); }

 private:
  static constexpr const char* kNames[] = {"RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "TORCHELASTIC_USE_AGENT_STORE",
                                           "TORCHELASTIC_RESTART_COUNT",
                                           "TORCHELASTIC_RUN_ID",
                                           "DDP_TIMEOUT_SEC",
                                           "DDP_TEST_VALUE",
                                           "OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "OMPI_MCA_orte_default_hostfile",
                                           "OMPI_MCA_prte_default_hostfile",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "MPI_LOCALNRANKS",
                                           "PMIX_RANK"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

std::string config_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(DistributedEnv, EmptyEnvironmentIsOneProcess) {
  ScopedEnv env;
  auto e = DistributedEnv::from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_FALSE(e.use_agent_store);
}

TEST(DistributedEnv, ReadsTheTorchrunContract) {
  ScopedEnv env;
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "train-0.train");
  env.set("MASTER_PORT", "29400");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  env.set("TORCHELASTIC_RUN_ID", "job7");
  auto e = DistributedEnv::from_environment();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "train-0.train");
  EXPECT_EQ(e.master_port, 29400);
  EXPECT_TRUE(e.use_agent_store);
  EXPECT_EQ(e.restart_count, 2);
  EXPECT_EQ(e.run_id, "job7");
  EXPECT_EQ(e.describe(), "rank 3/4 (local 1/2), master train-0.train:29400");
}

// What mpirun gives a rank of Open MPI ("" leaves a variable unset).
void set_ompi(ScopedEnv& env, const char* rank, const char* size, const char* local_rank,
              const char* local_size) {
  const std::pair<const char*, const char*> vars[] = {{"OMPI_COMM_WORLD_RANK", rank},
                                                      {"OMPI_COMM_WORLD_SIZE", size},
                                                      {"OMPI_COMM_WORLD_LOCAL_RANK", local_rank},
                                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", local_size}};
  for (const auto& [name, value] : vars) {
    if (value[0] != '\0') env.set(name, value);
  }
}

// The ConfigError's text of reading the environment now ("" when none).
std::string env_error() {
  return config_error_of([] { DistributedEnv::from_environment(); });
}

TEST(DistributedEnv, OpenMpiPlacesARankStartedByMpirun) {
  ScopedEnv env;
  set_ompi(env, "3", "4", "1", "2");
  env.set("MASTER_ADDR", "node-a");
  const auto e = DistributedEnv::from_environment();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node-a");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_FALSE(e.use_agent_store);  // rank 0 hosts the store
  EXPECT_EQ(e.describe(), "rank 3/4 (local 1/2), master node-a:29500, from Open MPI");
}

TEST(DistributedEnv, MpiRanksOnOneHostNeedNoMasterAddress) {
  ScopedEnv env;
  env.set("PMI_RANK", "1");
  env.set("PMI_SIZE", "2");
  env.set("MPI_LOCALRANKID", "1");
  env.set("MPI_LOCALNRANKS", "2");
  const auto e = DistributedEnv::from_environment();
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.mpi_launcher, "MPICH (PMI)");
}

TEST(DistributedEnv, TheHostfilesFirstHostIsTheMaster) {
  ScopedEnv env;
  char path[] = "/tmp/ddp-hostfile-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string text =
      "# MPIJob hostfile\n\nmpi-worker-0.mpi slots=2\nmpi-worker-1.mpi slots=2\n";
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  set_ompi(env, "2", "4", "", "2");
  env.set("OMPI_MCA_orte_default_hostfile", path);
  EXPECT_EQ(DistributedEnv::from_environment().master_addr, "mpi-worker-0.mpi");
  unlink(path);
  EXPECT_NE(env_error().find("cannot be read on this host; set MASTER_ADDR"), std::string::npos);
  // An MPIJob's worker pods lack the launcher's hostfile: MASTER_ADDR from mpirun -x wins.
  env.set("MASTER_ADDR", "mpi-worker-0.mpi");
  EXPECT_EQ(DistributedEnv::from_environment().master_addr, "mpi-worker-0.mpi");
}

TEST(DistributedEnv, MpiAcrossHostsWithoutAMasterOrSizeFailsClearly) {
  ScopedEnv env;
  set_ompi(env, "2", "4", "", "2");
  EXPECT_NE(env_error().find("started by Open MPI across hosts, but MASTER_ADDR is unset"),
            std::string::npos);
  ScopedEnv pmix;
  pmix.set("PMIX_RANK", "0");
  EXPECT_EQ(env_error(),
            "PMIX_RANK is set (PMIx) but not the world size; set WORLD_SIZE, or start the job "
            "with ddprun");
  set_ompi(pmix, "5", "4", "", "");
  EXPECT_NE(env_error().find("OMPI_COMM_WORLD_RANK=5 is not below the world size 4"),
            std::string::npos);
}

// torchrun's variables win: a ddprun worker inside an MPI allocation keeps ddprun's ranks.
TEST(DistributedEnv, TorchrunsVariablesWinOverMpis) {
  ScopedEnv env;
  set_ompi(env, "1", "2", "", "");
  env.set("RANK", "0");
  env.set("WORLD_SIZE", "1");
  const auto e = DistributedEnv::from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.mpi_launcher, "");
}

TEST(DistributedEnv, RankAtOrAboveWorldIsRejectedWithBothNames) {
  ScopedEnv env;
  env.set("RANK", "4");
  env.set("WORLD_SIZE", "4");
  env.set("MASTER_ADDR", "x");
  env.set("MASTER_PORT", "1");
  auto msg = env_error();
  EXPECT_NE(msg.find("RANK=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("WORLD_SIZE=4"), std::string::npos) << msg;
}

TEST(DistributedEnv, NonNumericValueNamesTheVariable) {
  ScopedEnv env;
  env.set("WORLD_SIZE", "two");
  auto msg = env_error();
  EXPECT_NE(msg.find("WORLD_SIZE='two' is not an integer"), std::string::npos) << msg;
}

TEST(DistributedEnv, PortOutOfRange) {
  ScopedEnv env;
  env.set("MASTER_PORT", "70000");
  auto msg = env_error();
  EXPECT_NE(msg.find("MASTER_PORT=70000 is out of range"), std::string::npos) << msg;
}

TEST(DistributedEnv, MultiRankWithoutMasterSaysHowToFix) {
  ScopedEnv env;
  env.set("WORLD_SIZE", "2");
  env.set("RANK", "1");
  auto msg = env_error();
  EXPECT_NE(msg.find("MASTER_ADDR/MASTER_PORT are not set"), std::string::npos) << msg;
}

TEST(DistributedEnv, LocalRankMustBeBelowLocalWorld) {
  ScopedEnv env;
  env.set("LOCAL_WORLD_SIZE", "1");
  env.set("LOCAL_RANK", "1");
  EXPECT_NE(env_error(), "");
}

TEST(EnvVars, BooleansAcceptCommonSpellings) {
  for (const char* yes : {"1", "true", "True", "YES", "on"}) EXPECT_TRUE(env::parse_bool("X", yes));
  for (const char* no : {"0", "false", "False", "no", "OFF"})
    EXPECT_FALSE(env::parse_bool("X", no));
  EXPECT_THROW(env::parse_bool("X", "maybe"), ConfigError);
}

TEST(EnvVars, IntegersRejectTrailingJunkAndOverflow) {
  EXPECT_EQ(env::parse_int("X", "42", 0, 100), 42);
  EXPECT_THROW(env::parse_int("X", "42abc", 0, 100), ConfigError);
  EXPECT_THROW(env::parse_int("X", "", 0, 100), ConfigError);
  EXPECT_THROW(env::parse_int("X", "99999999999999999999999", 0, 100), ConfigError);
  EXPECT_THROW(env::parse_int("X", "-1", 0, 100), ConfigError);
}

// settings::spelling's error for a value outside its choices (tests/lib/settings_test.cpp reads
// one through a setting).
TEST(EnvVars, AnUnknownChoiceIsAnErrorListingTheSpellings) {
  EXPECT_EQ(config_error_of([] {
              env::unknown_choice("DDP_TEST_VALUE", "Pear", {"apple", "pear", "plum"});
            }),
            "DDP_TEST_VALUE='Pear' is not known; use apple, pear or plum");
}

TEST(EnvVars, EmptyCountsAsUnset) {
  ScopedEnv env;
  env.set("DDP_TEST_VALUE", "");
  EXPECT_FALSE(env::get("DDP_TEST_VALUE").has_value());
  EXPECT_FALSE(env::get_int("DDP_TEST_VALUE", 0, 10).has_value());
}

TEST(CollectiveTimeout, DefaultsToThirtyMinutesAndReadsSeconds) {
  ScopedEnv env;
  EXPECT_EQ(collective_timeout_from_environment(), std::chrono::minutes(30));
  env.set("DDP_TIMEOUT_SEC", "90");
  EXPECT_EQ(collective_timeout_from_environment(), std::chrono::seconds(90));
  env.set("DDP_TIMEOUT_SEC", "0");
  EXPECT_THROW(collective_timeout_from_environment(), ConfigError);
}

}  // namespace
}  // namespace ddp
