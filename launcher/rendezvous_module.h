#pragma once
// Loads the store-backed rendezvous (store_rendezvous.h), a module that links libtorch, on a
// thread of its own. Loading libtorch is most of ddprun's start-up time; started first thing,
// it overlaps with everything ddprun can do before it needs the store (on one node: starting
// the workers, which load libtorch themselves).
#include <functional>
#include <future>
#include <memory>

#include "rendezvous.h"

namespace ddprun {

class RendezvousModule {
 public:
  // Starts loading the module.
  RendezvousModule();
  ~RendezvousModule();
  RendezvousModule(const RendezvousModule&) = delete;
  RendezvousModule& operator=(const RendezvousModule&) = delete;

  // Waits for the module, then creates the rendezvous (see StoreRendezvous's constructor).
  // Throws ddp::Error when the module cannot be loaded.
  std::unique_ptr<Rendezvous> create(const LaunchConfig& config, const HostFacts& host,
                                     std::function<void()> poll_interrupt);

 private:
  using Factory = Rendezvous* (*)(const LaunchConfig&, const HostFacts&, std::function<void()>);
  std::future<Factory> factory_;
};

}  // namespace ddprun
