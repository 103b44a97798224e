"""``Runtime``: a Python handle on one rank's core runtime, and the framework-agnostic operations.

Adapters (horo_torch, horo_tf) describe a tensor as ``TensorSpec(name, input_ptr, output_ptr,
dtype_code, shape)`` and nothing else; this module turns specs into ``horo_enqueue`` calls and
reads results back. All blocking calls release the GIL (cffi does so around every C call).
"""
import contextlib
import dataclasses
import os
import threading
from typing import List, Optional, Sequence, Tuple

from horo_core._binding import check, ffi, lib


@dataclasses.dataclass
class TensorSpec:
    """One tensor handed to the core: raw pointers (ints), a dtype code and a shape."""
    name: str
    input_ptr: int
    output_ptr: int  # 0: the core allocates the output (allgather, alltoall, reducescatter)
    dtype: int
    shape: Tuple[int, ...]


@dataclasses.dataclass
class Result:
    """What a completed handle produced."""
    data_ptr: int          # core-owned result bytes (0 when the caller gave the output)
    nbytes: int
    shape: Tuple[int, ...]
    received_splits: Optional[List[int]]
    value: int             # join: last rank to join


class LoopbackHub:
    """In-process transport shared by the runtimes of one process (tests, single-rank jobs)."""

    def __init__(self, size):
        out = ffi.new("horo_loopback_hub_t**")
        check(lib.horo_loopback_hub_create(size, out))
        self._hub = out[0]
        self.size = size

    @property
    def pointer(self):
        return self._hub

    def close(self):
        if self._hub is not None:
            lib.horo_loopback_hub_destroy(self._hub)
            self._hub = None


class Runtime:
    """One rank of a job.

    Args:
        rank, size, local_rank, local_size, cross_rank, cross_size: this rank's place in the job.
        secret: the job's key; every TCP connection proves knowledge of it.
        bind_host: the interface the data plane listens on.
        loopback: a LoopbackHub, to run the ranks as threads of this process instead of over TCP.
    """

    def __init__(self, rank, size, local_rank=0, local_size=1, cross_rank=0, cross_size=1,
                 secret=b"", bind_host="127.0.0.1", loopback=None):
        opts = ffi.new("horo_init_options_t*")
        opts.rank, opts.size = rank, size
        opts.local_rank, opts.local_size = local_rank, local_size
        opts.cross_rank, opts.cross_size = cross_rank, cross_size
        host = ffi.new("char[]", bind_host.encode())
        key = ffi.new("uint8_t[]", bytes(secret)) if secret else ffi.NULL
        opts.bind_host = host
        opts.secret = key
        opts.secret_len = len(secret)
        opts.loopback = loopback.pointer if loopback is not None else ffi.NULL
        out = ffi.new("horo_runtime_t**")
        check(lib.horo_runtime_create(opts, out))
        self._rt = out[0]
        self._loopback = loopback  # keeps the hub alive as long as the runtime
        self.rank, self.size = rank, size
        # Calls in progress, so that destroy() never frees the runtime under another thread.
        self._calls = 0
        self._calls_done = threading.Condition()

    @contextlib.contextmanager
    def _use(self):
        """The C runtime pointer for one call; refused (HoroShutdownError) once destroy() began."""
        with self._calls_done:
            rt = self._rt
            if rt is None:
                check(lib.HORO_ERR_SHUT_DOWN)
            self._calls += 1
        try:
            yield rt
        finally:
            with self._calls_done:
                self._calls -= 1
                self._calls_done.notify_all()

    def address(self):
        buf = ffi.new("char[]", 256)
        with self._use() as rt:
            check(lib.horo_runtime_address(rt, buf, 256))
        return ffi.string(buf).decode()

    def connect(self, addresses: Sequence[str] = ()):
        """Connects to every peer and starts the background thread."""
        keep = [ffi.new("char[]", a.encode()) for a in addresses]
        arr = ffi.new("char*[]", keep) if keep else ffi.NULL
        with self._use() as rt:
            check(lib.horo_runtime_connect(rt, arr, len(keep)))

    def shutdown(self):
        with self._use() as rt:
            check(lib.horo_runtime_shutdown(rt))

    def destroy(self):
        """Shuts down (failing outstanding handles), waits for other threads' calls to return, frees."""
        with self._calls_done:
            rt, self._rt = self._rt, None
        if rt is None:
            return
        lib.horo_runtime_shutdown(rt)
        with self._calls_done:
            self._calls_done.wait_for(lambda: self._calls == 0)
        lib.horo_runtime_destroy(rt)

    # Operations ---------------------------------------------------------------------------------

    def enqueue(self, op_type, specs: Sequence[TensorSpec], process_set_id=0, reduce_op=None,
                prescale_factor=1.0, postscale_factor=1.0, root_rank=0, splits=None) -> List[int]:
        """Enqueues one operation over specs (several specs form an atomic group); returns handles."""
        opts = ffi.new("horo_op_options_t*")
        lib.horo_op_options_init(opts)
        opts.process_set_id = process_set_id
        opts.reduce_op = lib.HORO_OP_SUM if reduce_op is None else reduce_op
        opts.prescale_factor = float(prescale_factor)
        opts.postscale_factor = float(postscale_factor)
        opts.root_rank = root_rank
        keep = []
        if splits is not None:
            split_arr = ffi.new("int64_t[]", [int(s) for s in splits])
            keep.append(split_arr)
            opts.splits = split_arr
            opts.num_splits = len(splits)
        count = max(1, len(specs))
        tensors = ffi.new("horo_tensor_t[]", count)
        for i, spec in enumerate(specs):
            name = ffi.new("char[]", spec.name.encode())
            shape = ffi.new("int64_t[]", list(spec.shape) or [0])
            keep += [name, shape]
            t = tensors[i]
            t.name = name
            t.input = ffi.cast("void*", spec.input_ptr)
            t.output = ffi.cast("void*", spec.output_ptr)
            t.dtype = spec.dtype
            t.ndim = len(spec.shape)
            t.shape = shape
        handles = ffi.new("horo_handle_t[]", count)
        with self._use() as rt:
            check(lib.horo_enqueue(rt, op_type, tensors, len(specs), opts, handles))
        return list(handles)

    def poll(self, handle) -> bool:
        done = ffi.new("int32_t*")
        with self._use() as rt:
            check(lib.horo_poll(rt, handle, done))
        return bool(done[0])

    def wait(self, handle, timeout=None):
        """Blocks until the handle completes; raises the operation's error, if any."""
        with self._use() as rt:
            check(lib.horo_wait(rt, handle, -1.0 if timeout is None else float(timeout)))

    def result(self, handle) -> Result:
        r = ffi.new("horo_result_t*")
        with self._use() as rt:
            check(lib.horo_handle_result(rt, handle, r))
        splits = None
        if r.num_received_splits > 0:
            splits = [r.received_splits[i] for i in range(r.num_received_splits)]
        data = int(ffi.cast("uintptr_t", r.data)) if r.data != ffi.NULL else 0
        return Result(data, r.nbytes, tuple(r.shape[i] for i in range(r.ndim)), splits, r.join_last_rank)

    def release(self, handle):
        with self._use() as rt:
            check(lib.horo_release(rt, handle))

    def copy_result(self, result: Result, dest_ptr: int):
        """Copies a core-owned result into caller memory of at least result.nbytes bytes."""
        if result.nbytes:
            ffi.memmove(ffi.cast("void*", dest_ptr), ffi.cast("void*", result.data_ptr), result.nbytes)

    # Timeline -----------------------------------------------------------------------------------

    def start_timeline(self, file_path, mark_cycles=False):
        """Starts recording the timeline; rank 0 writes it to file_path (see basics.start_timeline)."""
        path = ffi.new("char[]", os.fsencode(file_path))
        with self._use() as rt:
            check(lib.horo_timeline_start(rt, path, 1 if mark_cycles else 0))

    def stop_timeline(self):
        """Stops recording; on rank 0, returns once the file is complete."""
        with self._use() as rt:
            check(lib.horo_timeline_stop(rt))

    # Process sets -------------------------------------------------------------------------------

    def add_process_set(self, ranks) -> int:
        arr = ffi.new("int32_t[]", [int(r) for r in ranks] or [0])
        out = ffi.new("int32_t*")
        with self._use() as rt:
            check(lib.horo_process_set_add(rt, arr, len(ranks), out))
        return out[0]

    def remove_process_set(self, set_id):
        with self._use() as rt:
            check(lib.horo_process_set_remove(rt, set_id))

    def process_set_ranks(self, set_id) -> List[int]:
        cap = self.size
        arr = ffi.new("int32_t[]", cap)
        count = ffi.new("int32_t*")
        with self._use() as rt:
            check(lib.horo_process_set_ranks(rt, set_id, arr, cap, count))
        return [arr[i] for i in range(count[0])]
