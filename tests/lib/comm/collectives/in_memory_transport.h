#pragma once
// PeerTransport in one process, for checking the collective algorithms without a fabric. Ranks
// are threads. Matching is rendezvous: a send completes only when the receive is posted, and
// the payload is copied from the sender's memory at that moment, as libfabric's shm provider
// does with CMA. So an algorithm that reuses a buffer before the peer's matching receive is
// posted, or that only works when sends complete eagerly, fails here too. A rank learns of its
// sends' completions only in the order it posted them, as of shm's CMA sends (stricter than shm,
// whose injects complete at once): an algorithm that waits on a send while an earlier one still
// waits for a receive the peer posts later deadlocks here too. Sends and receives
// must use memory the algorithm exposed or took from scratch, as registration on EFA requires; only
// sends of at most eager_message_bytes() may use any memory, as shm's injects can.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "comm/collectives/peer_transport.h"

namespace ddp::detail::collectives::testing {

class InMemoryNetwork {
 public:
  InMemoryNetwork(int size, std::chrono::milliseconds timeout);
  ~InMemoryNetwork();

  int size() const { return size_; }
  // The largest message the transports accept (small values force the algorithms to split).
  void set_max_message_bytes(std::size_t bytes) { max_message_bytes_ = bytes; }
  void set_eager_message_bytes(std::size_t bytes) { eager_message_bytes_ = bytes; }
  // The transport of `rank`; call once per rank.
  std::unique_ptr<PeerTransport> transport(int rank);
  // The largest message any rank has sent so far.
  std::size_t largest_message_bytes();

 private:
  friend class InMemoryTransport;
  struct RequestState {
    bool done = false;
    std::string error;
  };
  struct Posted {
    int peer;
    CollectiveSignature header;
    char* data;
    std::size_t bytes;
    std::shared_ptr<RequestState> state;
  };
  // (receiver, sender, sequence, index)
  using Key = std::tuple<int, int, std::uint32_t, std::uint32_t>;

  void post_send(const Key& key, const Posted& send);
  void post_recv(const Key& key, const Posted& recv);
  static void match(const Posted& send, const Posted& recv);

  int size_;
  std::chrono::milliseconds timeout_;
  std::size_t max_message_bytes_ = std::size_t{1} << 40;
  std::size_t eager_message_bytes_ = 0;
  std::size_t largest_message_bytes_ = 0;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::multimap<Key, Posted> sends_;
  std::multimap<Key, Posted> receives_;
};

// Runs fn(rank) on `n` threads, one per rank, and returns each rank's exception (null for a rank
// that returned).
std::vector<std::exception_ptr> run_threads(int n, const std::function<void(int rank)>& fn);

}  // namespace ddp::detail::collectives::testing
