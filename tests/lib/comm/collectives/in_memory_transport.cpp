#include "in_memory_transport.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

#include "ddp/error.h"

namespace ddp::detail::collectives::testing {

class InMemoryTransport final : public PeerTransport {
 public:
  InMemoryTransport(InMemoryNetwork& fabric, int rank) : fabric_(fabric), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }

  void begin_op(const CollectiveSignature& signature) override {
    if (!aborted_.empty()) throw CommError("collective", rank_, -1, "aborted: " + aborted_);
    if (in_op_) throw std::logic_error("begin_op inside an op");
    in_op_ = true;
    header_ = signature;
    ++sequence_;
    header_.sequence = sequence_;
    deadline_ = std::chrono::steady_clock::now() + fabric_.timeout_;
  }

  void end_op() override {
    if (!in_op_) throw std::logic_error("end_op outside an op");
    while (!outstanding_.empty()) wait(outstanding_.begin()->first);
    sends_in_order_.clear();
    sends_done_ = 0;
    exposed_.clear();
    in_op_ = false;
  }

  void abort(const std::string& reason) override {
    if (aborted_.empty()) aborted_ = reason;
  }

  void expose(const void* data, std::size_t bytes) override {
    exposed_.push_back({static_cast<const char*>(data), bytes});
  }

  void* scratch(std::size_t bytes) override {
    if (scratch_.size() < bytes) scratch_.assign(bytes, 0);
    return scratch_.data();
  }

  Request send(int peer, std::uint32_t index, const void* data, std::size_t bytes) override {
    check_usable(peer, data, bytes, bytes <= fabric_.eager_message_bytes_);
    auto state = std::make_shared<InMemoryNetwork::RequestState>();
    fabric_.post_send({peer, rank_, sequence_, index},
                      {rank_, header_, static_cast<char*>(const_cast<void*>(data)), bytes, state});
    sends_in_order_.push_back(state);
    return track(peer, state, sends_in_order_.size() - 1);
  }

  Request recv(int peer, std::uint32_t index, void* data, std::size_t bytes) override {
    check_usable(peer, data, bytes, /*eager_send=*/false);
    auto state = std::make_shared<InMemoryNetwork::RequestState>();
    fabric_.post_recv({rank_, peer, sequence_, index},
                      {peer, header_, static_cast<char*>(data), bytes, state});
    return track(peer, state, kNotASend);
  }

  void wait(Request request) override {
    auto it = outstanding_.find(request);
    if (it == outstanding_.end()) throw std::logic_error("wait on an unknown request");
    const Outstanding request_state = it->second;
    outstanding_.erase(it);
    // A send is reported done only once every send this rank posted before it is (shm's order).
    const auto reported = [&] {
      if (request_state.send_position == kNotASend) return request_state.state->done;
      while (sends_done_ < sends_in_order_.size() && sends_in_order_[sends_done_]->done) {
        ++sends_done_;
      }
      return request_state.send_position < sends_done_;
    };
    const int peer = request_state.peer;
    std::unique_lock<std::mutex> lock(fabric_.mutex_);
    if (!fabric_.changed_.wait_until(lock, deadline_, reported)) {
      throw TimeoutError(to_string(header_.kind), rank_, peer, "no message within the timeout");
    }
    if (!request_state.state->error.empty()) {
      throw CommError(to_string(header_.kind), rank_, peer, request_state.state->error);
    }
  }

  std::size_t max_message_bytes() const override { return fabric_.max_message_bytes_; }
  std::size_t eager_message_bytes() const override { return fabric_.eager_message_bytes_; }

 private:
  void check_usable(int peer, const void* data, std::size_t bytes, bool eager_send) const {
    if (!in_op_) throw std::logic_error("transfer outside an op");
    if (peer < 0 || peer >= size() || peer == rank_) throw std::logic_error("bad peer");
    if (bytes > fabric_.max_message_bytes_)
      throw std::logic_error("message above max_message_bytes");
    if (bytes == 0 || eager_send) return;
    const char* p = static_cast<const char*>(data);
    auto inside = [&](const char* base, std::size_t len) {
      return p >= base && p + bytes <= base + len;
    };
    if (inside(scratch_.data(), scratch_.size())) return;
    for (const auto& [base, len] : exposed_) {
      if (inside(base, len)) return;
    }
    throw std::logic_error("transfer from memory that was neither exposed nor scratch");
  }

  static constexpr std::size_t kNotASend = ~std::size_t{0};
  struct Outstanding {
    int peer;
    std::shared_ptr<InMemoryNetwork::RequestState> state;
    std::size_t send_position;  // in sends_in_order_, or kNotASend
  };

  Request track(int peer, std::shared_ptr<InMemoryNetwork::RequestState> state,
                std::size_t send_position) {
    outstanding_.emplace(next_request_, Outstanding{peer, std::move(state), send_position});
    return next_request_++;
  }

  InMemoryNetwork& fabric_;
  int rank_;
  bool in_op_ = false;
  std::string aborted_;  // why abort() was called, if it was
  CollectiveSignature header_;
  std::uint32_t sequence_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<std::pair<const char*, std::size_t>> exposed_;
  std::vector<char> scratch_;
  std::map<Request, Outstanding> outstanding_;
  // This op's sends, in the order they were posted, and how many of the first are done.
  std::vector<std::shared_ptr<InMemoryNetwork::RequestState>> sends_in_order_;
  std::size_t sends_done_ = 0;
  Request next_request_ = 0;
};

InMemoryNetwork::InMemoryNetwork(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout) {}

InMemoryNetwork::~InMemoryNetwork() = default;

std::unique_ptr<PeerTransport> InMemoryNetwork::transport(int rank) {
  return std::make_unique<InMemoryTransport>(*this, rank);
}

void InMemoryNetwork::match(const Posted& send, const Posted& recv) {
  if (!recv.header.agrees_with(send.header)) {
    recv.state->error = mismatch_message(recv.header, send.header, send.peer);
  } else if (send.bytes != recv.bytes) {
    recv.state->error = "the peer sent " + std::to_string(send.bytes) + " bytes, expected " +
                        std::to_string(recv.bytes);
  } else if (send.bytes > 0) {
    std::memcpy(recv.data, send.data, send.bytes);
  }
  send.state->done = true;
  recv.state->done = true;
}

std::size_t InMemoryNetwork::largest_message_bytes() {
  std::lock_guard<std::mutex> lock(mutex_);
  return largest_message_bytes_;
}

void InMemoryNetwork::post_send(const Key& key, const Posted& send) {
  std::lock_guard<std::mutex> lock(mutex_);
  largest_message_bytes_ = std::max(largest_message_bytes_, send.bytes);
  auto it = receives_.find(key);
  if (it == receives_.end()) {
    sends_.emplace(key, send);
    return;
  }
  match(send, it->second);
  receives_.erase(it);
  changed_.notify_all();
}

void InMemoryNetwork::post_recv(const Key& key, const Posted& recv) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sends_.find(key);
  if (it == sends_.end()) {
    receives_.emplace(key, recv);
    return;
  }
  match(it->second, recv);
  sends_.erase(it);
  changed_.notify_all();
}

std::vector<std::exception_ptr> run_threads(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace ddp::detail::collectives::testing
