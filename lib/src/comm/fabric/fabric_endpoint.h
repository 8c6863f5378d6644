#pragma once
// RAII ownership of the libfabric objects behind one communicator: fabric, domain, completion
// queue, address vector (FI_AV_TABLE) and an enabled FI_EP_RDM endpoint, plus memory
// registrations. This and the other fabric_* files are the only code that sees rdma/fabric.h.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

namespace ddp::detail::fabric {

struct InfoDeleter {
  void operator()(fi_info* info) const { fi_freeinfo(info); }
};
using InfoPtr = std::unique_ptr<fi_info, InfoDeleter>;

template <typename T>
struct FidCloser {
  void operator()(T* object) const { fi_close(&object->fid); }
};
template <typename T>
using FidPtr = std::unique_ptr<T, FidCloser<T>>;

// "fi_strerror text (code N)" for a negative libfabric return code.
std::string fabric_error_text(long code);

class FabricEndpoint {
 public:
  // Opens everything for `info` (one entry of fi_getinfo's answer, taken over). A non-empty
  // `name` is given to the endpoint (fi_setname) before it is enabled. `rank` only labels
  // errors, which are CommError("connect", ...) with libfabric's message.
  FabricEndpoint(InfoPtr info, int rank, const std::string& name = "");
  ~FabricEndpoint();
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;

  const fi_info& info() const { return *info_; }
  fid_ep* endpoint() const { return endpoint_.get(); }
  fid_cq* completion_queue() const { return cq_.get(); }
  fid_domain* domain() const { return domain_.get(); }

  // The endpoint's address: an opaque blob whose length depends on the provider.
  std::string address() const;
  // Inserts every rank's address, in rank order, into the FI_AV_TABLE, so rank r is fi_addr r.
  std::vector<fi_addr_t> insert_addresses(const std::vector<std::string>& addresses);

  // Closes the endpoint now, dropping whatever is still posted: after it no transfer touches
  // memory handed to the fabric. The other objects stay until destruction.
  void close_endpoint();

 private:
  [[noreturn]] void fail(const std::string& call, long code) const;

  InfoPtr info_;
  int rank_;
  FidPtr<fid_fabric> fabric_;
  FidPtr<fid_domain> domain_;
  FidPtr<fid_cq> cq_;
  FidPtr<fid_av> av_;
  FidPtr<fid_ep> endpoint_;
};

// One registered memory range, usable for local sends and receives on the endpoint.
class MemoryRegistration {
 public:
  // Registers [data, data + bytes). `key` is used where the provider does not pick keys
  // (no FI_MR_PROV_KEY); every live registration needs a distinct one.
  MemoryRegistration(const FabricEndpoint& endpoint, const void* data, std::size_t bytes,
                     std::uint64_t key, int rank);
  ~MemoryRegistration();
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;

  bool contains(const void* data, std::size_t bytes) const;
  void* descriptor() const { return fi_mr_desc(mr_); }

 private:
  const char* base_;
  std::size_t bytes_;
  fid_mr* mr_ = nullptr;
};

}  // namespace ddp::detail::fabric
