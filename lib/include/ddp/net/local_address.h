#pragma once
// Which local address this host uses to reach a peer. Debian maps the hostname to 127.0.1.1,
// so "resolve my own hostname" picks loopback on multi-node jobs; asking the routing table
// for the route to the master gives the interface that actually reaches it.
#include <string>

namespace ddp::net {

// The local IP address (numeric) the kernel would use to send to `host`. No packet is sent:
// a UDP socket is connect()ed and getsockname() read. Throws ConfigError if `host` does not
// resolve or no route exists.
std::string local_address_towards(const std::string& host);

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback(const std::string& host);

}  // namespace ddp::net
