#pragma once
// fi_getinfo with the hints this backend is written for, chosen so that EFA accepts them:
// FI_EP_RDM with FI_TAGGED | FI_MSG, mode FI_CONTEXT | FI_CONTEXT2 (every operation passes its
// own context), and every registration mode EFA may demand (FI_MR_LOCAL, FI_MR_ENDPOINT,
// FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY). Limits (inject_size, max_msg_size) are
// read from the answer, never assumed.
#include <optional>
#include <string>

#include "comm/fabric/fabric_endpoint.h"

namespace ddp::detail::fabric {

// Sets, unless the caller set them, before libfabric first initialises: FI_EFA_FORK_SAFE=1 (the
// launcher and data loaders fork, and EFA's registered pages must survive that), and ofi_rxm's
// eager size and receive buffer count (FI_OFI_RXM_BUFFER_SIZE=65536, FI_OFI_RXM_MSG_RX_SIZE=128).
void prepare_fabric_environment();

struct InfoQuery {
  std::string provider;
  std::optional<std::string> source_address;  // bind socket providers to this local IP
  std::optional<std::string> domain;          // e.g. an interface name for tcp
};

// The fi_getinfo answer (a list) for `query`, or nullptr with `error` set to libfabric's text.
InfoPtr query_fabric(const InfoQuery& query, std::string* error);

// Whether `provider` answers our hints on this host.
bool provider_present(const std::string& provider);

// "shm, tcp;ofi_rxm, ..." the providers here that answer our hints, for error messages.
std::string providers_answering_hints();

// A copy of entry `index` of the list (modulo its length) and the list's length.
InfoPtr pick_entry(const fi_info* list, std::size_t index, std::size_t* entries);

}  // namespace ddp::detail::fabric
