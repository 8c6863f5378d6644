#pragma once
// Lets gloo's rendezvous (connectFullMesh) exchange addresses through our c10d-backed store.
#include <memory>

#include <gloo/rendezvous/store.h>

#include "ddp/store.h"

namespace ddp::detail {

class GlooStoreBridge : public gloo::rendezvous::Store {
 public:
  explicit GlooStoreBridge(std::shared_ptr<ddp::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<ddp::Store> store_;
};

}  // namespace ddp::detail
