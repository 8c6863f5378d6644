#include "parallel/module_state_sync.h"

#include <map>

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>

#include "ddp/error.h"

namespace ddp::detail {
namespace {

// [count, then per tensor: kind, dtype, rank, dims...]
std::vector<int64_t> signature_of(const std::vector<NamedTensor>& tensors) {
  std::vector<int64_t> sig{static_cast<int64_t>(tensors.size())};
  for (const auto& t : tensors) {
    sig.push_back(t.kind == "parameter" ? 0 : 1);
    sig.push_back(static_cast<int64_t>(t.tensor.scalar_type()));
    sig.push_back(t.tensor.dim());
    for (int64_t d : t.tensor.sizes()) sig.push_back(d);
  }
  return sig;
}

struct Entry {
  int64_t kind = -1;
  int64_t dtype = -1;
  std::vector<int64_t> dims;
  bool operator==(const Entry& o) const {
    return kind == o.kind && dtype == o.dtype && dims == o.dims;
  }
};

// Parses a signature defensively (rank 0's arrives over the wire).
std::vector<Entry> parse(const std::vector<int64_t>& sig) {
  std::vector<Entry> entries;
  std::size_t at = 1;
  const int64_t count = sig.empty() ? 0 : sig[0];
  for (int64_t i = 0; i < count && at + 3 <= sig.size(); ++i) {
    Entry e;
    e.kind = sig[at++];
    e.dtype = sig[at++];
    const int64_t rank = sig[at++];
    for (int64_t d = 0; d < rank && at < sig.size(); ++d) e.dims.push_back(sig[at++]);
    entries.push_back(std::move(e));
  }
  return entries;
}

std::string describe(const Entry& e) {
  std::string text = c10::toString(static_cast<at::ScalarType>(e.dtype));
  text += " [";
  for (std::size_t i = 0; i < e.dims.size(); ++i)
    text += (i ? ", " : "") + std::to_string(e.dims[i]);
  return text + "]";
}

std::string kind_name(int64_t kind) { return kind == 0 ? "parameter" : "buffer"; }

}  // namespace

void verify_same_tensors(const std::vector<NamedTensor>& tensors, Communicator& comm) {
  const std::vector<int64_t> mine = signature_of(tensors);
  std::vector<int64_t> length{static_cast<int64_t>(mine.size())};
  comm.broadcast(length, 0);
  std::vector<int64_t> root(length[0]);
  if (comm.rank() == 0) root = mine;
  comm.broadcast(root, 0);

  const std::vector<Entry> ours = parse(mine);
  const std::vector<Entry> theirs = parse(root);
  int64_t first_difference = -1;
  for (std::size_t i = 0; i < std::max(ours.size(), theirs.size()); ++i) {
    if (i >= ours.size() || i >= theirs.size() || !(ours[i] == theirs[i])) {
      first_difference = static_cast<int64_t>(i);
      break;
    }
  }
  std::vector<int64_t> verdict{first_difference};
  std::vector<int64_t> verdicts(comm.size());
  comm.allgather(verdict, verdicts);

  std::string differing;
  for (int r = 0; r < comm.size(); ++r) {
    if (verdicts[r] >= 0) differing += (differing.empty() ? "" : ", ") + std::to_string(r);
  }
  if (differing.empty()) return;
  const std::string fix = "; every rank must build the same model (architecture and input shape)";
  if (first_difference < 0) {
    throw ConfigError("rank(s) " + differing + " built a different model than rank 0 (see their " +
                      "error for the first difference)" + fix);
  }
  const auto i = static_cast<std::size_t>(first_difference);
  const std::string here = "rank " + std::to_string(comm.rank());
  if (i >= theirs.size()) {
    throw ConfigError(tensors[i].kind + " '" + tensors[i].name + "' (" + describe(ours[i]) +
                      ") exists on " + here + " but rank 0 has only " +
                      std::to_string(theirs.size()) + " parameters and buffers" + fix);
  }
  if (i >= ours.size()) {
    throw ConfigError(here + " has " + std::to_string(ours.size()) +
                      " parameters and buffers but rank 0 has more (the next is a " +
                      kind_name(theirs[i].kind) + " " + describe(theirs[i]) + ")" + fix);
  }
  throw ConfigError(tensors[i].kind + " '" + tensors[i].name + "' is " + describe(ours[i]) +
                    " on " + here + " but rank 0 has a " + kind_name(theirs[i].kind) + " " +
                    describe(theirs[i]) + " there" + fix);
}

void broadcast_from_rank0(const std::vector<at::Tensor>& tensors, Communicator& comm) {
  if (comm.size() == 1 || tensors.empty()) return;
  c10::AutoGradMode no_grad(false);
  // One flat buffer per wire dtype; integer and bool tensors travel as int64.
  std::map<at::ScalarType, std::vector<const at::Tensor*>> groups;
  for (const auto& t : tensors) {
    const auto type = t.scalar_type();
    const bool native = type == at::kFloat || type == at::kDouble || type == at::kBFloat16 ||
                        type == at::kHalf || type == at::kInt || type == at::kLong;
    groups[native ? type : at::kLong].push_back(&t);
  }
  for (auto& [wire, members] : groups) {
    int64_t total = 0;
    for (const auto* t : members) total += t->numel();
    at::Tensor flat;
    if (comm.rank() == 0) {
      std::vector<at::Tensor> pieces;
      for (const auto* t : members) pieces.push_back(t->reshape({-1}).to(wire));
      flat = at::cat(pieces).contiguous();
    } else {
      flat = at::empty({total}, at::TensorOptions().dtype(wire));
    }
    comm.broadcast(flat, 0);
    if (comm.rank() == 0) continue;
    int64_t offset = 0;
    for (const auto* t : members) {
      t->copy_(flat.narrow(0, offset, t->numel()).view(t->sizes()));
      offset += t->numel();
    }
  }
}

}  // namespace ddp::detail
