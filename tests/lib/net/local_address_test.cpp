// Unit test of lib/src/net/local_address.cpp: is_loopback on names and addresses, and
// local_address_towards on loopback destinations only (no packet leaves this host: the function
// only connects a UDP socket), plus the error for a name that cannot resolve.
#include "ddp/net/local_address.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "ddp/error.h"

namespace ddp::net {
namespace {

TEST(IsLoopback, LocalhostTheIpv4LoopbackNetAndIpv6Loopback) {
  EXPECT_TRUE(is_loopback("localhost"));
  EXPECT_TRUE(is_loopback("::1"));
  EXPECT_TRUE(is_loopback("127.0.0.1"));
  EXPECT_TRUE(is_loopback("127.0.1.1"));  // Debian's address for the own hostname
  EXPECT_TRUE(is_loopback("127.255.255.254"));
}

TEST(IsLoopback, OtherAddressesAndNamesAreNot) {
  EXPECT_FALSE(is_loopback("10.0.0.1"));
  EXPECT_FALSE(is_loopback("128.0.0.1"));
  EXPECT_FALSE(is_loopback("1.127.0.0"));
  EXPECT_FALSE(is_loopback("0.0.0.0"));
  EXPECT_FALSE(is_loopback("::"));
  EXPECT_FALSE(is_loopback("fe80::1"));
  EXPECT_FALSE(is_loopback("master-0"));
  EXPECT_FALSE(is_loopback(""));
}

// Numeric IPv4 text: what inet_pton accepts.
bool is_ipv4_literal(const std::string& text) {
  in_addr parsed{};
  return ::inet_pton(AF_INET, text.c_str(), &parsed) == 1;
}

TEST(LocalAddressTowards, TheIpv4LoopbackAddressIsReachedFromItself) {
  EXPECT_EQ(local_address_towards("127.0.0.1"), "127.0.0.1");
}

TEST(LocalAddressTowards, AnyLoopbackDestinationIsReachedFromALoopbackAddress) {
  const std::string from = local_address_towards("127.0.0.2");
  EXPECT_TRUE(is_ipv4_literal(from)) << from;
  EXPECT_TRUE(is_loopback(from)) << from;
}

TEST(LocalAddressTowards, LocalhostResolvesToANumericLoopbackAddress) {
  const std::string from = local_address_towards("localhost");
  EXPECT_NE(from, "localhost");
  in6_addr parsed6{};
  EXPECT_TRUE(is_ipv4_literal(from) || ::inet_pton(AF_INET6, from.c_str(), &parsed6) == 1) << from;
  EXPECT_TRUE(is_loopback(from)) << from;
}

TEST(LocalAddressTowards, TheIpv6LoopbackAddressIsReachedFromItself) {
  // Only where this host has IPv6 loopback (containers may have it disabled).
  const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
  sockaddr_in6 to{};
  to.sin6_family = AF_INET6;
  to.sin6_port = htons(9);
  to.sin6_addr = in6addr_loopback;
  const bool has_ipv6 =
      fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0;
  if (fd >= 0) ::close(fd);
  if (!has_ipv6) GTEST_SKIP() << "no IPv6 loopback on this host";
  EXPECT_EQ(local_address_towards("::1"), "::1");
}

TEST(LocalAddressTowards, ANameThatCannotResolveIsAConfigErrorNamingIt) {
  // A label longer than DNS allows (63 bytes): the resolver refuses it without a query.
  const std::string host = std::string(70, 'a') + ".invalid";
  try {
    local_address_towards(host);
    ADD_FAILURE() << "no error for " << host;
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cannot resolve '" + host + "' (", 0), 0u) << what;
    EXPECT_NE(what.find("set DDP_SOCKET_IFNAME"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace ddp::net
