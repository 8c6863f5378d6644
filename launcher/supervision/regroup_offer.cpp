#include "supervision/regroup_offer.h"

#include <filesystem>
#include <fstream>

#include "ddp/error.h"

namespace ddprun {
namespace {

// The worker environment's variables that change from round to round (worker_env.h).
constexpr const char* kPlaceVariables[] = {"RANK",
                                           "LOCAL_RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_WORLD_SIZE",
                                           "GROUP_RANK",
                                           "GROUP_WORLD_SIZE",
                                           "ROLE_RANK",
                                           "ROLE_WORLD_SIZE",
                                           "MASTER_ADDR",
                                           "MASTER_PORT",
                                           "TORCHELASTIC_RESTART_COUNT",
                                           "TORCHELASTIC_USE_AGENT_STORE",
                                           "TORCHELASTIC_RUN_ID"};

}  // namespace

bool regroups_for(const FailureReport& cause) {
  return cause.kind == "membership" || cause.kind == "store" || cause.is_loss();
}

std::string regroup_notice(const FailureReport& cause) {
  const bool lost = cause.kind == "lost" || cause.kind == "store";
  const char* kind = cause.kind == "membership" ? "regroup after step: "
                     : lost                     ? "regroup: "
                                                : "regroup when stopped: ";
  return kind + cause.headline();
}

bool offers_regroup(const std::string& regroup_file) {
  std::error_code ec;
  return !regroup_file.empty() && std::filesystem::exists(regroup_file + ".able", ec);
}

bool answered_regroup(const std::string& regroup_file) {
  std::error_code ec;
  return !regroup_file.empty() && std::filesystem::exists(regroup_file + ".ready", ec);
}

void write_place(const std::string& regroup_file, const EnvMap& env) {
  const std::string partial = regroup_file + ".partial";
  {
    std::ofstream out(partial);
    for (const char* name : kPlaceVariables) {
      if (auto it = env.find(name); it != env.end()) out << name << '=' << it->second << '\n';
    }
    if (!out) throw ddp::Error("cannot write a worker's place into " + partial);
  }
  std::filesystem::rename(partial, regroup_file);
}

long regroup_wait_seconds(const RendezvousSettings& rdzv) {
  const auto wait =
      rdzv.keep_alive_interval * (rdzv.keep_alive_max_attempt + 2) + std::chrono::seconds(5);
  return static_cast<long>(std::chrono::ceil<std::chrono::seconds>(wait).count());
}

}  // namespace ddprun
