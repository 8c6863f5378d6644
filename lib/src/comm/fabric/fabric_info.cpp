#include "comm/fabric/fabric_info.h"

#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>
#include <set>

namespace ddp::detail::fabric {
namespace {

constexpr std::uint32_t kApiVersion = FI_VERSION(1, 17);

InfoPtr make_hints(const InfoQuery& query) {
  InfoPtr hints(fi_allocinfo());
  hints->caps = FI_TAGGED | FI_MSG;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
  hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;  // one op at a time per communicator
  hints->domain_attr->av_type = FI_AV_TABLE;
  if (!query.provider.empty()) hints->fabric_attr->prov_name = strdup(query.provider.c_str());
  if (query.domain) hints->domain_attr->name = strdup(query.domain->c_str());
  return hints;
}

}  // namespace

void prepare_fabric_environment() {
  ::setenv("FI_EFA_FORK_SAFE", "1", /*overwrite=*/0);
  // ofi_rxm sends a message eagerly (no rendezvous round trip) up to its buffer size, 16 KiB by
  // default: 64 KiB buffers spare the mid-sized messages of a collective that round trip
  // (bench/results/2026-11-25-rxm-eager-buffers.txt). 128 receive buffers per connection, instead
  // of rxm's default, keep the extra memory to tens of MB per rank.
  ::setenv("FI_OFI_RXM_BUFFER_SIZE", "65536", /*overwrite=*/0);
  ::setenv("FI_OFI_RXM_MSG_RX_SIZE", "128", /*overwrite=*/0);
}

InfoPtr query_fabric(const InfoQuery& query, std::string* error) {
  prepare_fabric_environment();
  InfoPtr hints = make_hints(query);
  fi_info* answer = nullptr;
  const char* node = query.source_address ? query.source_address->c_str() : nullptr;
  const int rc = fi_getinfo(kApiVersion, node, nullptr, node ? FI_SOURCE : 0, hints.get(), &answer);
  if (rc != 0) {
    if (error) *error = fabric_error_text(rc);
    return nullptr;
  }
  return InfoPtr(answer);
}

bool provider_present(const std::string& provider) {
  return query_fabric({provider, std::nullopt, std::nullopt}, nullptr) != nullptr;
}

std::string providers_answering_hints() {
  InfoPtr all = query_fabric({"", std::nullopt, std::nullopt}, nullptr);
  std::set<std::string> names;
  for (const fi_info* i = all.get(); i; i = i->next) names.insert(i->fabric_attr->prov_name);
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "none" : text;
}

InfoPtr pick_entry(const fi_info* list, std::size_t index, std::size_t* entries) {
  std::size_t count = 0;
  for (const fi_info* i = list; i; i = i->next) ++count;
  if (entries) *entries = count;
  if (count == 0) return nullptr;
  const fi_info* chosen = list;
  for (std::size_t k = 0; k < index % count; ++k) chosen = chosen->next;
  return InfoPtr(fi_dupinfo(chosen));
}

}  // namespace ddp::detail::fabric
