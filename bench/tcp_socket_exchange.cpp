// Reference line for the TCP paths: a 2-rank "allreduce" that only moves the bytes. The ranks
// exchange over one loopback TCP connection exactly what a ring moves (each sends and receives
// half the buffer twice: reduce-scatter, then allgather), with no reduction and no protocol,
// spinning on non-blocking send/recv. Not a bound: from 4 MiB the fabric backend over
// tcp;ofi_rxm is faster (bench/results/2026-11-25-rxm-eager-buffers.txt); it shows what the
// kernel's loopback copies cost by themselves.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "tcp_socket_exchange.h"

namespace ddp::bench {
namespace {

[[noreturn]] void fail(const char* what) {
  throw std::runtime_error(std::string("tcp socket exchange: ") + what + ": " +
                           std::strerror(errno));
}

class TcpSocketExchange final : public AllreduceVariant {
 public:
  TcpSocketExchange(Store& store, int rank) {
    if (rank == 0) {
      const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      socklen_t length = sizeof(address);
      if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
          ::listen(listener, 1) != 0 ||
          ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
        fail("listen");
      }
      store.set("tcp_socket_exchange/port", std::to_string(ntohs(address.sin_port)));
      socket_ = ::accept(listener, nullptr, nullptr);
      ::close(listener);
    } else {
      sockaddr_in address{};
      address.sin_family = AF_INET;
      address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      address.sin_port =
          htons(static_cast<uint16_t>(std::stoi(store.get("tcp_socket_exchange/port"))));
      socket_ = ::socket(AF_INET, SOCK_STREAM, 0);
      if (socket_ < 0 ||
          ::connect(socket_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
        fail("connect");
      }
    }
    if (socket_ < 0) fail("accept");
    const int one = 1;
    ::setsockopt(socket_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~TcpSocketExchange() override { ::close(socket_); }

  void prepare(float* data, std::size_t count) override {
    out_ = reinterpret_cast<const char*>(data);
    half_ = count / 2 * sizeof(float);
    in_.resize(half_);
  }

  void run() override {
    for (int phase = 0; phase < 2; ++phase) exchange();
  }

 private:
  // Sends half the buffer while receiving as much, both at once (neither side may block the
  // other on a full socket buffer), spinning on non-blocking calls as the fabric backend's
  // progress loop does: a poll() that sleeps would add wake-ups no allreduce needs.
  void exchange() {
    std::size_t sent = 0, received = 0;
    while (sent < half_ || received < half_) {
      if (sent < half_) {
        const ssize_t n = ::send(socket_, out_ + sent, half_ - sent, MSG_DONTWAIT);
        if (n < 0 && errno != EAGAIN) fail("send");
        if (n > 0) sent += static_cast<std::size_t>(n);
      }
      if (received < half_) {
        const ssize_t n = ::recv(socket_, in_.data() + received, half_ - received, MSG_DONTWAIT);
        if (n == 0) throw std::runtime_error("tcp socket exchange: the peer closed the connection");
        if (n < 0 && errno != EAGAIN) fail("recv");
        if (n > 0) received += static_cast<std::size_t>(n);
      }
    }
  }

  int socket_ = -1;
  const char* out_ = nullptr;
  std::size_t half_ = 0;
  std::vector<char> in_;
};

}  // namespace

VariantFactory tcp_socket_exchange_variant() {
  return {"tcp_socket_exchange", [](std::shared_ptr<Store> store, int rank, int) {
            return std::unique_ptr<AllreduceVariant>(new TcpSocketExchange(*store, rank));
          }};
}

}  // namespace ddp::bench
