// The C ABI (ddp/capi.h) as a binding uses it: a store given as a callback, collectives as
// handles that are waited on and freed, failures as one line in the caller's buffer.
#include "ddp/capi.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// An in-memory store behind the callback, as a binding's store would answer.
struct MemoryStore {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> values;
  std::string refuse;  // when set: every call fails with this message

  static int call(void* ctx, int op, const char* const* args, const size_t* lens, size_t nargs,
                  int64_t number, void* reply) {
    return static_cast<MemoryStore*>(ctx)->answer(op, args, lens, nargs, number, reply);
  }

  int answer(int op, const char* const* args, const size_t* lens, size_t nargs, int64_t number,
             void* reply) {
    std::vector<std::string> a;
    for (size_t i = 0; i < nargs; ++i) a.emplace_back(args[i], lens[i]);
    auto put = [&](const std::string& v) { ddp_store_reply(reply, v.data(), v.size()); };
    std::unique_lock<std::mutex> lock(mutex);
    if (!refuse.empty()) {
      put(refuse);
      return 1;
    }
    auto has_all = [&](size_t from) {
      for (size_t i = from; i < a.size(); ++i) {
        if (values.count(a[i]) == 0) return false;
      }
      return true;
    };
    switch (op) {
      case DDP_STORE_SET:
        values[a[0]] = a[1];
        changed.notify_all();
        return 0;
      case DDP_STORE_GET:
      case DDP_STORE_MULTI_GET:
        if (!changed.wait_for(lock, std::chrono::seconds(10), [&] { return has_all(0); })) {
          put("key missing");
          return 1;
        }
        for (const auto& k : a) put(values[k]);
        return 0;
      case DDP_STORE_ADD: {
        const int64_t v = (values.count(a[0]) ? std::stoll(values[a[0]]) : 0) + number;
        values[a[0]] = std::to_string(v);
        changed.notify_all();
        put(values[a[0]]);
        return 0;
      }
      case DDP_STORE_CHECK:
        put(has_all(0) ? "1" : "0");
        return 0;
      case DDP_STORE_WAIT:
        if (!changed.wait_for(lock, std::chrono::milliseconds(number),
                              [&] { return has_all(0); })) {
          put("wait timed out");
          return 1;
        }
        return 0;
      case DDP_STORE_DELETE:
        put(values.erase(a[0]) ? "1" : "0");
        return 0;
      default:
        put("operation " + std::to_string(op) + " not served by this test store");
        return 1;
    }
  }
};

struct Rank {
  ddp_comm* comm = nullptr;
  std::string error;
};

// Connects `size` ranks on threads through one store.
std::vector<Rank> connect(MemoryStore& store, int size, int64_t timeout_ms = 20000) {
  std::vector<Rank> ranks(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      char err[512] = "";
      ranks[r].comm = ddp_comm_create("gloo", &MemoryStore::call, &store, "127.0.0.1", r, size,
                                      timeout_ms, err, sizeof(err));
      ranks[r].error = err;
    });
  }
  for (auto& t : threads) t.join();
  return ranks;
}

void wait_ok(ddp_work* work) {
  ASSERT_NE(work, nullptr);
  char err[512] = "";
  EXPECT_EQ(ddp_work_wait(work, err, sizeof(err)), 0) << err;
  EXPECT_EQ(ddp_work_completed(work), 1);
  ddp_work_free(work);
}

TEST(CApi, TheVersionIsTheHeaders) { EXPECT_EQ(ddp_capi_version(), DDP_CAPI_VERSION); }

TEST(CApi, TwoRanksRunEveryCollectiveThroughTheCallersStore) {
  MemoryStore store;
  auto ranks = connect(store, 2);
  for (const auto& r : ranks) ASSERT_NE(r.comm, nullptr) << r.error;
  EXPECT_STREQ(ddp_comm_backend(ranks[0].comm), "gloo");
  std::vector<std::thread> threads;
  std::vector<std::vector<double>> sums(2), gathered(2), scattered(2);
  std::vector<std::vector<int64_t>> broadcast(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      char err[512] = "";
      ddp_comm* c = ranks[r].comm;
      sums[r] = {1.0 + r, 10.0 * (r + 1)};
      wait_ok(ddp_allreduce(c, sums[r].data(), 2, DDP_DTYPE_FLOAT64, DDP_OP_SUM, err, 512));
      broadcast[r] = {r == 1 ? 7 : 0, r == 1 ? -3 : 0};
      wait_ok(ddp_broadcast(c, broadcast[r].data(), 2, DDP_DTYPE_INT64, 1, err, 512));
      const double mine = 0.5 + r;
      gathered[r].assign(2, 0.0);
      wait_ok(ddp_allgather(c, &mine, gathered[r].data(), 1, DDP_DTYPE_FLOAT64, err, 512));
      const std::vector<double> blocks = {1.0 * r, 2.0 * r + 1};
      scattered[r].assign(1, 0.0);
      wait_ok(ddp_reduce_scatter(c, blocks.data(), scattered[r].data(), 1, DDP_DTYPE_FLOAT64,
                                 DDP_OP_MAX, err, 512));
      wait_ok(ddp_barrier(c, err, 512));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(sums[r], (std::vector<double>{3.0, 30.0}));
    EXPECT_EQ(broadcast[r], (std::vector<int64_t>{7, -3}));
    EXPECT_EQ(gathered[r], (std::vector<double>{0.5, 1.5}));
    EXPECT_EQ(scattered[r], (std::vector<double>{r == 0 ? 1.0 : 3.0}));
    ddp_comm_destroy(ranks[r].comm);
  }
}

TEST(CApi, BadCodesAndSizesFailWithOneLineAndNoHandle) {
  MemoryStore store;
  auto ranks = connect(store, 1);
  ASSERT_NE(ranks[0].comm, nullptr) << ranks[0].error;
  char err[512] = "";
  float x = 1;
  EXPECT_EQ(ddp_allreduce(ranks[0].comm, &x, 1, 17, DDP_OP_SUM, err, sizeof(err)), nullptr);
  EXPECT_NE(std::string(err).find("dtype code 17"), std::string::npos) << err;
  EXPECT_EQ(ddp_allreduce(ranks[0].comm, &x, 1, DDP_DTYPE_FLOAT32, 9, err, sizeof(err)), nullptr);
  EXPECT_NE(std::string(err).find("reduce op code 9"), std::string::npos) << err;
  EXPECT_EQ(ddp_broadcast(ranks[0].comm, &x, 1, DDP_DTYPE_FLOAT32, 3, err, sizeof(err)), nullptr);
  EXPECT_NE(std::string(err).find("root"), std::string::npos) << err;
  ddp_comm_destroy(ranks[0].comm);
}

TEST(CApi, AStoreThatFailsFailsTheConnectWithItsReasonAndTruncatesSafely) {
  MemoryStore store;
  store.refuse = "the store is read-only";
  char err[512] = "";
  EXPECT_EQ(ddp_comm_create("gloo", &MemoryStore::call, &store, "127.0.0.1", 0, 2, 2000, err,
                            sizeof(err)),
            nullptr);
  EXPECT_NE(std::string(err).find("the store is read-only"), std::string::npos) << err;
  char tiny[8] = "xxxxxxx";
  EXPECT_EQ(ddp_comm_create("gloo", &MemoryStore::call, &store, "127.0.0.1", 0, 2, 2000, tiny,
                            sizeof(tiny)),
            nullptr);
  EXPECT_EQ(std::string(tiny).size(), 7u);
}

TEST(CApi, AnUnknownBackendIsRefusedByName) {
  MemoryStore store;
  char err[512] = "";
  EXPECT_EQ(ddp_comm_create("carrier-pigeon", &MemoryStore::call, &store, "127.0.0.1", 0, 1, 2000,
                            err, sizeof(err)),
            nullptr);
  EXPECT_NE(std::string(err).find("carrier-pigeon"), std::string::npos) << err;
}

}  // namespace
