"""ctypes binding of libddp_capi (lib/include/ddp/capi.h), torch-free.

The library and the libraries it needs are in _lib next to this file (lib/python/bundle-libs);
DDPRUN_TORCH_LIB names another libddp_capi.so.0. Every call that can fail takes an error buffer
and raises DdprunError with the library's one line when it does.
"""

import ctypes
import os

CAPI_VERSION = 1
_ERR_LEN = 1024

DTYPE_FLOAT32, DTYPE_FLOAT64, DTYPE_BFLOAT16, DTYPE_FLOAT16, DTYPE_INT32, DTYPE_INT64 = range(6)
OP_SUM, OP_AVG, OP_MIN, OP_MAX = range(4)
(STORE_SET, STORE_GET, STORE_ADD, STORE_COMPARE_SET, STORE_CHECK, STORE_WAIT, STORE_DELETE,
 STORE_APPEND, STORE_MULTI_GET, STORE_MULTI_SET, STORE_NUM_KEYS) = range(11)


class DdprunError(RuntimeError):
    """A collective or connection failed; the message is the library's (op, rank, peer)."""


STORE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                            ctypes.c_size_t, ctypes.c_int64, ctypes.c_void_p)


def _library_path():
    explicit = os.environ.get("DDPRUN_TORCH_LIB")
    if explicit:
        return explicit
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib", "libddp_capi.so.0")


def _declare(lib):
    p, sz, i, i64, err = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int64, ctypes.c_char_p
    signatures = {
        "ddp_capi_version": (i, []),
        "ddp_store_reply": (None, [p, ctypes.c_char_p, sz]),
        "ddp_comm_create": (p, [ctypes.c_char_p, STORE_FN, p, ctypes.c_char_p, i, i, i64, err, sz]),
        "ddp_comm_destroy": (None, [p]),
        "ddp_comm_backend": (ctypes.c_char_p, [p]),
        "ddp_comm_hierarchical": (i, [p]),
        "ddp_allreduce": (p, [p, p, sz, i, i, err, sz]),
        "ddp_broadcast": (p, [p, p, sz, i, i, err, sz]),
        "ddp_allgather": (p, [p, p, p, sz, i, err, sz]),
        "ddp_reduce_scatter": (p, [p, p, p, sz, i, i, err, sz]),
        "ddp_barrier": (p, [p, err, sz]),
        "ddp_work_wait": (i, [p, err, sz]),
        "ddp_work_completed": (i, [p]),
        "ddp_work_free": (None, [p]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load():
    path = _library_path()
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as e:
        raise DdprunError(f"ddprun_torch cannot load {path} ({e}); reinstall the package, or set "
                          f"DDPRUN_TORCH_LIB to libddp_capi.so.0") from None
    version = lib.ddp_capi_version()
    if version != CAPI_VERSION:
        raise DdprunError(f"{path} speaks C ABI version {version}, this ddprun_torch speaks "
                          f"{CAPI_VERSION}; install the module and the library from one build")
    return _declare(lib)


LIB = load()


def error_buffer():
    return ctypes.create_string_buffer(_ERR_LEN)


def raise_from(buffer, context=""):
    message = buffer.value.decode(errors="replace") or "unknown error"
    raise DdprunError(f"{context}{message}")


def reply(handle, value):
    LIB.ddp_store_reply(handle, value, len(value))
