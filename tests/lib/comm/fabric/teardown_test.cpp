// FabricTransport's failure bookkeeping (lib/src/comm/fabric/teardown.h), without a provider:
// the first failure is kept, which peers an abort notice may go to, how a notice reads, and
// which notices let the current op finish first. Sending and closing run against a provider in
// the fabric conformance and failure tests.
#include "comm/fabric/teardown.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "comm/fabric/fabric_transport_internal.h"
#include "comm/fabric/stuck_call_guard.h"

namespace ddp::detail::fabric {
namespace {

using std::chrono::milliseconds;

// A pid that has exited and been reaped.
pid_t exited_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

struct Fixture {
  explicit Fixture(Teardown::Provider provider, std::vector<std::optional<pid_t>> pids = {})
      : liveness(std::move(pids)), teardown(0, 4, provider, guard, liveness) {}
  StuckCallGuard guard{milliseconds(1000), milliseconds(5000)};
  PeerLiveness liveness;
  Teardown teardown;
};

Teardown::Provider shm() { return {true, false, 4096}; }
Teardown::Provider rxm() { return {false, true, 64}; }

TEST(Teardown, TheFirstFailureIsKeptWithItsPeer) {
  Fixture f(rxm());
  EXPECT_FALSE(f.teardown.failed());
  f.teardown.blame(2);
  EXPECT_TRUE(f.teardown.record_failure("rank 2 sent 8 bytes"));
  f.teardown.blame(3);  // a later op's peer does not replace the first
  EXPECT_FALSE(f.teardown.record_failure("something later"));
  EXPECT_EQ(f.teardown.failure(), "rank 2 sent 8 bytes");
  // The blamed peer is the one notices then skip over ofi_rxm (below).
  f.teardown.completion_failed();
  f.teardown.reached(2);
  f.teardown.reached(3);
  EXPECT_FALSE(f.teardown.may_notify(2));
  EXPECT_TRUE(f.teardown.may_notify(3));
}

TEST(Teardown, EveryLivePeerIsToldUntilRxmReportsAnErrorCompletion) {
  Fixture f(rxm());
  for (int peer = 1; peer < 4; ++peer) EXPECT_TRUE(f.teardown.may_notify(peer));
  f.teardown.completion_failed();
  EXPECT_TRUE(f.teardown.has_completion_failed());
  // Then only peers whose connection is established: a send to another would make rxm connect.
  for (int peer = 1; peer < 4; ++peer) EXPECT_FALSE(f.teardown.may_notify(peer));
  f.teardown.reached(1);
  EXPECT_TRUE(f.teardown.may_notify(1));
  EXPECT_FALSE(f.teardown.may_notify(2));
}

TEST(Teardown, OnShmAnErrorCompletionStillTellsEveryLivePeer) {
  Fixture f(shm());
  f.teardown.completion_failed();
  for (int peer = 1; peer < 4; ++peer) EXPECT_TRUE(f.teardown.may_notify(peer));
}

TEST(Teardown, APeerWhoseProcessExitedIsNeverTold) {
  Fixture f(shm(), {::getpid(), exited_pid(), ::getpid(), std::nullopt});
  EXPECT_TRUE(f.teardown.may_notify(0));
  EXPECT_FALSE(f.teardown.may_notify(1));
  EXPECT_TRUE(f.teardown.may_notify(2));
  EXPECT_TRUE(f.teardown.may_notify(3));  // on another host: not watched
}

TEST(Teardown, ANoticeCarriesItsSendersOpAndReason) {
  char buffer[kNoticeBytes] = {};
  const std::uint32_t sequence = 41;
  std::memcpy(buffer, &sequence, kNoticeSequenceBytes);
  std::memcpy(buffer + kNoticeSequenceBytes, "timed out", 9);
  const auto notice = Teardown::read_notice(3, buffer, kNoticeSequenceBytes + 9, 40);
  EXPECT_EQ(notice.source, 3);
  EXPECT_EQ(notice.sequence, 41u);
  EXPECT_EQ(notice.cause, "rank 3 aborted the job's collectives: timed out");
  // One too short to hold a sequence is taken as this rank's op, without a reason.
  const auto bare = Teardown::read_notice(2, buffer, 2, 40);
  EXPECT_EQ(bare.sequence, 40u);
  EXPECT_EQ(bare.cause, "rank 2 aborted the job's collectives");
}

TEST(Teardown, OnlyANoticeFromALaterOpLetsTheCurrentOpFinish) {
  Fixture f(shm());
  Teardown::Notice same{1, 10, "rank 1 aborted"};
  EXPECT_FALSE(f.teardown.defer(same, 10, true));
  Teardown::Notice earlier{1, 9, "rank 1 aborted"};
  EXPECT_FALSE(f.teardown.defer(earlier, 10, true));
  Teardown::Notice later{2, 11, "rank 2 aborted"};
  EXPECT_FALSE(f.teardown.defer(later, 10, false));  // between ops: nothing to finish
  EXPECT_FALSE(f.teardown.pending().has_value());
  EXPECT_TRUE(f.teardown.defer(later, 10, true));
  ASSERT_TRUE(f.teardown.pending().has_value());
  EXPECT_EQ(f.teardown.pending()->source, 2);
  EXPECT_EQ(f.teardown.pending()->cause, "rank 2 aborted");
  // Across the 32-bit wrap, "later" still means later.
  Fixture g(shm());
  EXPECT_TRUE(g.teardown.defer(Teardown::Notice{1, 2, "x"}, 0xffffffffu, true));
}

}  // namespace
}  // namespace ddp::detail::fabric
