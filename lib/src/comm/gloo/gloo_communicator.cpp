#include "comm/gloo/gloo_communicator.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>

#include "comm/abort_notice.h"
#include "comm/gloo/gloo_device.h"
#include "comm/gloo/gloo_peer_transport.h"
#include "comm/gloo/gloo_store_bridge.h"
#ifdef DDP_WITH_FABRIC
#include "comm/fabric_module.h"
#endif
#include "ddp/error.h"
#include "ddp/log.h"

namespace ddp::detail {
namespace {

// gloo writes to its sockets without MSG_NOSIGNAL: a write to a peer that died raises SIGPIPE,
// which kills a C++ process before gloo can report the error (Python ignores SIGPIPE, so torch
// never sees this). Ignoring it turns that write into EPIPE and a CommError. A handler the
// program installed itself is left alone.
void ignore_sigpipe_unless_handled() {
  struct sigaction current {};
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

// This process's open sockets: descriptor and inode.
std::vector<std::pair<int, ino_t>> open_sockets() {
  std::vector<std::pair<int, ino_t>> sockets;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return sockets;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    struct stat st {};
    if (end == entry->d_name || *end != '\0') continue;
    if (fstat(static_cast<int>(fd), &st) == 0 && S_ISSOCK(st.st_mode)) {
      sockets.emplace_back(static_cast<int>(fd), st.st_ino);
    }
  }
  closedir(dir);
  return sockets;
}

// A full mesh of gloo pairs over `store`, with errors that say what to check.
std::shared_ptr<gloo::rendezvous::Context> connect_mesh(
    gloo::rendezvous::Store& store, std::shared_ptr<gloo::transport::Device> device, int rank,
    int size, std::chrono::milliseconds timeout) {
  auto mesh = std::make_shared<gloo::rendezvous::Context>(rank, size);
  mesh->setTimeout(timeout);
  try {
    mesh->connectFullMesh(store, device);
  } catch (const ddp::Error& e) {
    throw CommError("connect", rank, -1, std::string("gloo rendezvous failed: ") + e.what());
  } catch (const std::exception& e) {
    throw CommError("connect", rank, -1,
                    "gloo could not connect the full mesh: " + first_line(e.what()) +
                        "; check that every rank is running and that the chosen interface "
                        "(DDP_SOCKET_IFNAME) reaches the others");
  }
  return mesh;
}

}  // namespace

GlooCommunicator::GlooCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                   const CommOptions& options)
    : TransportCommunicator(rank, size, options) {
  ignore_sigpipe_unless_handled();
  const auto before = open_sockets();
  auto device = make_gloo_device(store->endpoint_host(), options);
  const auto config = collectives::AlgorithmConfig::resolve(gloo_algorithm_defaults(), options);
  auto connect_level = [&](const std::shared_ptr<Store>& level_store, int level_rank,
                           int level_size, const std::string& group) {
    GlooStoreBridge bridge(level_store);
    auto mesh = connect_mesh(bridge, device, level_rank, level_size, options.timeout);
    // The exchange gets a mesh of its own: it puts its pairs in synchronous mode.
    gloo::rendezvous::PrefixStore exchange_store("exchange", bridge);
    auto exchange_mesh =
        connect_mesh(exchange_store, device, level_rank, level_size, options.timeout);
    // A round carries what direct_bytes lets each rank send to its peers.
    const std::size_t round_bytes =
        config.direct_bytes / static_cast<std::size_t>(std::max(level_size - 1, 1));
    Level level{std::make_unique<GlooPeerTransport>(std::move(mesh), std::move(exchange_mesh),
                                                    round_bytes, options.timeout),
                config, "gloo's TCP pairs"};
    if (!group.empty()) log::debug("gloo {}: connected {} ranks", group, level_size);
    return level;
  };
  auto connect_node = [&](const std::shared_ptr<Store>& node_store, int local_rank, int local_size,
                          const std::string& group) {
#ifdef DDP_WITH_FABRIC
    // Every rank of the node loads the same module from the same image, so all take this path
    // or all take gloo's pairs below.
    std::string why;
    try {
      auto node = connect_fabric_node(*node_store->with_prefix("fabric"), local_rank, local_size,
                                      options, group);
      return Level{std::move(node.transport), node.config, "libfabric " + node.provider};
    } catch (const ConfigError& e) {
      why = e.what();
    }
    if (this->rank() == 0) {
      log::warn("gloo: the ranks of each node use gloo's TCP pairs, not shared memory: {}", why);
    }
#endif
    return connect_level(node_store, local_rank, local_size, group);
  };
  connect(store, connect_level, connect_node);
  for (const auto& socket : open_sockets()) {
    if (std::find(before.begin(), before.end(), socket) == before.end()) sockets_.push_back(socket);
  }
  AbortNotice::add_waker(this, [this] { wake_blocked_waits(); });
}

GlooCommunicator::~GlooCommunicator() {
  AbortNotice::remove_waker(this);
  shutdown();
}

void GlooCommunicator::wake_blocked_waits() const {
  for (const auto& [fd, inode] : sockets_) {
    struct stat st {};
    if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == inode) {
      ::shutdown(fd, SHUT_RDWR);
    }
  }
}

}  // namespace ddp::detail
