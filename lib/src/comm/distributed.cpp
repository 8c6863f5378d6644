#include "ddp/distributed.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "comm/abort_notice.h"
#include "ddp/comm/factory.h"
#include "ddp/env_vars.h"
#include "ddp/error.h"
#include "ddp/log.h"
#include "ddp/settings.h"

namespace ddp {
namespace {

using detail::AbortNotice;

constexpr auto kPlacePoll = std::chrono::milliseconds(20);
constexpr auto kPlaceWait = std::chrono::minutes(15);

// "" where ddprun offers no regrouping (or no ddprun started this process).
std::string regroup_file() {
  const auto file = settings::text(settings::kRegroupFile);
  return file ? *file : std::string();
}

// The store and communicator of `group.env`'s place.
void connect(ProcessGroup& group) {
  CommOptions options;
  options.timeout = collective_timeout_from_environment();
  const std::string backend = backend_from_env();
  group.store = Store::from_env(group.env, options.timeout);
  // A restarted group (or a regrouped one: a round of its own) must not read the previous
  // attempt's keys.
  auto scoped = group.store->with_prefix("ddp/" + std::to_string(group.env.restart_count));
  group.comm = create_communicator(backend, scoped, group.env.rank, group.env.world_size, options);
  log::info("joined as {} with backend {}", group.env.describe(), backend);
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string partial = path + ".partial";
  std::ofstream(partial) << text;
  std::filesystem::rename(partial, path);
}

// The place ddprun wrote into `path` (NAME=VALUE lines), once it is there.
std::map<std::string, std::string> wait_for_place(const std::string& path, int rank) {
  const auto deadline = std::chrono::steady_clock::now() + kPlaceWait;
  std::error_code ec;
  while (!std::filesystem::exists(path, ec)) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw CommError("regroup", rank, -1,
                      "ddprun gave no place in the next world within 15 min (" + path +
                          "); the agents could not agree on one, see ddprun's log");
    }
    std::this_thread::sleep_for(kPlacePoll);
  }
  std::map<std::string, std::string> place;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto eq = line.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError(path + " holds '" + line + "', not NAME=VALUE; it is ddprun's to write");
    }
    place[line.substr(0, eq)] = line.substr(eq + 1);
  }
  std::filesystem::remove(path, ec);
  return place;
}

}  // namespace

ProcessGroup init_process_group() {
  ProcessGroup group;
  settings::validate_all();
  group.env = DistributedEnv::from_environment();
  log::set_rank(group.env.rank);
  connect(group);
  return group;
}

bool ProcessGroup::can_regroup() const { return !regroup_file().empty(); }

void ProcessGroup::offer_regroup() {
  const std::string file = regroup_file();
  if (file.empty()) return;
  AbortNotice::arm_regroup(true);
  write_atomically(file + ".able", std::to_string(getpid()) + "\n");
}

void ProcessGroup::withdraw_regroup() {
  const std::string file = regroup_file();
  if (file.empty()) return;
  std::error_code ec;
  std::filesystem::remove(file + ".able", ec);
  AbortNotice::arm_regroup(false);
}

void ProcessGroup::regroup() {
  const std::string file = regroup_file();
  if (file.empty()) {
    throw ConfigError("regroup() needs ddprun's DDP_REGROUP_FILE; start the job with ddprun");
  }
  const int old_rank = env.rank;
  comm.reset();
  store.reset();
  write_atomically(file + ".ready", std::to_string(getpid()) + "\n");
  auto place = wait_for_place(file, old_rank);
  std::error_code ec;
  std::filesystem::remove(file + ".ready", ec);
  env::set_overrides(std::move(place));
  AbortNotice::clear();
  env = DistributedEnv::from_environment();
  log::set_rank(env.rank);
  connect(*this);
}

bool regroup_requested(std::chrono::milliseconds wait) {
  if (!AbortNotice::regroup_armed()) return false;
  if (AbortNotice::regroup() != AbortNotice::Regroup::kNone) return true;
  return wait.count() > 0 && AbortNotice::wait_for_regroup(wait);
}

}  // namespace ddp
