#include "comm/gloo/gloo_store_bridge.h"

namespace ddp::detail {

void GlooStoreBridge::set(const std::string& key, const std::vector<char>& data) {
  store_->set(key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStoreBridge::get(const std::string& key) {
  const std::string value = store_->get(key);
  return {value.begin(), value.end()};
}

void GlooStoreBridge::wait(const std::vector<std::string>& keys) { store_->wait(keys); }

void GlooStoreBridge::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  store_->wait(keys, timeout);
}

}  // namespace ddp::detail
