// The agent's side of in-process regrouping (supervision/regroup_offer.h): which changes it
// meets, the notice's words, the files, and the place it writes.
#include "supervision/regroup_offer.h"

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace ddprun {
namespace {

FailureReport change(const std::string& kind) {
  FailureReport r;
  r.kind = kind;
  r.node_rank = 2;
  r.hostname = "pod-2";
  r.message = "a test's change";
  return r;
}

FailureReport leave() {
  FailureReport r = change("agent");
  r.signal = SIGTERM;  // the node was asked to stop
  return r;
}

TEST(RegroupOffer, MeetsALostALeavingAndAJoiningNodeNotAFailure) {
  EXPECT_TRUE(regroups_for(change("lost")));
  EXPECT_TRUE(regroups_for(change("membership")));
  EXPECT_TRUE(regroups_for(leave()));
  EXPECT_FALSE(regroups_for(change("worker")));
  EXPECT_FALSE(regroups_for(change("agent")));  // an agent's own failure, no signal
}

TEST(RegroupOffer, ALossGivesUpTheStepAJoinWaitsForItsEndALeaveForTheStop) {
  EXPECT_EQ(regroup_notice(change("lost")).rfind("regroup: ", 0), 0u);
  EXPECT_EQ(regroup_notice(change("membership")).rfind("regroup after step: ", 0), 0u);
  EXPECT_EQ(regroup_notice(leave()).rfind("regroup when stopped: ", 0), 0u);
  EXPECT_NE(regroup_notice(change("lost")).find(change("lost").headline()), std::string::npos);
}

TEST(RegroupOffer, ThePlaceHoldsTheRoundsVariablesOnly) {
  const auto dir = std::filesystem::temp_directory_path() / "ddprun-regroup-offer-test";
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "regroup").string();
  EXPECT_FALSE(offers_regroup(file));
  EXPECT_FALSE(answered_regroup(file));
  std::ofstream(file + ".able") << "1\n";
  std::ofstream(file + ".ready") << "1\n";
  EXPECT_TRUE(offers_regroup(file));
  EXPECT_TRUE(answered_regroup(file));
  EXPECT_FALSE(offers_regroup(""));  // not elastic: no file

  write_place(file, {{"RANK", "3"},
                     {"WORLD_SIZE", "4"},
                     {"MASTER_ADDR", "10.0.0.2"},
                     {"TORCHELASTIC_RESTART_COUNT", "2"},
                     {"PATH", "/usr/bin"}});
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(),
            "RANK=3\nWORLD_SIZE=4\nMASTER_ADDR=10.0.0.2\nTORCHELASTIC_RESTART_COUNT=2\n");
  EXPECT_FALSE(std::filesystem::exists(file + ".partial"));
  std::filesystem::remove_all(dir);
}

TEST(RegroupOffer, AWorkerWaitsForTheNoticeBeyondTheHeartbeatLimit) {
  RendezvousSettings rdzv;  // 5 s x 3
  EXPECT_EQ(regroup_wait_seconds(rdzv), 30);
  rdzv.keep_alive_interval = std::chrono::milliseconds(1500);
  rdzv.keep_alive_max_attempt = 2;
  EXPECT_EQ(regroup_wait_seconds(rdzv), 11);
}

}  // namespace
}  // namespace ddprun
