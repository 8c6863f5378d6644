// The store against PyTorch's own TCPStore, both versions, both directions: Debian's
// python3-torch 1.13 on this machine, and PyTorch 2.6 in the trixie root that
// tests/interop/prepare-torch2-root makes (the ctest fixture interop.torch2_root).
//   - torch's clients (store_conformance.py client) against ddp::StoreServer;
//   - ddp::Store's client against torch's servers (store_conformance.py serve);
//   - two train_mnist ranks whose store is hosted by torch, as under torchrun.
// Every child runs in its own process group, bounded in time and killed by PID at the end.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include "child_process.h"
#include "ddp/error.h"
#include "ddp/store.h"
#include "ddp/store_server.h"
#include "multiprocess.h"

namespace ddprun::testing {
namespace {

using namespace std::chrono_literals;

const std::string kScript = std::string(TEST_SOURCE_DIR) + "/store_conformance.py";
const std::string kTorch2Python = std::string(TEST_SOURCE_DIR) + "/torch2-python";

struct Torch {
  const char* name;
  std::vector<std::string> python;  // argv prefix
};

std::vector<Torch> torches() {
  return {{"torch 1.13", {"/usr/bin/python3"}}, {"torch 2.6", {kTorch2Python}}};
}

// Paths the 2.x root must see at the same place.
std::map<std::string, std::string> torch_env() {
  return {{"DDP_TORCH2_BIND", std::string(TEST_SOURCE_DIR) + ":" + BUILD_DIR},
          {"GLOO_SOCKET_IFNAME", "lo"}};
}

std::vector<std::string> argv_of(const Torch& t, std::vector<std::string> args) {
  std::vector<std::string> argv = t.python;
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// PyTorch 2.6 runs in a chroot of its own mount namespace: root only (CI runs as root).
#define REQUIRE_ROOT()                                        \
  if (geteuid() != 0)                                         \
  GTEST_SKIP() << "needs root: PyTorch 2.6 runs in a chroot " \
                  "(tests/interop/torch2-python)"

TEST(StoreInterop, TorchClientsPassAgainstTheServer) {
  REQUIRE_ROOT();
  ddp::StoreServer server({});
  for (const auto& t : torches()) {
    ChildProcess client(argv_of(t, {kScript, "client", "127.0.0.1", std::to_string(server.port())}),
                        torch_env());
    EXPECT_EQ(client.wait(120s), 0) << t.name << "\n" << client.output();
    EXPECT_NE(client.output().find("all ok"), std::string::npos) << t.name << client.output();
  }
  EXPECT_EQ(server.stats().protocol_errors, 0u);
}

// torch's own TCPStore server (store_conformance.py serve) on a free port, and the port it printed
// (-1 if it printed none).
struct TorchServer {
  explicit TorchServer(const Torch& t) : process(argv_of(t, {kScript, "serve"}), torch_env()) {
    EXPECT_TRUE(process.wait_for_output("port ", 120s)) << process.output();
    std::smatch m;
    const std::string out = process.output();
    if (std::regex_search(out, m, std::regex("port (\\d+)"))) port = std::stoi(m[1]);
  }
  ChildProcess process;
  int port = -1;
};

TEST(StoreInterop, ClientPassesAgainstTorchServers) {
  REQUIRE_ROOT();
  for (const auto& t : torches()) {
    SCOPED_TRACE(t.name);
    TorchServer server(t);
    const int port = server.port;
    ASSERT_GT(port, 0);
    auto store = ddp::Store::connect("127.0.0.1", port, 10s);
    const bool modern = std::string(t.name) != "torch 1.13";
    EXPECT_EQ(store->protocol(),
              modern ? ddp::StoreProtocol::kModern : ddp::StoreProtocol::kLegacy);
    auto s = store->with_prefix("interop");
    const auto base = s->num_keys();
    s->set("k", "v1");
    EXPECT_EQ(s->get("k"), "v1");
    EXPECT_EQ(s->num_keys(), base + 1);
    EXPECT_EQ(s->add("ctr", 5), 5);
    EXPECT_EQ(s->add("ctr", -2), 3);
    EXPECT_EQ(s->compare_set("cs", "", "a"), "a");
    EXPECT_EQ(s->compare_set("cs2", "x", "b"), "x");
    EXPECT_EQ(s->compare_set("cs", "a", "b"), "b");
    EXPECT_EQ(s->compare_set("cs", "zzz", "c"), "b");
    EXPECT_TRUE(s->check({"k", "ctr"}));
    EXPECT_FALSE(s->check({"k", "missing"}));
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(s->wait({"never"}, 300ms), ddp::StoreError);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, 290ms);
    EXPECT_LT(took, 5s);
    // After a timed-out wait the client still works (1.13: on a new connection).
    auto other = ddp::Store::connect("127.0.0.1", port, 10s)->with_prefix("interop");
    std::thread later([&] {
      std::this_thread::sleep_for(200ms);
      other->set("later", "x");
    });
    s->wait({"later"}, 10s);
    later.join();
    EXPECT_EQ(s->get("later"), "x");
    EXPECT_TRUE(s->remove("k"));
    EXPECT_FALSE(s->remove("k"));
    EXPECT_FALSE(s->check({"k"}));
    if (modern) {
      s->append("ap", "x");
      s->append("ap", "yz");
      EXPECT_EQ(s->get("ap"), "xyz");
      s->multi_set({"m1", "m2"}, {"1", "2"});
      EXPECT_EQ(s->multi_get({"m1", "m2"}), (std::vector<std::string>{"1", "2"}));
      // 2.6 has no LIST_KEYS (2.10 added it): its server closes the connection, and the error
      // says why; the next call reconnects.
      try {
        s->list_keys();
        ADD_FAILURE() << "a torch 2.6 server listed keys";
      } catch (const ddp::StoreError& e) {
        EXPECT_NE(std::string(e.what()).find("older than 2.10 has no LIST_KEYS"), std::string::npos)
            << e.what();
      }
      EXPECT_EQ(s->get("m1"), "1");
    } else {
      // 1.13 has no APPEND: the server drops the connection, and the client says so at once.
      EXPECT_THROW(s->append("ap", "x"), ddp::StoreError);
      EXPECT_EQ(s->get("later"), "x");  // and reconnects for the next call
      // Nor MULTI_GET: the client reads the keys one by one (as the communicators' topology
      // exchange does under torchrun 1.13).
      s->set("m1", "1");
      s->set("m2", "2");
      EXPECT_EQ(s->multi_get({"m1", "m2"}), (std::vector<std::string>{"1", "2"}));
    }
  }
}

TEST(StoreInterop, TrainMnistRunsUnderATorchHostedStore) {
#ifndef TRAIN_MNIST_PATH
  GTEST_SKIP() << "train_mnist is not built here (DDP_BUILD_EXAMPLES=OFF)";
#else
  REQUIRE_ROOT();
  for (const auto& t : torches()) {
    SCOPED_TRACE(t.name);
    TorchServer server(t);
    const int port = server.port;
    ASSERT_GT(port, 0);
    std::vector<std::unique_ptr<ChildProcess> > ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{TRAIN_MNIST_PATH, "--train-subset", "512", "--test-subset",
                                   "256", "--max-steps", "6", "--batch-size", "32", "--threads",
                                   "1"},
          std::map<std::string, std::string>{{"RANK", std::to_string(r)},
                                             {"LOCAL_RANK", std::to_string(r)},
                                             {"WORLD_SIZE", "2"},
                                             {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "127.0.0.1"},
                                             {"MASTER_PORT", std::to_string(port)},
                                             {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                             {"DDP_TIMEOUT_SEC", "60"}}));
    }
    for (auto& r : ranks) EXPECT_EQ(r->wait(300s), 0) << r->output();
  }
#endif
}

}  // namespace
}  // namespace ddprun::testing
