#pragma once
// The gloo backend's transport: PeerTransport on gloo's TCP pairs, so the gloo backend runs the
// shared collectives (lib/src/comm/collectives) like every other backend. It owns two full meshes
// of pairs over the same peers:
// - the exchange mesh, whose pairs are in gloo's synchronous mode (GlooDirectExchange): every op
//   sends its signature to every peer there, and a round (exchange()) carries payloads of up to
//   64 KiB in that same message: one message per peer and one wake-up per small collective;
// - the asynchronous mesh, for send/recv and for a round's larger payloads
//   (GlooPayloadExchange), read by gloo's device thread.
//
// gloo holds a send back until the receiver has posted a receive for the same peer and slot, so
// a slot works like a libfabric tag. Each op's messages use slots derived from a hash of its
// signature (kind, type, count, op, sequence) and plan: ranks that disagree on the collective
// never match each other's data, and no message can be longer than the receive it lands in
// (gloo aborts the process on that). gloo would quietly complete a receive with a shorter
// message, which cannot happen either: everything that sizes messages is in the hash. The
// signatures travel on the exchange mesh, sent with the op's first message and checked at its
// first wait, so checking costs no extra round.
//
// Errors: gloo's exceptions become CommError or TimeoutError naming the op. After any failure,
// or abort(), the transport closes both meshes, so that nothing lands in memory this rank no
// longer lends to the op and the peers fail at once instead of at their timeout; later ops fail
// at begin_op.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/collective_signature.h"
#include "comm/collectives/algorithm_config.h"
#include "comm/collectives/peer_transport.h"
#include "comm/gloo/gloo_fwd.h"

namespace ddp::detail {

class GlooDirectExchange;
class GlooPayloadExchange;

// The collectives' defaults on gloo's pairs (the environment overrides them).
collectives::AlgorithmConfig gloo_algorithm_defaults();

// The first line of a gloo exception's text (gloo appends where it was thrown, on more lines).
std::string first_line(const std::string& text);

class GlooPeerTransport final : public collectives::PeerTransport {
 public:
  // `exchange_mesh` must be used by nothing else: its pairs switch to synchronous mode. A round
  // carries payloads up to `round_bytes` (at least the exchange mesh's 64 KiB; more beside it on
  // `mesh`). Throws CommError when a peer has already left.
  GlooPeerTransport(std::shared_ptr<gloo::Context> mesh,
                    std::shared_ptr<gloo::Context> exchange_mesh, std::size_t round_bytes,
                    std::chrono::milliseconds timeout);
  ~GlooPeerTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void begin_op(const CollectiveSignature& signature) override;
  void end_op() override;
  void expose(const void*, std::size_t) override {}  // TCP needs no registration
  void* scratch(std::size_t bytes) override;
  Request send(int peer, std::uint32_t index, const void* data, std::size_t bytes) override;
  Request recv(int peer, std::uint32_t index, void* data, std::size_t bytes) override;
  void wait(Request request) override;
  void exchange(const void* payload, std::size_t bytes, int sender, PayloadSource source) override;
  const void* exchanged(int peer) const override;
  std::size_t round_payload_bytes() const override;
  void abort(const std::string& reason) override { fail(reason); }
  std::size_t max_message_bytes() const override { return std::size_t{1} << 40; }
  std::size_t eager_message_bytes() const override { return 0; }

 private:
  struct Pending {
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer;  // null once waited for
    bool is_send = false;
    int peer = -1;
  };
  // Runs fn, turning gloo's exceptions into CommError/TimeoutError; on any exception fails the
  // transport before rethrowing.
  template <typename Fn>
  auto guarded(Fn&& fn) -> decltype(fn());
  // Remembers `cause` and closes both meshes. The op's buffers go first, so gloo can no longer
  // write into them; then the pairs, which close with the last owner of their mesh. Their
  // sockets close with a FIN where gloo's own closeConnections would reset them, so a peer
  // normally still reads what this rank sent, its signature first, and reports the same
  // mismatch. The receive storage (scratch, the payload exchange's) is freed only with the
  // transport: closing a pair takes the lock under which gloo's device thread reads into it.
  void fail(const std::string& cause);
  // Sends this op's signature on the exchange mesh, once per op, before its first message.
  void start_op();
  // Waits for every peer's signature of this op and checks it, once per op.
  void check_signatures();
  std::uint64_t slot_of(std::uint32_t index) const;
  // Posts a send or receive (fn), preferring a signature mismatch over gloo's error.
  template <typename Fn>
  void posting(Fn&& fn);

  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> mesh_;
  std::shared_ptr<gloo::Context> exchange_mesh_;
  std::unique_ptr<GlooDirectExchange> exchange_;
  std::unique_ptr<GlooPayloadExchange> payloads_;  // null when rounds fit the exchange mesh
  std::chrono::milliseconds timeout_;
  std::chrono::steady_clock::time_point deadline_;
  CollectiveSignature signature_;  // the op's, as begin_op got it
  bool started_ = false;           // the signature has been sent
  bool signatures_checked_ = true;
  bool round_in_exchange_ = true;  // where the last round carried its payloads
  std::uint64_t op_slots_ = 0;
  std::vector<Pending> pending_;
  std::vector<char> scratch_;
  std::string failure_;
};

}  // namespace ddp::detail
