#include "config/python_hook.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddp/error.h"

namespace ddprun {

namespace {

// The sitecustomize.py the agent writes (python_hook.h): data, kept here so that ddprun stays one
// self-contained binary.
constexpr const char kHookSource[] =
    R"PY(# Written by ddprun for its Python workers (launcher/config/python_hook.h). Chains to the next
# sitecustomize on sys.path. Two patches, each applied when its torch module is first imported:
# - torch.distributed.rendezvous: TORCHELASTIC_USE_AGENT_STORE is honoured only at the agent's
#   own store (MASTER_PORT), so that init_method="tcp://host:port" on a port of the script's own
#   works as it does without a launcher, instead of every rank waiting 30 minutes for a server
#   nobody starts (the fix of pytorch PR #192113, for every torch 1.13 and 2.x);
# - with --collectives ddprun: gloo CPU collectives take the library's "ddprun" backend.
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_COLLECTIVES = os.path.exists(os.path.join(_HERE, "collectives"))


def _chain():
    saved, mine = sys.path[:], sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
        try:
            importlib.import_module("sitecustomize")
        except ImportError as e:
            if e.name != "sitecustomize":
                raise
    finally:
        sys.path[:] = saved
        if mine is not None:
            sys.modules["sitecustomize"] = mine


def _at_agent_store(port):
    """Whether a store endpoint is the agent's: its port is MASTER_PORT (torch's own C++ test
    for forgiving a failed bind under the agent store)."""
    try:
        return int(port) == int(os.environ.get("MASTER_PORT", "-1"))
    except (TypeError, ValueError):
        return False


def _patch_rendezvous(module):
    original = getattr(module, "_create_c10d_store", None)
    if original is None:
        return

    @functools.wraps(original)
    def _create_c10d_store(hostname, port, *args, **kwargs):
        flag = "TORCHELASTIC_USE_AGENT_STORE"
        if os.environ.get(flag) != "True" or _at_agent_store(port):
            return original(hostname, port, *args, **kwargs)
        # A store of the script's own: rank 0 serves it, as without a launcher.
        saved = os.environ.pop(flag)
        try:
            return original(hostname, port, *args, **kwargs)
        finally:
            os.environ[flag] = saved

    module._create_c10d_store = _create_c10d_store


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _swap(backend):
    """The backend init_process_group gets: gloo's CPU part, or no backend, becomes ddprun."""
    if backend is None:
        return "cpu:ddprun,cuda:nccl" if _cuda() else "ddprun"
    text = str(backend).lower()
    if text == "gloo":
        return "cpu:ddprun,cuda:gloo" if _cuda() else "ddprun"
    if ":" in text:
        pairs = [p.split(":", 1) for p in text.split(",")]
        if any(d.strip() == "cpu" and b.strip() == "gloo" for d, b in pairs):
            return ",".join(f"{d}:ddprun" if d.strip() == "cpu" and b.strip() == "gloo"
                            else f"{d}:{b}" for d, b in pairs)
    return backend


def _patch_c10d(module):
    original = module.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        asked = args[0] if args else kwargs.get("backend")
        backend = _swap(asked)
        if backend != asked:
            try:
                import ddprun_torch  # noqa: F401 -- registers the backend
            except ImportError as e:
                raise RuntimeError(
                    f"ddprun --collectives ddprun: the ddprun_torch package cannot be imported "
                    f"({e}); copy it into the image beside ddprun (k8s/README.md) or drop the "
                    f"flag") from None
            if os.environ.get("RANK", "0") == "0":
                print(f"ddprun: CPU collectives on the ddprun backend ({asked!r} became "
                      f"{backend!r}; --collectives ddprun)", file=sys.stderr, flush=True)
            if args:
                args = (backend,) + args[1:]
            else:
                kwargs["backend"] = backend
        return original(*args, **kwargs)

    module.init_process_group = init_process_group


_TARGETS = {"torch.distributed.rendezvous": _patch_rendezvous}
if _COLLECTIVES:
    _TARGETS["torch.distributed.distributed_c10d"] = _patch_c10d


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _TARGETS.pop(name, None)
        if patch is None:
            return None
        if not _TARGETS:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_chain()
for _name in [n for n in _TARGETS if n in sys.modules]:
    _TARGETS.pop(_name)(sys.modules[_name])
if _TARGETS:
    sys.meta_path.insert(0, _Finder())
)PY";

}  // namespace

const char* python_hook_source() { return kHookSource; }

std::string install_python_hook(const std::string& dir, bool collectives) {
  const std::string hook_dir = dir + "/python-hook";
  std::error_code ec;
  std::filesystem::create_directories(hook_dir, ec);
  std::ofstream out(hook_dir + "/sitecustomize.py", std::ios::trunc);
  out << python_hook_source();
  out.close();
  // The marker turns the collectives part on; one left by an earlier run in this folder goes.
  if (collectives) {
    std::ofstream(hook_dir + "/collectives", std::ios::trunc) << "on\n";
  } else {
    std::filesystem::remove(hook_dir + "/collectives", ec);
  }
  if (ec || !out || (collectives && !std::filesystem::exists(hook_dir + "/collectives", ec))) {
    throw ddp::ConfigError("cannot write ddprun's Python hook into " + hook_dir +
                           "; check --log-dir or TMPDIR (or set DDP_PYTHON_HOOK=off without "
                           "--collectives ddprun)");
  }
  return hook_dir;
}

PythonHook::PythonHook(bool collectives) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/ddprun-hook-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) {
    throw ddp::ConfigError("cannot create a folder for ddprun's Python hook ('" + pattern +
                           "'); set TMPDIR to a writable directory, or DDP_PYTHON_HOOK=off");
  }
  root_ = pattern;
  path_ = install_python_hook(root_, collectives);
}

PythonHook::~PythonHook() {
  std::error_code ec;
  std::filesystem::remove_all(root_, ec);
}

std::vector<std::string> ddprun_torch_dirs(const std::string& ddprun_path) {
  std::vector<std::string> dirs;
  std::error_code ec;
  const auto bin = std::filesystem::weakly_canonical(ddprun_path, ec).parent_path();
  for (const char* relative : {"../lib/python", "../lib/python3/dist-packages"}) {
    const auto dir = (bin / relative).lexically_normal();
    if (std::filesystem::exists(dir / "ddprun_torch" / "__init__.py", ec)) {
      dirs.push_back(dir.string());
    }
  }
  return dirs;
}

std::string python_path(const std::vector<std::string>& first, const std::string* existing,
                        const std::vector<std::string>& last) {
  std::string joined;
  auto add = [&joined](const std::string& dir) { joined += (joined.empty() ? "" : ":") + dir; };
  for (const auto& dir : first) add(dir);
  if (existing != nullptr && !existing->empty()) add(*existing);
  for (const auto& dir : last) add(dir);
  return joined;
}

}  // namespace ddprun
