// ddp/capi.h: the C ABI over communicators. Each entry point turns the library's exceptions into
// a return code and one line in the caller's buffer; nothing C++ crosses the boundary.
#include "ddp/capi.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ddp/comm/communicator.h"
#include "ddp/comm/factory.h"
#include "ddp/error.h"
#include "ddp/store.h"
#include "store/store_backend.h"

struct ddp_comm {
  std::unique_ptr<ddp::Communicator> comm;
};

struct ddp_work {
  ddp::Work work;
};

namespace {

struct Reply {
  std::vector<std::string> values;
};

void write_error(char* err, std::size_t err_len, const std::string& message) {
  if (err == nullptr || err_len == 0) return;
  const std::size_t n = std::min(message.size(), err_len - 1);
  std::memcpy(err, message.data(), n);
  err[n] = '\0';
}

const char* store_op_name(int op) {
  static const char* const kNames[] = {"set",       "get",       "add",     "compare_set",
                                       "check",     "wait",      "delete",  "append",
                                       "multi_get", "multi_set", "num_keys"};
  return op >= 0 && op <= DDP_STORE_NUM_KEYS ? kNames[op] : "unknown";
}

// The caller's store, one callback per operation. Keys arrive with the Store's prefix applied.
class CallbackStoreBackend final : public ddp::detail::StoreBackend {
 public:
  CallbackStoreBackend(ddp_store_fn fn, void* ctx, std::string host,
                       std::chrono::milliseconds timeout)
      : fn_(fn), ctx_(ctx), host_(std::move(host)), timeout_(timeout) {}

  void set(const std::string& key, const std::string& value) override {
    call(DDP_STORE_SET, {key, value});
  }
  std::string get(const std::string& key) override { return one(call(DDP_STORE_GET, {key})); }
  int64_t add(const std::string& key, int64_t delta) override {
    return std::stoll(one(call(DDP_STORE_ADD, {key}, delta)));
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return one(call(DDP_STORE_COMPARE_SET, {key, expected, desired}));
  }
  bool check(const std::vector<std::string>& keys) override {
    return one(call(DDP_STORE_CHECK, keys)) == "1";
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    call(DDP_STORE_WAIT, keys, timeout.count());
  }
  bool remove(const std::string& key) override { return one(call(DDP_STORE_DELETE, {key})) == "1"; }
  void append(const std::string& key, const std::string& value) override {
    call(DDP_STORE_APPEND, {key, value});
  }
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override {
    auto values = call(DDP_STORE_MULTI_GET, keys);
    if (values.size() != keys.size()) throw malformed(DDP_STORE_MULTI_GET);
    return values;
  }
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override {
    std::vector<std::string> args;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      args.push_back(keys[i]);
      args.push_back(values[i]);
    }
    call(DDP_STORE_MULTI_SET, args);
  }
  int64_t num_keys() override { return std::stoll(one(call(DDP_STORE_NUM_KEYS, {}))); }

  const std::string& endpoint_host() const override { return host_; }
  int port() const override { return 0; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  ddp::StoreProtocol protocol() const override { return ddp::StoreProtocol::kModern; }
  const char* name() const override { return "caller's"; }

 private:
  std::vector<std::string> call(int op, const std::vector<std::string>& args,
                                int64_t number = 0) const {
    std::vector<const char*> data;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      data.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply reply;
    const int rc = fn_(ctx_, op, data.data(), lens.data(), args.size(), number, &reply);
    if (rc != 0) {
      const std::string why = reply.values.empty() ? "no reason given" : reply.values.back();
      throw ddp::StoreError(std::string("store ") + store_op_name(op) + " failed: " + why);
    }
    return std::move(reply.values);
  }
  std::string one(std::vector<std::string> values) const {
    if (values.size() != 1) throw malformed(-1);
    return std::move(values.front());
  }
  static ddp::StoreError malformed(int op) {
    return ddp::StoreError(std::string("the caller's store answered ") + store_op_name(op) +
                           " with the wrong number of values");
  }

  ddp_store_fn fn_;
  void* ctx_;
  std::string host_;
  std::chrono::milliseconds timeout_;
};

// Runs `body`; turns any exception into `fallback` and a line in `err`.
template <typename T, typename Body>
T guarded(char* err, std::size_t err_len, T fallback, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    write_error(err, err_len, e.what());
  } catch (...) {
    write_error(err, err_len, "unknown error");
  }
  return fallback;
}

ddp::DataType to_dtype(int code) {
  if (code < DDP_DTYPE_FLOAT32 || code > DDP_DTYPE_INT64) {
    throw ddp::ConfigError("dtype code " + std::to_string(code) + " is not one of ddp/capi.h's");
  }
  return static_cast<ddp::DataType>(code);
}

ddp::ReduceOp to_op(int code) {
  if (code < DDP_OP_SUM || code > DDP_OP_MAX) {
    throw ddp::ConfigError("reduce op code " + std::to_string(code) +
                           " is not one of ddp/capi.h's");
  }
  return static_cast<ddp::ReduceOp>(code);
}

}  // namespace

extern "C" {

void ddp_store_reply(void* reply, const char* data, size_t len) {
  static_cast<Reply*>(reply)->values.emplace_back(data, len);
}

int ddp_capi_version(void) { return DDP_CAPI_VERSION; }

ddp_comm* ddp_comm_create(const char* backend, ddp_store_fn store, void* store_ctx,
                          const char* store_host, int rank, int size, int64_t timeout_ms, char* err,
                          size_t err_len) {
  return guarded<ddp_comm*>(err, err_len, nullptr, [&] {
    const std::string name =
        backend != nullptr && *backend != '\0' ? backend : ddp::backend_from_env();
    const std::chrono::milliseconds timeout(timeout_ms);
    auto adopted = ddp::Store::adopt(std::make_shared<CallbackStoreBackend>(
        store, store_ctx, store_host != nullptr ? store_host : "127.0.0.1", timeout));
    ddp::CommOptions options;
    options.timeout = timeout;
    return new ddp_comm{ddp::create_communicator(name, adopted, rank, size, options)};
  });
}

void ddp_comm_destroy(ddp_comm* comm) {
  try {
    delete comm;
  } catch (...) {
  }
}

const char* ddp_comm_backend(const ddp_comm* comm) { return comm->comm->backend_name(); }

int ddp_comm_hierarchical(const ddp_comm* comm) { return comm->comm->hierarchical() ? 1 : 0; }

ddp_work* ddp_allreduce(ddp_comm* comm, void* data, size_t count, int dtype, int op, char* err,
                        size_t err_len) {
  return guarded<ddp_work*>(err, err_len, nullptr, [&] {
    return new ddp_work{
        comm->comm->allreduce_async(ddp::Buffer(data, count, to_dtype(dtype)), to_op(op))};
  });
}

ddp_work* ddp_broadcast(ddp_comm* comm, void* data, size_t count, int dtype, int root, char* err,
                        size_t err_len) {
  return guarded<ddp_work*>(err, err_len, nullptr, [&] {
    return new ddp_work{
        comm->comm->broadcast_async(ddp::Buffer(data, count, to_dtype(dtype)), root)};
  });
}

ddp_work* ddp_allgather(ddp_comm* comm, const void* input, void* output, size_t count, int dtype,
                        char* err, size_t err_len) {
  return guarded<ddp_work*>(err, err_len, nullptr, [&] {
    const auto type = to_dtype(dtype);
    const auto total = count * static_cast<std::size_t>(comm->comm->size());
    return new ddp_work{comm->comm->allgather_async(
        ddp::Buffer(const_cast<void*>(input), count, type), ddp::Buffer(output, total, type))};
  });
}

ddp_work* ddp_reduce_scatter(ddp_comm* comm, const void* input, void* output, size_t count,
                             int dtype, int op, char* err, size_t err_len) {
  return guarded<ddp_work*>(err, err_len, nullptr, [&] {
    const auto type = to_dtype(dtype);
    const auto total = count * static_cast<std::size_t>(comm->comm->size());
    return new ddp_work{
        comm->comm->reduce_scatter_async(ddp::Buffer(const_cast<void*>(input), total, type),
                                         ddp::Buffer(output, count, type), to_op(op))};
  });
}

ddp_work* ddp_barrier(ddp_comm* comm, char* err, size_t err_len) {
  return guarded<ddp_work*>(err, err_len, nullptr,
                            [&] { return new ddp_work{comm->comm->barrier_async()}; });
}

int ddp_work_wait(ddp_work* work, char* err, size_t err_len) {
  return guarded<int>(err, err_len, 1, [&] {
    work->work.wait();
    return 0;
  });
}

int ddp_work_completed(const ddp_work* work) { return work->work.completed() ? 1 : 0; }

void ddp_work_free(ddp_work* work) { delete work; }

}  // extern "C"
