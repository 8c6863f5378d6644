#pragma once
// Endpoint addresses travel through the rendezvous store: each rank publishes the provider it
// opened and its fi_getname blob (opaque, of provider-defined length, hex-encoded), or the reason
// it could not open one, so that its peers fail at once with that reason instead of waiting.
#include <memory>
#include <string>
#include <vector>

namespace ddp {
class Store;
}

namespace ddp::detail::fabric {

std::string to_hex(const std::string& bytes);
// Throws ConfigError on odd length or non-hex characters.
std::string from_hex(const std::string& text);

void publish_endpoint(Store& store, int rank, const std::string& provider,
                      const std::string& address);
void publish_failure(Store& store, int rank, const std::string& reason);

// Every rank's address, in rank order. Throws CommError("connect", ...) naming the first rank
// that published a failure or opened a different provider than `provider`.
std::vector<std::string> collect_addresses(Store& store, int rank, int size,
                                           const std::string& provider);

}  // namespace ddp::detail::fabric
