"""torch's c10d Store, handed to libddp_capi as its rendezvous store (ddp_store_fn).

The communicator connects through exactly the store torch gave the backend (the PrefixStore of
the group, over the TCPStore of MASTER_ADDR or the launcher's agent store), so groups made by
new_group get keys of their own as they do with gloo.
"""

import ctypes
from datetime import timedelta

from . import _capi


def _as_str(key):
    return key.decode()


def _set(store, args, _):
    store.set(_as_str(args[0]), args[1])
    return []


def _get(store, args, _):
    return [bytes(store.get(_as_str(args[0])))]


def _add(store, args, delta):
    return [str(store.add(_as_str(args[0]), delta)).encode()]


def _compare_set(store, args, _):
    return [bytes(store.compare_set(_as_str(args[0]), args[1], args[2]))]


def _check(store, args, _):
    return [b"1" if store.check([_as_str(k) for k in args]) else b"0"]


def _wait(store, args, timeout_ms):
    store.wait([_as_str(k) for k in args], timedelta(milliseconds=timeout_ms))
    return []


def _delete(store, args, _):
    return [b"1" if store.delete_key(_as_str(args[0])) else b"0"]


def _append(store, args, _):
    store.append(_as_str(args[0]), args[1])
    return []


def _multi_get(store, args, _):
    return [bytes(v) for v in store.multi_get([_as_str(k) for k in args])]


def _multi_set(store, args, _):
    store.multi_set([_as_str(k) for k in args[0::2]], list(args[1::2]))
    return []


def _num_keys(store, _args, _):
    return [str(store.num_keys()).encode()]


_HANDLERS = {
    _capi.STORE_SET: _set, _capi.STORE_GET: _get, _capi.STORE_ADD: _add,
    _capi.STORE_COMPARE_SET: _compare_set, _capi.STORE_CHECK: _check, _capi.STORE_WAIT: _wait,
    _capi.STORE_DELETE: _delete, _capi.STORE_APPEND: _append,
    _capi.STORE_MULTI_GET: _multi_get, _capi.STORE_MULTI_SET: _multi_set,
    _capi.STORE_NUM_KEYS: _num_keys,
}


def callback(store):
    """A ddp_store_fn over `store`; keep the returned object alive as long as the communicator."""

    def call(_ctx, op, args, lens, nargs, number, reply):
        try:
            values = [ctypes.string_at(args[i], lens[i]) for i in range(nargs)]
            for value in _HANDLERS[op](store, values, number):
                _capi.reply(reply, value)
            return 0
        except BaseException as e:  # noqa: B902 -- nothing may unwind into C
            _capi.reply(reply, f"{type(e).__name__}: {e}".encode(errors="replace"))
            return 1

    return _capi.STORE_FN(call)


def host_of(store):
    """The host that serves `store`: the TCPStore under any PrefixStores, else MASTER_ADDR."""
    import os

    seen = store
    for _ in range(16):
        host = getattr(seen, "host", None)
        if isinstance(host, str) and host:
            return host
        seen = getattr(seen, "underlying_store", None)
        if seen is None:
            break
    return os.environ.get("MASTER_ADDR", "127.0.0.1")
