#include "parallel/bucket_assignment.h"

#include <algorithm>
#include <map>

namespace ddp::detail {

std::vector<std::vector<std::size_t>> assign_buckets(const std::vector<TensorSlot>& tensors,
                                                     std::size_t first_cap, std::size_t cap) {
  struct Open {
    std::vector<std::size_t> members;
    std::size_t bytes = 0;
    bool first = true;
  };
  std::map<int, Open> open;
  std::vector<std::vector<std::size_t>> buckets;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    Open& b = open[tensors[i].dtype];
    b.members.push_back(i);
    b.bytes += tensors[i].bytes;
    if (b.bytes >= (b.first ? first_cap : cap)) {
      buckets.push_back(std::move(b.members));
      b.members.clear();
      b.bytes = 0;
      b.first = false;
    }
  }
  for (auto& [dtype, b] : open) {
    if (!b.members.empty()) buckets.push_back(std::move(b.members));
  }
  std::sort(buckets.begin(), buckets.end(),
            [](const auto& a, const auto& b) { return a.front() < b.front(); });
  return buckets;
}

}  // namespace ddp::detail
