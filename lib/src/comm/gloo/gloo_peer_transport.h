#pragma once
// PeerTransport on gloo's TCP pairs, so the gloo backend runs the same collectives as the fabric
// backend (lib/src/comm/collectives) for payloads too large for the direct exchange.
//
// gloo holds a send back until the receiver has posted a receive for the same peer and slot, so
// a slot works like a libfabric tag. Each op's messages use slots derived from a hash of its
// signature (kind, type, count, op, sequence) and plan: ranks that disagree on the collective
// never match each other's data, and no message can be longer than the receive it lands in
// (gloo aborts the process on that). gloo would quietly complete a receive with a shorter
// message, which cannot happen either: everything that sizes messages is in the hash. The
// signatures themselves travel in the direct exchange, started by begin_op and checked at the
// op's first wait, so checking costs no extra round.
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/collectives/peer_transport.h"
#include "comm/gloo/gloo_fwd.h"

namespace ddp::detail {

class GlooDirectExchange;

class GlooPeerTransport final : public collectives::PeerTransport {
 public:
  GlooPeerTransport(std::shared_ptr<gloo::Context> context, GlooDirectExchange& exchange,
                    std::chrono::milliseconds timeout);
  ~GlooPeerTransport() override;

  int rank() const override;
  int size() const override;
  void begin_op(const CollectiveSignature& signature) override;
  void end_op() override;
  void expose(const void*, std::size_t) override {}  // TCP needs no registration
  void* scratch(std::size_t bytes) override;
  Request send(int peer, std::uint32_t index, const void* data, std::size_t bytes) override;
  Request recv(int peer, std::uint32_t index, void* data, std::size_t bytes) override;
  void wait(Request request) override;
  std::size_t max_message_bytes() const override { return std::size_t{1} << 40; }
  std::size_t eager_message_bytes() const override { return 0; }
  // abandon(); the peers learn of it when the owner closes the pairs (GlooCommunicator::poison).
  void abort(const std::string&) override { abandon(); }

  // Forgets the op's requests without waiting for them: once a request's gloo buffer is gone,
  // gloo no longer reads or writes its memory. It also lets go of the mesh, so that the caller
  // can close the pairs right after (see GlooCommunicator::poison): a message for a forgotten
  // receive would sit in its stream. The transport can only be destroyed after this.
  void abandon();

 private:
  struct Pending {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;  // null once waited for
    bool is_send = false;
  };
  std::uint64_t slot_of(std::uint32_t index) const;
  // Waits for every peer's signature of this op and checks it, once per op.
  void check_signatures();
  // Posts a send or receive (fn), preferring a signature mismatch over gloo's error.
  template <typename Fn>
  void posting(Fn&& fn);

  std::shared_ptr<gloo::Context> context_;
  GlooDirectExchange& exchange_;
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  std::uint64_t op_slots_ = 0;
  bool signatures_checked_ = true;
  std::vector<Pending> pending_;
  std::vector<char> scratch_;
};

}  // namespace ddp::detail
