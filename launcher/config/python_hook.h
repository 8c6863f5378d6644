#pragma once
// ddprun's Python hook. The agent writes a sitecustomize.py into its log folder and puts that
// folder first on the workers' PYTHONPATH (unless DDP_PYTHON_HOOK=off). The hook chains to any
// sitecustomize found after it and patches torch as its modules are imported:
// - always: TORCHELASTIC_USE_AGENT_STORE holds only for the agent's store (MASTER_PORT), so that
//   init_process_group(init_method="tcp://host:port") on a port of the script's own gets a store
//   served by its rank 0, as without a launcher, where torch 1.13-2.x under torchrun leave every
//   rank waiting 30 minutes for a server nobody starts (pytorch PR #192113);
// - with --collectives ddprun (a "collectives" file beside it): init_process_group("gloo"), a
//   "cpu:gloo" entry, or no backend at all on a machine without CUDA, take the library's
//   "ddprun" backend; the ddprun_torch package beside this ddprun (build tree or install prefix)
//   then follows the hook on PYTHONPATH. NCCL and other backends are left as asked.
// Otherwise ddprun_torch's folder goes last on PYTHONPATH, so that a script that imports it
// finds it.
#include <string>
#include <vector>

namespace ddprun {

// The sitecustomize.py text.
const char* python_hook_source();

// Writes <dir>/python-hook/sitecustomize.py (and its "collectives" marker when asked, removing
// an old one otherwise); returns the folder to put on PYTHONPATH. Throws ddp::ConfigError when
// it cannot be written.
std::string install_python_hook(const std::string& dir, bool collectives);

// The hook of one agent's run, in a folder of its own under TMPDIR (never in --log-dir, whose
// files stay those torchrun writes), removed with it.
class PythonHook {
 public:
  explicit PythonHook(bool collectives);
  ~PythonHook();
  PythonHook(const PythonHook&) = delete;
  PythonHook& operator=(const PythonHook&) = delete;
  // The folder to put first on PYTHONPATH.
  const std::string& path() const { return path_; }

 private:
  std::string root_;
  std::string path_;
};

// The folders beside `ddprun_path` that hold the ddprun_torch package: <bin>/../lib/python (the
// build tree) and <bin>/../lib/python3/dist-packages (an install prefix), those that exist.
std::vector<std::string> ddprun_torch_dirs(const std::string& ddprun_path);

// `first`, the existing PYTHONPATH (when set and not empty), then `last`, joined with ':'.
std::string python_path(const std::vector<std::string>& first, const std::string* existing,
                        const std::vector<std::string>& last = {});

}  // namespace ddprun
