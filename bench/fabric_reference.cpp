// Reference lines: a bare two-rank ring written directly on the libfabric API with nothing
// else in the way, on shm and on tcp;ofi_rxm: each block in two chunks, the receiver takes a
// chunk into scratch (on shm one CMA copy), adds it in (vectorised by the compiler), and sends
// it back in the allgather as soon as it is reduced. The backend's goals are stated against
// these lines.
// A second line, for small payloads on shm: bare recursive doubling, each rank sending its whole
// buffer in pieces of the provider's inject size (no CMA handshake), then adding what arrived.
// The backend runs the same scheme below its ring threshold, so the gap between the two is what
// the backend's own layers cost an op.
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "fabric_reference.h"

namespace ddp::bench {
namespace {

void check(int rc, const char* what) {
  if (rc != 0) {
    throw std::runtime_error(std::string("bare ring: ") + what + ": " + fi_strerror(-rc));
  }
}

class BareRing final : public AllreduceVariant {
 public:
  BareRing(Store& store, int rank, const char* provider, bool doubling)
      : rank_(rank), doubling_(doubling) {
    fi_info* hints = fi_allocinfo();
    hints->caps = FI_TAGGED | FI_MSG;
    hints->mode = FI_CONTEXT;
    hints->ep_attr->type = FI_EP_RDM;
    hints->domain_attr->av_type = FI_AV_TABLE;
    hints->fabric_attr->prov_name = strdup(provider);
    check(fi_getinfo(FI_VERSION(1, 17), nullptr, nullptr, 0, hints, &info_), "fi_getinfo");
    fi_freeinfo(hints);
    check(fi_fabric(info_->fabric_attr, &fabric_, nullptr), "fi_fabric");
    check(fi_domain(fabric_, info_, &domain_, nullptr), "fi_domain");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_CONTEXT;
    check(fi_cq_open(domain_, &cq_attr, &cq_, nullptr), "fi_cq_open");
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    check(fi_av_open(domain_, &av_attr, &av_, nullptr), "fi_av_open");
    check(fi_endpoint(domain_, info_, &ep_, nullptr), "fi_endpoint");
    check(fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV), "fi_ep_bind");
    check(fi_ep_bind(ep_, &av_->fid, 0), "fi_ep_bind");
    check(fi_enable(ep_), "fi_enable");
    char name[256];
    size_t length = sizeof(name);
    check(fi_getname(&ep_->fid, name, &length), "fi_getname");
    store.set("bare_ring/" + std::to_string(rank), std::string(name, length));
    for (int r = 0; r < 2; ++r) {
      const std::string peer = store.get("bare_ring/" + std::to_string(r));
      fi_addr_t address;
      if (fi_av_insert(av_, peer.data(), 1, &address, 0, nullptr) != 1) {
        throw std::runtime_error("bare ring: fi_av_insert failed");
      }
      if (r == 1 - rank) peer_ = address;
    }
  }

  ~BareRing() override {
    fi_close(&ep_->fid);
    fi_close(&av_->fid);
    fi_close(&cq_->fid);
    fi_close(&domain_->fid);
    fi_close(&fabric_->fid);
    fi_freeinfo(info_);
  }

  void prepare(float* data, std::size_t count) override {
    data_ = data;
    count_ = count;
    scratch_.assign(doubling_ ? count : count / 2 + 2, 0.0f);
  }

  void run() override {
    if (doubling_) return run_doubling();
    ++op_;
    const int mine = rank_;
    const int theirs = 1 - rank_;
    Pending recv_rs[2], recv_ag[2], sends[4];
    // Reduce-scatter: the peer's copy of my block arrives in scratch; my copy of theirs leaves.
    // Allgather: the peer's reduced block arrives in place; mine leaves chunk by chunk.
    for (int c = 0; c < 2; ++c) {
      const Span own = span(mine, c);
      post_recv(scratch_.data() + (own.offset - span(mine, 0).offset), own.count, tag(0, c),
                &recv_rs[c]);
      const Span other = span(theirs, c);
      post_recv(data_ + other.offset, other.count, tag(1, c), &recv_ag[c]);
    }
    for (int c = 0; c < 2; ++c) {
      const Span other = span(theirs, c);
      post_send(data_ + other.offset, other.count, tag(0, c), &sends[c]);
    }
    for (int c = 0; c < 2; ++c) {
      const Span own = span(mine, c);
      wait(recv_rs[c]);
      float* a = data_ + own.offset;
      const float* b = scratch_.data() + (own.offset - span(mine, 0).offset);
      for (std::size_t i = 0; i < own.count; ++i) a[i] += b[i];
      post_send(a, own.count, tag(1, c), &sends[2 + c]);
    }
    for (auto& p : recv_ag) wait(p);
    for (auto& p : sends) wait(p);
  }

 private:
  struct Pending {
    fi_context context;  // first: the completion hands back its address
    bool done = false;
  };

  void run_doubling() {
    ++op_;
    // At most kMaxPieces pieces (the provider's receive queue is finite): past that many inject
    // sizes the pieces grow into CMA messages, and the line stops meaning anything.
    constexpr std::size_t kMaxPieces = 64;
    const std::size_t inject =
        std::max<std::size_t>(info_->tx_attr->inject_size / sizeof(float), 1);
    const std::size_t piece = std::max(inject, (count_ + kMaxPieces - 1) / kMaxPieces);
    const std::size_t pieces = (count_ + piece - 1) / piece;
    recv_pieces_.assign(pieces, Pending{});
    send_pieces_.assign(pieces, Pending{});
    for (std::size_t p = 0; p < pieces; ++p) {
      post_recv(scratch_.data() + p * piece, std::min(piece, count_ - p * piece), tag(0, p),
                &recv_pieces_[p]);
    }
    for (std::size_t p = 0; p < pieces; ++p) {
      post_send(data_ + p * piece, std::min(piece, count_ - p * piece), tag(0, p),
                &send_pieces_[p]);
    }
    for (auto& p : recv_pieces_) wait(p);
    for (std::size_t i = 0; i < count_; ++i) data_[i] += scratch_[i];
    for (auto& p : send_pieces_) wait(p);
  }

  struct Span {
    std::size_t offset;
    std::size_t count;
  };
  // Block b of two, chunk c of two.
  Span span(int block, int c) const {
    const std::size_t half = count_ / 2;
    const std::size_t begin = block == 0 ? 0 : half;
    const std::size_t size = block == 0 ? half : count_ - half;
    const std::size_t first = size / 2;
    return c == 0 ? Span{begin, first} : Span{begin + first, size - first};
  }
  std::uint64_t tag(int phase, std::size_t c) const { return (op_ << 20) | (phase << 16) | c; }
  void post_recv(float* p, std::size_t n, std::uint64_t t, Pending* pending) {
    while (fi_trecv(ep_, p, n * sizeof(float), nullptr, peer_, t, 0, &pending->context) ==
           -FI_EAGAIN) {
      progress();
    }
  }
  void post_send(float* p, std::size_t n, std::uint64_t t, Pending* pending) {
    while (fi_tsend(ep_, p, n * sizeof(float), nullptr, peer_, t, &pending->context) ==
           -FI_EAGAIN) {
      progress();
    }
  }
  void progress() {
    fi_cq_entry entries[8];
    const ssize_t got = fi_cq_read(cq_, entries, 8);
    for (ssize_t i = 0; i < got; ++i) static_cast<Pending*>(entries[i].op_context)->done = true;
    if (got == -FI_EAVAIL) throw std::runtime_error("bare ring: completion error");
  }
  void wait(Pending& pending) {
    while (!pending.done) progress();
  }

  int rank_;
  bool doubling_;
  std::uint64_t op_ = 0;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  fi_addr_t peer_ = FI_ADDR_UNSPEC;
  float* data_ = nullptr;
  std::size_t count_ = 0;
  std::vector<float> scratch_;
  std::vector<Pending> recv_pieces_;
  std::vector<Pending> send_pieces_;
};

}  // namespace

VariantFactory bare_ring_variant(const std::string& name, const char* provider) {
  return {name, [provider](std::shared_ptr<Store> store, int rank, int) {
            return std::unique_ptr<AllreduceVariant>(new BareRing(*store, rank, provider, false));
          }};
}

VariantFactory bare_doubling_variant(const std::string& name, const char* provider) {
  return {name, [provider](std::shared_ptr<Store> store, int rank, int) {
            return std::unique_ptr<AllreduceVariant>(new BareRing(*store, rank, provider, true));
          }};
}

}  // namespace ddp::bench
