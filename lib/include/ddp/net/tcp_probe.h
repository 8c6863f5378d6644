#pragma once
// Whether something accepts TCP connections at host:port, asked without sending a byte.
//
// c10d's TCPStore client retries a refused connection only once per second, so a worker that
// starts before its launcher's store is up (ddprun starts workers while it loads the store)
// lost up to a second on every launch. Probing every few milliseconds first lets c10d's own
// connect succeed at its first try. ddprun's agents probe the same way while they wait for
// node 0, and report why the last probe failed.
#include <sys/socket.h>

#include <chrono>
#include <string>

namespace ddp::net {

// A connected TCP socket (non-blocking, close-on-exec) to the first address of `host` that
// accepts, or -1 with `why` saying why not ("cannot resolve 'h': ...", or
// "10.0.0.1:29500: Connection refused"). Each attempt waits at most `limit` for the handshake.
int connect_tcp(const std::string& host, int port, std::chrono::milliseconds limit,
                std::string& why);

// "" once a connection to some address of `host` succeeded (it is closed at once), else why
// not: "cannot resolve 'h': ...", or "10.0.0.1:29500: Connection refused". Each attempt
// waits at most `limit` for the handshake.
std::string probe_tcp(const std::string& host, int port,
                      std::chrono::milliseconds limit = std::chrono::seconds(1));

// Probes until one succeeds (true) or `deadline` passes (false), starting every 5 ms and
// backing off to 100 ms so that many ranks waiting on a remote master do not flood it. Name
// resolution failures are retried too: a Kubernetes Service's DNS record often appears after
// the pods start.
bool wait_for_listener(const std::string& host, int port,
                       std::chrono::steady_clock::time_point deadline);

// A TCP port that was free a moment ago (bound to port 0, then released), for a server that
// another process starts later (torchrun picks its workers' store port the same way). Throws
// ddp::StoreError if no socket can be bound.
int free_tcp_port();

// The numeric form of an IPv4 or IPv6 socket address ("" for other families).
std::string numeric_address(const sockaddr* addr);

}  // namespace ddp::net
