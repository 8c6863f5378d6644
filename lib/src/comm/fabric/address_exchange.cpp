#include "comm/fabric/address_exchange.h"

#include "ddp/error.h"
#include "ddp/store.h"

namespace ddp::detail::fabric {
namespace {

constexpr const char* kDigits = "0123456789abcdef";

std::string key_of(int rank) { return "endpoint/" + std::to_string(rank); }

int digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string to_hex(const std::string& bytes) {
  std::string text;
  text.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    text.push_back(kDigits[c >> 4]);
    text.push_back(kDigits[c & 15]);
  }
  return text;
}

std::string from_hex(const std::string& text) {
  if (text.size() % 2 != 0) throw ConfigError("malformed endpoint address (odd hex length)");
  std::string bytes(text.size() / 2, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const int high = digit_value(text[2 * i]);
    const int low = digit_value(text[2 * i + 1]);
    if (high < 0 || low < 0) throw ConfigError("malformed endpoint address (not hex)");
    bytes[i] = static_cast<char>(high * 16 + low);
  }
  return bytes;
}

void publish_endpoint(Store& store, int rank, const std::string& provider,
                      const std::string& address) {
  store.set(key_of(rank), "ok\n" + provider + "\n" + to_hex(address));
}

void publish_failure(Store& store, int rank, const std::string& reason) {
  store.set(key_of(rank), "error\n" + reason);
}

std::vector<std::string> collect_addresses(Store& store, int rank, int size,
                                           const std::string& provider) {
  std::vector<std::string> addresses(size);
  for (int peer = 0; peer < size; ++peer) {
    const std::string record = store.get(key_of(peer));
    const auto first = record.find('\n');
    const std::string status = record.substr(0, first);
    if (status == "error") {
      throw CommError("connect", rank, peer,
                      "rank " + std::to_string(peer) +
                          " could not open its fabric endpoint: " + record.substr(first + 1));
    }
    const auto second = record.find('\n', first + 1);
    if (status != "ok" || first == std::string::npos || second == std::string::npos) {
      throw CommError("connect", rank, peer,
                      "malformed endpoint record of rank " + std::to_string(peer) +
                          " in the rendezvous store; are two jobs sharing one store prefix?");
    }
    const std::string peer_provider = record.substr(first + 1, second - first - 1);
    if (peer_provider != provider) {
      throw CommError("connect", rank, peer,
                      "rank " + std::to_string(peer) + " opened libfabric provider '" +
                          peer_provider + "' but this rank opened '" + provider +
                          "'; set DDP_FABRIC_PROVIDER to the same value on every rank");
    }
    addresses[peer] = from_hex(record.substr(second + 1));
  }
  return addresses;
}

}  // namespace ddp::detail::fabric
