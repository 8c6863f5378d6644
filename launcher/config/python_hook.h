#pragma once
// --collectives ddprun: unchanged Python scripts get the library's collectives. The agent writes
// a sitecustomize.py into its log folder and puts that folder first on the workers' PYTHONPATH,
// followed by where the ddprun_torch package sits beside this ddprun (build tree or install
// prefix). The hook chains to any sitecustomize found after it, and, once a script imports
// torch.distributed, makes init_process_group("gloo"), a "cpu:gloo" entry, or no backend at all
// on a machine without CUDA, take the "ddprun" backend instead. Nothing else changes: NCCL and
// other backends are left as asked. Without the flag, ddprun_torch's folder beside ddprun goes
// last on PYTHONPATH, so that a script that imports it finds it.
#include <string>
#include <vector>

namespace ddprun {

// The sitecustomize.py text.
const char* python_hook_source();

// Writes <dir>/python-hook/sitecustomize.py; returns the folder to put on PYTHONPATH. Throws
// ddp::ConfigError when it cannot be written.
std::string install_python_hook(const std::string& dir);

// The folders beside `ddprun_path` that hold the ddprun_torch package: <bin>/../lib/python (the
// build tree) and <bin>/../lib/python3/dist-packages (an install prefix), those that exist.
std::vector<std::string> ddprun_torch_dirs(const std::string& ddprun_path);

// `first`, the existing PYTHONPATH (when set and not empty), then `last`, joined with ':'.
std::string python_path(const std::vector<std::string>& first, const std::string* existing,
                        const std::vector<std::string>& last = {});

}  // namespace ddprun
