#include "config/python_hook.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace ddprun {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "ddprun-hook-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string run(const std::string& command) {
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  std::array<char, 256> buffer{};
  while (pipe && fgets(buffer.data(), buffer.size(), pipe.get()) != nullptr) out += buffer.data();
  return out;
}

// The tests that run the hook under Python need Debian's python3-torch.
#define REQUIRE_TORCH()                                                          \
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)    \
  GTEST_SKIP() << "/usr/bin/python3 cannot import torch; install python3-torch " \
                  "(scripts/install-deps)"

TEST(PythonHook, ThePythonPathPutsTheHookFirstAndKeepsTheAgents) {
  const std::string existing = "/opt/mine";
  const std::string empty;
  EXPECT_EQ(python_path({"/h", "/p"}, &existing), "/h:/p:/opt/mine");
  EXPECT_EQ(python_path({"/h"}, nullptr), "/h");
  EXPECT_EQ(python_path({"/h"}, &empty), "/h");
  EXPECT_EQ(python_path({}, &existing, {"/p"}), "/opt/mine:/p");
  EXPECT_EQ(python_path({}, nullptr, {"/p"}), "/p");
}

TEST(PythonHook, ThePackageIsFoundBesideDdprunInABuildTreeAndAnInstallPrefix) {
  TempDir root;
  fs::create_directories(root.path / "bin");
  fs::create_directories(root.path / "launcher");
  EXPECT_TRUE(ddprun_torch_dirs((root.path / "bin" / "ddprun").string()).empty());
  for (const char* where : {"lib/python/ddprun_torch", "lib/python3/dist-packages/ddprun_torch"}) {
    fs::create_directories(root.path / where);
    std::ofstream(root.path / where / "__init__.py") << "\n";
  }
  const auto build = ddprun_torch_dirs((root.path / "launcher" / "ddprun").string());
  ASSERT_EQ(build.size(), 2u);
  EXPECT_EQ(build[0], (root.path / "lib" / "python").string());
  EXPECT_EQ(build[1], (root.path / "lib" / "python3" / "dist-packages").string());
}

// The hook's own choices, run by Python: gloo and no backend become ddprun (this machine has no
// CUDA), a device string keeps its other devices, anything else stays; and it chains to the
// next sitecustomize on sys.path.
TEST(PythonHook, TheHookSwapsGlooAndChainsToTheNextSitecustomize) {
  REQUIRE_TORCH();
  TempDir dir;
  const std::string hook = install_python_hook(dir.path.string(), true);
  std::ifstream written(hook + "/sitecustomize.py");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(written), {}), python_hook_source());
  const fs::path other = dir.path / "other";
  fs::create_directories(other);
  std::ofstream(other / "sitecustomize.py") << "import builtins\nbuiltins.CHAINED = True\n";
  const std::string out =
      run("PYTHONPATH=" + hook + ":" + other.string() +
          " /usr/bin/python3 -c 'import builtins, sitecustomize as s; print(builtins.CHAINED, "
          "s._swap(None), s._swap(\"gloo\"), s._swap(\"GLOO\"), s._swap(\"cpu:gloo,cuda:nccl\"), "
          "s._swap(\"nccl\"), s._swap(\"cpu:mpi\"))' 2>&1");
  EXPECT_EQ(out, "True ddprun ddprun ddprun cpu:ddprun,cuda:nccl nccl cpu:mpi\n");
  // Without --collectives the same folder's hook leaves init_process_group alone; the marker of
  // the run before is gone.
  install_python_hook(dir.path.string(), false);
  EXPECT_FALSE(fs::exists(fs::path(hook) / "collectives"));
  EXPECT_EQ(run("PYTHONPATH=" + hook +
                " /usr/bin/python3 -c 'import sitecustomize as s, torch.distributed as d; "
                "print(s._COLLECTIVES, d.init_process_group.__module__)' 2>&1"),
            "False torch.distributed.distributed_c10d\n");
}

// Under the agent's store flag, a store on a port of the script's own (init_method="tcp://...")
// is served by rank 0, as without a launcher; torch alone makes every rank a client of it, and
// rank 0 then waits for a server nobody starts (here for 2 s; 30 minutes by default).
TEST(PythonHook, AStoreOfTheScriptsOwnIsServedByRankZeroUnderTheAgentStoreFlag) {
  REQUIRE_TORCH();
  TempDir dir;
  const std::string hook = install_python_hook(dir.path.string(), false);
  const std::string script =
      " /usr/bin/python3 -c 'import datetime, socket, sys, torch.distributed.rendezvous\n"
      "r = sys.modules[\"torch.distributed.rendezvous\"]\n"
      "s = socket.socket(); s.bind((\"127.0.0.1\", 0)); port = s.getsockname()[1]; s.close()\n"
      "try:\n"
      "    store = r._create_c10d_store(\"127.0.0.1\", port, 0, 1, datetime.timedelta(seconds=2))\n"
      "    store.set(\"k\", \"v\"); print(\"served\", store.get(\"k\").decode())\n"
      "except Exception as e:\n"
      "    print(\"failed\", type(e).__name__)' 2>&1";
  const std::string env = "TORCHELASTIC_USE_AGENT_STORE=True MASTER_PORT=1 ";
  EXPECT_EQ(run(env + "PYTHONPATH=" + hook + script), "served v\n");
  EXPECT_NE(run(env + script).find("failed"), std::string::npos);
}

}  // namespace
}  // namespace ddprun
