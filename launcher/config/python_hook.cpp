#include "config/python_hook.h"

#include <filesystem>
#include <fstream>

#include "ddp/error.h"

namespace ddprun {

namespace {

// The sitecustomize.py the agent writes (python_hook.h): data, kept here so that ddprun stays one
// self-contained binary.
constexpr const char kHookSource[] =
    R"PY(# Written by ddprun for --collectives ddprun (launcher/config/python_hook.h): a script's gloo CPU
# collectives run on the library's "ddprun" backend. Chains to the next sitecustomize on sys.path.
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_TARGET = "torch.distributed.distributed_c10d"


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


def _patch(module):
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


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


_chain()
if _TARGET in sys.modules:
    _patch(sys.modules[_TARGET])
else:
    sys.meta_path.insert(0, _Finder())
)PY";

}  // namespace

const char* python_hook_source() { return kHookSource; }

std::string install_python_hook(const std::string& dir) {
  const std::string hook_dir = dir + "/python-hook";
  std::error_code ec;
  std::filesystem::create_directories(hook_dir, ec);
  std::ofstream out(hook_dir + "/sitecustomize.py", std::ios::trunc);
  out << python_hook_source();
  out.close();
  if (ec || !out) {
    throw ddp::ConfigError("--collectives ddprun: cannot write " + hook_dir +
                           "/sitecustomize.py; check --log-dir or TMPDIR");
  }
  return hook_dir;
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
