#include "comm/fabric/fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sys/uio.h>

#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail::fabric {

std::string fabric_error_text(long code) {
  const int positive = static_cast<int>(code < 0 ? -code : code);
  return std::string(fi_strerror(positive)) + " (code " + std::to_string(positive) + ")";
}

void FabricEndpoint::fail(const std::string& call, long code) const {
  throw CommError("connect", rank_, -1,
                  call + " failed for provider " + info_->fabric_attr->prov_name + ": " +
                      fabric_error_text(code));
}

FabricEndpoint::FabricEndpoint(InfoPtr info, int rank, const std::string& name)
    : info_(std::move(info)), rank_(rank) {
  fid_fabric* fabric = nullptr;
  if (int rc = fi_fabric(info_->fabric_attr, &fabric, nullptr)) fail("fi_fabric", rc);
  fabric_.reset(fabric);

  fid_domain* domain = nullptr;
  if (int rc = fi_domain(fabric_.get(), info_.get(), &domain, nullptr)) fail("fi_domain", rc);
  domain_.reset(domain);

  // Tagged entries carry the tag and length the receiver checks against what it expected.
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_TAGGED;
  cq_attr.wait_obj = FI_WAIT_NONE;
  cq_attr.size = info_->tx_attr->size + info_->rx_attr->size;
  fid_cq* cq = nullptr;
  if (int rc = fi_cq_open(domain_.get(), &cq_attr, &cq, nullptr)) fail("fi_cq_open", rc);
  cq_.reset(cq);

  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  fid_av* av = nullptr;
  if (int rc = fi_av_open(domain_.get(), &av_attr, &av, nullptr)) fail("fi_av_open", rc);
  av_.reset(av);

  fid_ep* ep = nullptr;
  if (int rc = fi_endpoint(domain_.get(), info_.get(), &ep, nullptr)) fail("fi_endpoint", rc);
  endpoint_.reset(ep);
  if (int rc = fi_ep_bind(endpoint_.get(), &cq_->fid, FI_TRANSMIT | FI_RECV)) {
    fail("fi_ep_bind(cq)", rc);
  }
  if (int rc = fi_ep_bind(endpoint_.get(), &av_->fid, 0)) fail("fi_ep_bind(av)", rc);
  if (!name.empty()) {
    if (int rc = fi_setname(&endpoint_->fid, const_cast<char*>(name.c_str()), name.size() + 1)) {
      fail("fi_setname", rc);
    }
  }
  if (int rc = fi_enable(endpoint_.get())) fail("fi_enable", rc);
}

FabricEndpoint::~FabricEndpoint() {
  // Members close in reverse order of declaration: endpoint, av, cq, domain, fabric.
  close_endpoint();
}

void FabricEndpoint::close_endpoint() {
  if (!endpoint_) return;
  if (int rc = fi_close(&endpoint_.release()->fid)) {
    log::debug("fabric: closing the endpoint reported {}", fabric_error_text(rc));
  }
}

std::string FabricEndpoint::address() const {
  size_t length = 0;
  int rc = fi_getname(&endpoint_->fid, nullptr, &length);
  if (rc != -FI_ETOOSMALL && rc != 0) fail("fi_getname", rc);
  std::string name(length, '\0');
  if (int rc2 = fi_getname(&endpoint_->fid, name.data(), &length)) fail("fi_getname", rc2);
  name.resize(length);
  return name;
}

std::vector<fi_addr_t> FabricEndpoint::insert_addresses(const std::vector<std::string>& addresses) {
  std::vector<fi_addr_t> result;
  result.reserve(addresses.size());
  for (std::size_t r = 0; r < addresses.size(); ++r) {
    fi_addr_t address = FI_ADDR_NOTAVAIL;
    // Variable-length names go in one at a time; FI_AV_TABLE numbers them in insertion order.
    int inserted = fi_av_insert(av_.get(), addresses[r].data(), 1, &address, 0, nullptr);
    if (inserted != 1) {
      throw CommError("connect", rank_, static_cast<int>(r),
                      "fi_av_insert rejected the address of rank " + std::to_string(r) + ": " +
                          (inserted < 0 ? fabric_error_text(inserted) : "not inserted") +
                          "; every rank must use the same libfabric provider");
    }
    result.push_back(address);
  }
  return result;
}

MemoryRegistration::MemoryRegistration(const FabricEndpoint& endpoint, const void* data,
                                       std::size_t bytes, std::uint64_t key, int rank)
    : base_(static_cast<const char*>(data)), bytes_(bytes) {
  const fi_info& info = endpoint.info();
  iovec iov{const_cast<void*>(data), bytes};
  fi_mr_attr attr{};
  attr.mr_iov = &iov;
  attr.iov_count = 1;
  attr.access = FI_SEND | FI_RECV;
  attr.requested_key = key;
  auto fail = [&](const char* call, long code) {
    if (mr_) fi_close(&mr_->fid);
    throw CommError("register", rank, -1,
                    std::string(call) + " failed for " + std::to_string(bytes) +
                        " bytes: " + fabric_error_text(code) +
                        "; on EFA check the locked-memory limit (ulimit -l unlimited)");
  };
  if (int rc = fi_mr_regattr(endpoint.domain(), &attr, 0, &mr_)) fail("fi_mr_regattr", rc);
  if (info.domain_attr->mr_mode & FI_MR_ENDPOINT) {
    if (int rc = fi_mr_bind(mr_, &endpoint.endpoint()->fid, 0)) fail("fi_mr_bind", rc);
    if (int rc = fi_mr_enable(mr_)) fail("fi_mr_enable", rc);
  }
}

MemoryRegistration::~MemoryRegistration() {
  if (mr_) fi_close(&mr_->fid);
}

bool MemoryRegistration::contains(const void* data, std::size_t bytes) const {
  const char* p = static_cast<const char*>(data);
  return p >= base_ && p + bytes <= base_ + bytes_;
}

}  // namespace ddp::detail::fabric
