"""ProcessGroupDdprun: a torch.distributed ProcessGroup written in Python over libddp_capi.

Each collective hands raw pointers to the library, which runs it on the communicator's own thread
in issue order. Its torch Future is completed (results copied back where the caller's tensor was
not contiguous) by whoever needs it first:
- the thread that waits on its Work: a synchronous collective (dist.all_reduce without async_op)
  completes in its caller's thread, with no other Python thread woken;
- the group's completer thread, once somebody asks for the Future (Work.get_future: DDP's bucket
  hooks, chained collectives), which it completes as soon as the library is done, in issue order.
Ops that nobody asked about yet are "unclaimed": a wait on a later op, is_completed, shutdown, or
more than _UNCLAIMED_MAX of them complete the older ones first, in issue order. Nothing here holds
the GIL while a collective runs.
"""

import atexit
import collections
import os
import queue
import sys
import threading
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _capi, _store

_DTYPES = {
    torch.float32: _capi.DTYPE_FLOAT32, torch.float64: _capi.DTYPE_FLOAT64,
    torch.bfloat16: _capi.DTYPE_BFLOAT16, torch.float16: _capi.DTYPE_FLOAT16,
    torch.int32: _capi.DTYPE_INT32, torch.int64: _capi.DTYPE_INT64,
}
_PRODUCT = "product"
_OP_CODES = {
    int(dist.ReduceOp.SUM): _capi.OP_SUM, int(dist.ReduceOp.AVG): _capi.OP_AVG,
    int(dist.ReduceOp.MIN): _capi.OP_MIN, int(dist.ReduceOp.MAX): _capi.OP_MAX,
    int(dist.ReduceOp.PRODUCT): _PRODUCT,
}
# Unclaimed ops (issued, not waited on, no Future asked for) beyond this go to the completer.
_UNCLAIMED_MAX = 64


def _unsupported(name, instead):
    raise RuntimeError(f"the ddprun backend has no {name}; {instead}")


class _Op:
    """One collective in flight, completed once: by the first thread that waits on it, or by the
    completer once it was claimed for it, whichever comes first. The library reads and writes
    `buffers` until then: the op holds them alive. Its torch Future is made only when asked for
    (DDP's hooks, chained collectives): a synchronous collective needs none."""

    __slots__ = ("handle", "finish", "buffers", "result", "error", "future", "lock", "done",
                 "waited", "unclaimed")

    def __init__(self, finish, buffers):
        self.handle = None  # set once the library started it
        self.finish, self.buffers = finish, buffers
        self.result = self.error = self.future = None
        self.lock = threading.RLock()  # a future's callbacks may wait on their own op
        self.done = False
        self.waited = False  # a thread waits on it: that thread completes it
        self.unclaimed = True  # in its group's _unclaimed, in issue order

    def __del__(self):
        lib = getattr(_capi, "LIB", None)  # None while the interpreter finalizes
        if lib is not None and self.handle:  # freed last: both threads may wait on it
            lib.ddp_work_free(self.handle)

    def wait_in_library(self):
        """Blocks until the library finished the op; completes nothing, holds no lock."""
        _capi.LIB.ddp_work_wait(self.handle, None, 0)

    def finished_in_library(self):
        return bool(_capi.LIB.ddp_work_completed(self.handle))

    def complete(self):
        with self.lock:
            if self.done:
                return
            rc = _capi.LIB.ddp_work_wait(self.handle, None, 0)
            try:
                if rc != 0:  # a second wait on a failed op reports its error again
                    err = _capi.error_buffer()
                    _capi.LIB.ddp_work_wait(self.handle, err, len(err))
                    _capi.raise_from(err)
                self.result = self.finish()
            except BaseException as e:  # noqa: BLE001 -- the waiter gets it
                self.error = e
            finally:
                self.buffers = self.finish = None
            self.done = True
            if self.future is not None:
                self._settle()

    def get_future(self):
        with self.lock:
            if self.future is None:
                self.future = torch.futures.Future()
                if self.done:
                    self._settle()
            return self.future

    def _settle(self):
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.result)


class _Work(dist._Work):
    """The Work torch gets for a collective: wait() completes it (or waits for the completer that
    does) and raises its error. torch's own future-wrapping Work (FutureWrappingWork) is not
    used: its wait() returns True when the future failed, so a synchronous collective would carry
    on with wrong data. Before torch keeps a Python Work alive itself (PyWorkHolder), a Work
    handed to C++ callers (DDP's reducer) lives only as long as Python holds it, so the group
    keeps its recent ones (ProcessGroupDdprun._keep). `future` is given for a Work built from
    others (chained, coalesced); a single collective's is its op's."""

    def __init__(self, ops, group, future=None):
        super().__init__()
        self._ops = ops
        self._group = group
        self._future = future

    def wait(self, timeout=None):  # noqa: ARG002 -- the op has its own timeout
        for op in self._ops:
            op.waited = True
            self._group._complete_through(op)
            op.complete()  # when the completer had it: whoever is first
        if self._future is not None:
            self._future.wait()  # raises the collective's error
        else:
            for op in self._ops:
                if op.error is not None:
                    raise op.error
        return True

    def get_future(self):
        for op in self._ops:
            self._group._claim_through(op)
        return self._future if self._future is not None else self._ops[0].get_future()

    def is_completed(self):
        for op in self._ops:
            if not op.done and op.finished_in_library():
                self._group._complete_through(op)
                op.complete()
        if self._future is not None:
            return self._future.done()
        return all(op.done for op in self._ops)

    def _error(self):
        if self._future is None:
            return next((op.error for op in self._ops if op.error is not None), None)
        try:
            self._future.value()
            return None
        except Exception as e:  # noqa: BLE001
            return e

    def is_success(self):
        return self.is_completed() and self._error() is None

    def exception(self):
        return self._error() if self.is_completed() else None

    def source_rank(self):
        return -1


_THREAD = threading.local()


def _error_buffer():
    """This thread's buffer for a failed start (read at once by raise_from)."""
    try:
        return _THREAD.err
    except AttributeError:
        _THREAD.err = _capi.error_buffer()
        return _THREAD.err


def _op_timeout(timeout):
    env = os.environ.get("DDP_TIMEOUT_SEC")
    if env:
        try:
            return int(float(env) * 1000)
        except ValueError:
            raise ValueError(f"DDP_TIMEOUT_SEC={env!r} is not a number of seconds") from None
    if isinstance(timeout, timedelta):
        return int(timeout.total_seconds() * 1000)
    return 30 * 60 * 1000


def _dtype_code(tensor, op_name):
    if tensor.device.type != "cpu":
        raise RuntimeError(f"ddprun {op_name}: a {tensor.device} tensor; the ddprun backend takes "
                           f"CPU tensors (use 'cpu:ddprun,cuda:nccl' for both)")
    code = _DTYPES.get(tensor.dtype)
    if code is None:
        raise RuntimeError(f"ddprun {op_name}: dtype {tensor.dtype} is not supported; use "
                           f"float32, float64, bfloat16, float16, int32 or int64")
    return code


def _reduce_code(op, op_name):
    # opts.reduceOp is a ReduceOp object that compares equal to its RedOpType, but hashes apart:
    # looked up by the RedOpType's value.
    kind = getattr(op, "op", op)
    try:
        return _OP_CODES[int(kind)]
    except (KeyError, TypeError, ValueError):
        raise RuntimeError(f"ddprun {op_name}: reduce op {kind} is not supported; use SUM, AVG, "
                           f"MIN, MAX or PRODUCT") from None


def _single(tensors, op_name):
    if len(tensors) != 1:
        raise RuntimeError(f"ddprun {op_name}: one tensor per process, got {len(tensors)}")
    return tensors[0]


class ProcessGroupDdprun(dist.ProcessGroup):
    """The "ddprun" backend: init_process_group("ddprun") or "cpu:ddprun"."""

    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._store_fn = _store.callback(store)  # referenced by the library: keep it
        self._store = store
        err = _capi.error_buffer()
        backend = os.environ.get("DDP_BACKEND", "").encode()
        handle = _capi.LIB.ddp_comm_create(backend, self._store_fn, None,
                                            _store.host_of(store).encode(), rank, size,
                                            _op_timeout(timeout), err, len(err))
        if not handle:
            _capi.raise_from(err, f"ddprun backend on rank {rank}: ")
        self._comm = handle
        self._pending = queue.SimpleQueue()  # claimed ops, for the completer
        self._unclaimed = collections.deque()  # ops nobody asked about yet, in issue order
        self._order_lock = threading.Lock()
        # The last Works handed out: C++ callers (DDP's reducer, module-state broadcasts) wait on
        # theirs within an iteration, long before 4096 more collectives were issued.
        self._recent = collections.deque(maxlen=4096)
        self._completer = threading.Thread(target=self._complete, name="ddprun-completer",
                                           daemon=True)
        self._completer.start()
        _LIVE.add(self)

    # --- what torch asks of every group ---------------------------------------------------------
    def getBackendName(self):  # noqa: N802 -- torch's name
        return "ddprun"

    def name(self):
        return "ddprun"

    def size(self):
        return self._size

    def rank(self):
        return self._rank

    def transport(self):
        """"gloo" or "fabric", and whether allreduce runs in two levels (topology)."""
        return (_capi.LIB.ddp_comm_backend(self._comm).decode(),
                bool(_capi.LIB.ddp_comm_hierarchical(self._comm)))

    def shutdown(self):
        if self._comm:
            for op in self._take_through(None):  # everything issued ends before the group
                self._pending.put(op)
            self._stop_completer(None)
            _capi.LIB.ddp_comm_destroy(self._comm)
            self._comm = None
            _LIVE.discard(self)

    def abort(self):
        self.shutdown()

    # --- the engine -----------------------------------------------------------------------------
    def _stop_completer(self, timeout):
        """Ends the completer after what is queued, waiting at most `timeout` s for it."""
        if self._completer.is_alive():
            self._pending.put(None)
            self._completer.join(timeout)

    def _complete(self):
        while True:
            op = self._pending.get()
            if op is None or sys.is_finalizing():
                return
            # Without the op's lock, so that a thread that waits on it meanwhile completes it
            # itself as soon as the library is done, rather than after this thread wakes.
            op.wait_in_library()
            if sys.is_finalizing():
                return
            if not op.waited:
                op.complete()

    def _launch(self, op_name, start, finish, buffers):
        """start(err) returns a ddp_work handle or None; finish() runs once it succeeded. The
        library reads and writes `buffers` until then (the _Op holds them)."""
        if not self._comm:
            raise RuntimeError(f"ddprun {op_name}: the process group was shut down")
        # Everything Python is built before the library starts the op: on a machine with fewer
        # cores than busy threads, what this thread does after the start delays the start.
        op = _Op(finish, buffers)
        work = self._keep(_Work([op], self))
        err = _error_buffer()
        with self._order_lock:  # the library's order and _unclaimed's are the same
            op.handle = start(err)
            if not op.handle:
                _capi.raise_from(err)
            self._unclaimed.append(op)
            oldest = self._unclaimed[0] if len(self._unclaimed) > _UNCLAIMED_MAX else None
        if oldest is not None:
            self._claim_through(oldest)
        return work

    def _take_through(self, op):
        """Removes the unclaimed ops issued up to `op` (all of them for None) and returns them in
        issue order; none when `op` was claimed or completed already."""
        with self._order_lock:
            if op is not None and not op.unclaimed:
                return []
            taken = []
            while self._unclaimed:
                first = self._unclaimed.popleft()
                first.unclaimed = False
                taken.append(first)
                if first is op:
                    break
            return taken

    def _claim_through(self, op):
        """Hands `op`, and the unclaimed ops issued before it, to the completer."""
        for earlier in self._take_through(op):
            self._pending.put(earlier)

    def _complete_through(self, op):
        """Completes the unclaimed ops issued before `op`, and `op`, in this thread."""
        for earlier in self._take_through(op):
            earlier.complete()

    def _keep(self, work):
        self._recent.append(work)
        return work

    def _done(self, value):
        future = torch.futures.Future()
        future.set_result(value)
        return self._keep(_Work([], self, future))

    # --- collectives ----------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._allreduce(_single(tensors, "allreduce"), op, "allreduce", tensors)

    def _allreduce(self, tensor, op, op_name, result):
        dtype = _dtype_code(tensor, op_name)
        code = _reduce_code(op, op_name)
        if code == _PRODUCT:
            return self._product(tensor, op_name, result)
        work = tensor.contiguous()
        n = work.numel()

        def finish():
            if work is not tensor:
                tensor.copy_(work)
            return result

        return self._launch(op_name, lambda err: _capi.LIB.ddp_allreduce(
            self._comm, work.data_ptr(), n, dtype, code, err, len(err)), finish, (work,))

    def _product(self, tensor, op_name, result):
        # No product reduction in the library: every rank gathers all inputs and multiplies them
        # in rank order, so every rank gets the same bits.
        dtype = _dtype_code(tensor, op_name)
        source = tensor.contiguous()
        gathered = torch.empty((self._size,) + tuple(tensor.shape), dtype=tensor.dtype)

        def finish():
            tensor.copy_(torch.prod(gathered, dim=0).to(tensor.dtype))
            return result

        return self._launch(op_name, lambda err: _capi.LIB.ddp_allgather(
            self._comm, source.data_ptr(), gathered.data_ptr(), source.numel(), dtype, err,
            len(err)), finish, (source, gathered))

    def allreduce_coalesced(self, tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if not tensors:
            return self._done(tensors)
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise RuntimeError(f"ddprun allreduce_coalesced: tensors of one dtype, got {dtypes}")
        flat = torch.cat([t.reshape(-1) for t in tensors])
        inner = self._allreduce(flat, op, "allreduce_coalesced", flat)
        return self._then(inner, lambda: self._scatter_back(flat, tensors))

    def _scatter_back(self, flat, tensors):
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        return tensors

    def _then(self, work, fn):
        # Runs in the completer thread right after the inner collective's own finish.
        future = torch.futures.Future()

        def chain(inner):
            try:
                inner.value()
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001
                future.set_exception(e)

        work.get_future().add_done_callback(chain)
        return self._keep(_Work(work._ops, self, future))

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        tensor = _single(tensors, "broadcast")
        dtype = _dtype_code(tensor, "broadcast")
        if not 0 <= root < self._size:
            raise RuntimeError(f"ddprun broadcast: root {root} is not a rank of {self._size}")
        work = tensor.contiguous()

        def finish():
            if work is not tensor:
                tensor.copy_(work)
            return tensors

        return self._launch("broadcast", lambda err: _capi.LIB.ddp_broadcast(
            self._comm, work.data_ptr(), work.numel(), dtype, root, err, len(err)), finish,
            (work,))

    def _allgather_flat(self, source, op_name, finish_with):
        dtype = _dtype_code(source, op_name)
        source = source.contiguous()
        gathered = torch.empty(self._size * source.numel(), dtype=source.dtype)
        return self._launch(op_name, lambda err: _capi.LIB.ddp_allgather(
            self._comm, source.data_ptr(), gathered.data_ptr(), source.numel(), dtype, err,
            len(err)), lambda: finish_with(gathered), (source, gathered))

    def allgather(self, output_tensors, input_tensors, opts=None):  # noqa: ARG002
        source = _single(input_tensors, "allgather")
        outputs = _single(output_tensors, "allgather")
        if len(outputs) != self._size:
            raise RuntimeError(f"ddprun allgather: {len(outputs)} output tensors for "
                               f"{self._size} ranks")

        return self._gather_into(source, outputs, output_tensors, "allgather")

    def _gather_into(self, source, outputs, result, op_name):
        """Allgathers `source`, then copies rank r's block into outputs[r] (none: not the root)."""

        def finish(gathered):
            n = source.numel()
            for r, out in enumerate(outputs):
                out.copy_(gathered[r * n:(r + 1) * n].view_as(out))
            return result

        return self._allgather_flat(source, op_name, finish)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002,ARG002 -- torch's names
        if output.numel() != self._size * input.numel():
            raise RuntimeError(f"ddprun all_gather_into_tensor: output has {output.numel()} "
                               f"elements, expected {self._size} x {input.numel()}")
        if output.is_contiguous() and output.dtype == input.dtype:
            dtype = _dtype_code(input, "all_gather_into_tensor")
            source = input.contiguous()
            return self._launch("all_gather_into_tensor", lambda err: _capi.LIB.ddp_allgather(
                self._comm, source.data_ptr(), output.data_ptr(), source.numel(), dtype, err,
                len(err)), lambda: output, (source, output))
        return self._allgather_flat(input, "all_gather_into_tensor",
                                    lambda g: output.copy_(g.view_as(output)))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._all(works, outputs)

    def _all(self, works, result):
        """One Work for several collectives: done when every one is (each may copy its result
        back when it completes, so the last one's completion is not enough)."""
        if not works:
            return self._done(result)
        def every_one_done(done):
            for f in done.value():
                f.value()  # raises the first collective's error
            return result

        future = torch.futures.collect_all([w.get_future() for w in works]).then(every_one_done)
        return self._keep(_Work([op for w in works for op in w._ops], self, future))

    def _reduce_scatter_flat(self, flat, output, op, op_name):
        dtype = _dtype_code(flat, op_name)
        code = _reduce_code(op, op_name)
        if code == _PRODUCT:
            _unsupported(f"{op_name} with PRODUCT", "use SUM, AVG, MIN or MAX")
        out = output if output.is_contiguous() else torch.empty_like(output,
                                                                     memory_format=torch.contiguous_format)

        def finish():
            if out is not output:
                output.copy_(out)
            return output

        return self._launch(op_name, lambda err: _capi.LIB.ddp_reduce_scatter(
            self._comm, flat.data_ptr(), out.data_ptr(), out.numel(), dtype, code, err, len(err)),
            finish, (flat, out))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        output = _single(output_tensors, "reduce_scatter")
        inputs = _single(input_tensors, "reduce_scatter")
        if len(inputs) != self._size:
            raise RuntimeError(f"ddprun reduce_scatter: {len(inputs)} input tensors for "
                               f"{self._size} ranks")
        flat = torch.cat([t.reshape(-1) for t in inputs])
        work = self._reduce_scatter_flat(flat, output, op, "reduce_scatter")
        return self._then(work, lambda: output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        if input.numel() != self._size * output.numel():
            raise RuntimeError(f"ddprun reduce_scatter_tensor: input has {input.numel()} "
                               f"elements, expected {self._size} x {output.numel()}")
        return self._reduce_scatter_flat(input.contiguous().reshape(-1), output, op,
                                         "reduce_scatter_tensor")

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        works = [self._reduce_scatter_base(o, i, opts) for o, i in zip(outputs, inputs)]
        return self._all(works, outputs)

    def barrier(self, opts=None):  # noqa: ARG002
        return self._launch("barrier", lambda err: _capi.LIB.ddp_barrier(self._comm, err,
                                                                          len(err)),
                            lambda: None, ())

    # --- built from the collectives above: correct, not bandwidth-optimal -----------------------
    def reduce(self, tensors, opts=None):
        tensor = _single(tensors, "reduce")
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        root = opts.rootRank if opts is not None else 0
        scratch = tensor.clone()
        inner = self._allreduce(scratch, op, "reduce", scratch)
        return self._then(inner, lambda: tensor.copy_(scratch) if self._rank == root else tensor)

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        source = _single(input_tensors, "gather")
        outputs = output_tensors[0] if self._rank == root else []

        return self._gather_into(source, outputs, output_tensors, "gather")

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        output = _single(output_tensors, "scatter")
        n = output.numel()
        flat = torch.empty(self._size * n, dtype=output.dtype)
        if self._rank == root:
            flat.copy_(torch.cat([t.reshape(-1) for t in input_tensors[0]]))
        inner = self.broadcast([flat], _root_opts(root))
        return self._then(inner, lambda: output.copy_(
            flat[self._rank * n:(self._rank + 1) * n].view_as(output)))

    def send(self, tensors, dst, tag=0):  # noqa: ARG002
        _unsupported("send", "point-to-point needs the gloo backend ('cpu:gloo')")

    def recv(self, tensors, src, tag=0):  # noqa: ARG002
        _unsupported("recv", "point-to-point needs the gloo backend ('cpu:gloo')")

    def recv_anysource(self, tensors, tag=0):  # noqa: ARG002
        _unsupported("recv", "point-to-point needs the gloo backend ('cpu:gloo')")

    def alltoall(self, output_tensors, input_tensors, opts=None):  # noqa: ARG002
        _unsupported("all_to_all", "use the gloo backend ('cpu:gloo') for it")

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):  # noqa: ARG002
        _unsupported("all_to_all_single", "use the gloo backend ('cpu:gloo') for it")


# Groups whose completer may still run. At exit, each completer is ended before the interpreter
# finalizes: a daemon thread that completes a torch Future while Python finalizes is ended by
# pthread_exit inside torch's C++ frames, and the process aborts ("terminate called without an
# active exception"). A completer still waiting on a collective after 2 s is left to the C wait,
# which holds no torch frame.
_LIVE = weakref.WeakSet()


@atexit.register
def _stop_completers():
    for group in list(_LIVE):
        group._stop_completer(2.0)


def _root_opts(root):
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    return opts


def create(store, rank, size, timeout):
    """Backend.register_backend's creator: (store, rank, world_size, timeout)."""
    return ProcessGroupDdprun(store, rank, size, timeout)
