"""``Runtime``: a Python handle on one rank's core runtime, and the framework-agnostic operations.

Adapters (horo_torch, horo_tf) describe a tensor as ``TensorSpec(name, input_ptr, output_ptr,
dtype_code, shape)`` and nothing else; this module turns specs into ``horo_enqueue`` calls and
reads results back. All blocking calls release the GIL (cffi does so around every C call).
"""
import dataclasses
import functools
import operator
import os
import threading
import time
from typing import List, Optional, Sequence, Tuple

from horo_core._binding import check, ffi, last_error, lib
from horo_core.errors import HoroInvalidArgument

# The message of a call made after the runtime was destroyed (no call into the core was made, so
# horo_last_error() has nothing to say about it).
_SHUT_DOWN = "Horo has been shut down: the runtime was destroyed"


@dataclasses.dataclass
class TensorSpec:
    """One tensor handed to the core: raw pointers (ints), a dtype code and a shape."""
    name: str
    input_ptr: int
    output_ptr: int  # 0: the core allocates the output (allgather, alltoall, reducescatter)
    dtype: int
    shape: Tuple[int, ...]
    device: int = 0  # lib.HORO_DEVICE_HOST, or lib.HORO_DEVICE_CUDA_BASE + CUDA ordinal
    # allgather, alltoall, reducescatter with an output_ptr: the bytes there, a guess of the result's
    # size; the core writes the result there only when it is exactly that large (horo.h)
    output_bytes: int = 0


@dataclasses.dataclass
class Result:
    """What a completed handle produced."""
    data_ptr: int          # core-owned result bytes (0 when the caller gave the output)
    nbytes: int
    shape: Tuple[int, ...]
    received_splits: Optional[List[int]]
    value: int             # join: last rank to join


def _result_of(r) -> Result:
    """A Result from a filled horo_result_t."""
    splits = None
    if r.num_received_splits > 0:
        splits = [r.received_splits[i] for i in range(r.num_received_splits)]
    data = int(ffi.cast("uintptr_t", r.data)) if r.data != ffi.NULL else 0
    return Result(data, r.nbytes, tuple(r.shape[i] for i in range(r.ndim)), splits, r.join_last_rank)


# Per thread: the result and handle that run_result_prepared fills (a synchronous call needs them
# only until it returns, so one pair per thread serves every call).
_result_slots = threading.local()

_CACHE_LIMIT = 4096  # per cache: unnamed operations get fresh names, so the caches must not grow forever


def cache_lookup(cache, key):
    """(key, the value cache holds under it or None), or (None, None) when key cannot be a key.

    The option caches' keys hold the caller's option values. One given as a value that cannot be
    a key (a NumPy array, a list, a tf.Tensor) makes the lookup raise TypeError; such a call is
    then described anew each time, uncached (key None, which cache_store skips), and its options
    are checked there like any other's: refused on every rank when invalid. Raised instead, the
    TypeError would fail this rank alone while the others waited for it."""
    try:
        return key, cache.get(key)
    except TypeError:
        return None, None


def cache_store(cache, key, value, limit=None):
    """value, kept in cache under key (emptied first when it holds limit entries, _CACHE_LIMIT by
    default) unless key is None (cache_lookup)."""
    if key is not None:
        if len(cache) >= (_CACHE_LIMIT if limit is None else limit):
            cache.clear()
        cache[key] = value
    return value


class PreparedRun:
    """The C description of one synchronous host operation (Runtime.run_prepared): a tensor's name,
    dtype and shape and the operation's options, made once and reused every step. Not tied to a
    runtime."""

    __slots__ = ("op_type", "tensor", "options", "_keep")

    def __init__(self, op_type, tensor, options, keep):
        self.op_type, self.tensor, self.options, self._keep = op_type, tensor, options, keep


def _c_name(name):
    """name as the C string the core keys operations by. A NUL would end it early, so that names
    that differ after it would meet as one."""
    if "\x00" in name:
        raise HoroInvalidArgument(f"operation name {name!r} contains a NUL character")
    return ffi.new("char[]", name.encode())


def split_counts(splits) -> List[int]:
    """An alltoall's splits (numbers of any kind) as ints; a split that is not a whole number is an
    error, not truncated.

    Raises:
        HoroInvalidArgument: a split is not a whole number.
    """
    values = []
    for s in splits:
        try:
            value = int(s)
        except (TypeError, ValueError, OverflowError):  # OverflowError: inf
            value = None
        if value is None or value != s or not -2**63 <= value < 2**63:
            raise HoroInvalidArgument(f"alltoall splits must be whole numbers, got {list(splits)!r}")
        values.append(value)
    return values


def _c_splits(splits):
    """An alltoall's splits as int64s (split_counts' rule)."""
    return ffi.new("int64_t[]", split_counts(splits) or [0])


def _integer(value, what, expected):
    try:
        number = operator.index(value)
    except TypeError:
        raise HoroInvalidArgument(f"{what} must be {expected}, got {value!r}") from None
    if not -2**31 <= number < 2**31:
        raise HoroInvalidArgument(f"{what} must be {expected}, got {value!r}")
    return number


def _number(value, what):
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        raise HoroInvalidArgument(f"{what} must be a number, got {value!r}") from None


def prepare_run(op_type, name, dtype, shape, process_set_id=0, reduce_op=None, prescale_factor=1.0,
                postscale_factor=1.0, root_rank=0, caller_waits=True, splits=None, runtime=None) -> PreparedRun:
    """Describes an operation on one host tensor: for Runtime.run_prepared (synchronous), or with
    caller_waits=False for Runtime.enqueue_prepared (asynchronous). splits: an alltoall's rows per
    rank (None: equal parts).

    Raises:
        HoroInvalidArgument: an option of the wrong type or value (op="sum", fractional splits);
            given the runtime that will run it, on every member of the set (_refuse_invalid).
    """
    c_name = _c_name(name)
    c_shape = ffi.new("int64_t[]", list(shape) or [0])
    t = ffi.new("horo_tensor_t*")
    t.name = c_name
    t.dtype = dtype
    t.ndim = len(shape)
    t.shape = c_shape
    keep = (c_name, c_shape)
    try:
        options = Runtime._options(process_set_id, reduce_op, prescale_factor, postscale_factor, root_rank,
                                   caller_waits)
        if splits is not None:
            c_splits = _c_splits(splits)
            options.splits = c_splits
            options.num_splits = len(splits)
            keep += (c_splits,)
    except HoroInvalidArgument as error:
        _refuse_invalid(runtime, op_type, [name], process_set_id, error)
    return PreparedRun(op_type, t, options, keep)


def _refuse_invalid(runtime, op_type, names, process_set_id, error):
    """Raises error, an invalid option of a call on names, which this rank alone may have passed:
    through runtime.refuse, so that every member of the set fails with it instead of waiting for
    this rank's tensors (raised as it is without a runtime)."""
    if runtime is None:
        raise error
    runtime.refuse(op_type, names, process_set_id, f"passed an invalid argument: {error}")


def bound_run_failed(run, status):
    """After run (Runtime.bind_run) returned status, not HORO_OK: raises the call's error. Returns
    instead when run's runtime has been destroyed (or forsaken in a forked child) since it was
    bound, or when the tensors run was given no longer match its reading (HORO_ERR_TENSOR_CHANGED):
    the caller then takes its general path, which raises what a call without a runtime raises, or
    runs on the runtime that init() has made since, or describes the tensors anew."""
    if status != lib.HORO_ERR_TENSOR_CHANGED and run.runtime._rt is not None:
        check(status, last_error())


class _CallGuard:
    """The C runtime pointer for one call (see Runtime._use), refused once destroy() began; cheaper
    than a generator-based context manager on the per-operation path. Nothing is counted: the C
    handle outlives the runtime, and horo_runtime_close waits for the calls inside the core."""

    __slots__ = ("_owner",)

    def __init__(self, owner):
        self._owner = owner

    def __enter__(self):
        owner = self._owner
        rt = owner._rt
        if rt is None:
            check(lib.HORO_ERR_SHUT_DOWN, owner._gone)
        return rt

    def __exit__(self, *exc):
        return False


@dataclasses.dataclass
class Stats:
    """What one rank's runtime has done since it was created (``horo_runtime_stats_t``).

    Allreduce and allgather counts are collectives run (fused tensors count once), by algorithm;
    the byte counts are data-plane bytes this rank sent to peers on its own host and on other hosts;
    the pass counts are negotiation rounds that moved something, run by callers waiting on a handle
    and by the background thread; the response counts are responses (one per tensor) this rank ran
    after the ranks agreed on a repeated tensor among themselves, and after the coordinator
    negotiated it; allreduce_from_announcements counts the small agreed allreduces whose data
    came with the announcements and was reduced on each rank, with no data-plane step;
    rounds_agreed counts the completed rounds of that agreement, each a message from every rank
    (a loop of one repeated synchronous allreduce needs one per call); caller_polls counts the
    waits in which a driving caller busy-polled before its first yield, caller_yields the times
    such a caller gave up its core (sched_yield); allgather_from_announcements counts the small
    agreed allgathers whose data came with the announcements (not counted in allgather_ring), and
    reducescatter_from_announcements and alltoall_from_announcements the small agreed
    reducescatters and alltoalls likewise; express_runs counts the synchronous allreduces and
    broadcasts of one small repeated tensor that the caller ran alone (no queued entry, no
    handle), and express_handovers those it began so and then handed over to the queue;
    broadcast_from_announcements counts the small agreed broadcasts whose data came with the
    root's announcement.
    """
    allreduce_recursive_doubling: int
    allreduce_ring: int
    allreduce_hierarchical: int
    bytes_sent_same_host: int
    bytes_sent_other_hosts: int
    allgather_ring: int
    allgather_hierarchical: int
    passes_by_callers: int
    passes_by_background: int
    responses_agreed_by_peers: int
    responses_from_coordinator: int
    allreduce_from_announcements: int
    rounds_agreed: int
    caller_polls: int
    caller_yields: int
    allgather_from_announcements: int
    reducescatter_from_announcements: int
    alltoall_from_announcements: int
    express_runs: int
    express_handovers: int
    broadcast_from_announcements: int


class LoopbackHub:
    """In-process transport shared by the runtimes of one process (tests, single-rank jobs).

    Args:
        size: number of ranks.
        hosts: optional host of every rank (any hashable values, equal for ranks that share a
            host) to emulate ranks spread over hosts; by default all ranks share one host.
    """

    def __init__(self, size, hosts=None):
        out = ffi.new("horo_loopback_hub_t**")
        if hosts is None:
            check(lib.horo_loopback_hub_create(size, out))
        else:
            hosts = list(hosts)
            if len(hosts) != size:
                raise ValueError(f"hosts names {len(hosts)} hosts for a hub of {size} ranks")
            ids = {}
            host_ids = ffi.new("int32_t[]", [ids.setdefault(h, len(ids)) for h in hosts] or [0])
            check(lib.horo_loopback_hub_create_on_hosts(size, host_ids, out))
        self._hub = out[0]
        self.size = size

    @property
    def pointer(self):
        return self._hub

    def deliver_control(self, src, dst, payload: bytes):
        """Failure injection for tests: puts payload into rank dst's control inbox as if rank src
        had sent it."""
        check(lib.horo_loopback_hub_deliver_control(self._hub, src, dst, payload, len(payload)))

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
        # destroy() closes the runtime, which keeps the handle itself (every call on it is then
        # refused): bound runs (bind_run) and threads still in a call may hold it. It is freed
        # once the last of them lets go of it.
        self._rt = ffi.gc(out[0], lib.horo_runtime_release)
        self._loopback = loopback  # keeps the hub alive as long as the runtime
        self.rank, self.size = rank, size
        self._gone = _SHUT_DOWN  # why a call finds no C runtime (see forsake_in_forked_child)
        self._destroying = False  # destroy() began: it alone closes the runtime
        self._destroy_lock = threading.Lock()
        self._use_guard = _CallGuard(self)
        self._active = []  # copies out of the core's memory in progress (see copy_result)
        # Steady-state steps repeat the same names, shapes and options: their C copies are kept.
        self._c_names = {}
        self._c_shapes = {}
        self._c_options = {}
        self._prepared = {}

    def _use(self):
        """A context manager giving the C runtime pointer for one call; refused (HoroShutdownError)
        once destroy() began."""
        return self._use_guard

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

    def stats(self) -> Stats:
        """This rank's allreduce algorithm counts and data-plane bytes sent so far."""
        out = ffi.new("horo_runtime_stats_t*")
        with self._use() as rt:
            check(lib.horo_runtime_stats(rt, out))
        return Stats(*(getattr(out, f.name) for f in dataclasses.fields(Stats)))

    def forsake_in_forked_child(self, reason):
        """In a process forked from this rank: every later call raises a HoroShutdownError with
        reason instead of reaching the rank's core, which the child must not drive (the core's
        threads stayed in the rank, and its shared-memory rings are the rank's). Nothing is freed."""
        if self._rt is not None:
            lib.horo_runtime_forsake(self._rt)  # refuses the calls of runs bound before the fork
        self._rt, self._gone = None, reason
        self._destroy_lock = threading.Lock()  # another thread may have held it at the fork
        self._active = []

    def destroy(self, settle=None):
        """Shuts down (failing outstanding handles), waits for other threads' calls to return, frees
        all but the C handle (see __init__). settle: called after the shutdown and before the free.
        Every handle is complete then and can still be read (wait, result, release); the core
        refuses new operations. The runtime is freed even when settle raises, which then propagates."""
        with self._destroy_lock:
            rt = None if self._destroying else self._rt
            self._destroying = True
        if rt is None:
            return
        try:
            lib.horo_runtime_shutdown(rt)
            if settle is not None:
                settle()
        finally:
            self._rt = None  # later calls raise here; calls already past _use are refused by the core
            while self._active:  # shut down, they return promptly
                time.sleep(0.001)
            lib.horo_runtime_close(rt)

    # Operations ---------------------------------------------------------------------------------

    def enable_cuda(self, nccl_path: Optional[str]) -> int:
        """Lets this runtime take CUDA tensors (allreduce, broadcast): loads the CUDA driver and,
        if nccl_path is given, NCCL. Returns the loaded NCCL version, 0 when the core stages CUDA
        tensors through host memory instead. Idempotent.

        Raises:
            HoroUnsupportedError: the CUDA driver or the NCCL library does not load (the message
                names the library and the reason).
        """
        version = ffi.new("int32_t*")
        path = ffi.new("char[]", nccl_path.encode()) if nccl_path else ffi.NULL
        with self._use() as rt:
            check(lib.horo_cuda_enable(rt, path, version))
        return version[0]

    def enqueue(self, op_type, specs: Sequence[TensorSpec], process_set_id=0, reduce_op=None,
                prescale_factor=1.0, postscale_factor=1.0, root_rank=0, splits=None, ready_event=0,
                caller_waits=False) -> List[int]:
        """Enqueues one operation over specs (several specs form an atomic group); returns handles.
        ready_event: for CUDA specs, a CUevent handle (int) the core's device work waits on.
        caller_waits: the caller waits on the handles at once, and that wait runs the negotiation
        (the core's background thread is not woken)."""
        keep = []
        try:
            if splits is None and not ready_event:
                described = (process_set_id, reduce_op, prescale_factor, postscale_factor, root_rank, caller_waits)
                key, opts = cache_lookup(self._c_options, described)
                if opts is None:
                    opts = cache_store(self._c_options, key, self._options(*described))
            else:
                opts = self._options(process_set_id, reduce_op, prescale_factor, postscale_factor, root_rank,
                                     caller_waits)
                opts.ready_event = ffi.cast("void*", ready_event)
            if splits is not None:
                split_arr = _c_splits(splits)
                keep.append(split_arr)
                opts.splits = split_arr
                opts.num_splits = len(splits)
        except HoroInvalidArgument as error:
            _refuse_invalid(self, op_type, [s.name for s in specs], process_set_id, error)
        count = max(1, len(specs))
        tensors = ffi.new("horo_tensor_t[]", count)
        for i, spec in enumerate(specs):
            name = self._c_names.get(spec.name)
            if name is None:
                name = cache_store(self._c_names, spec.name, _c_name(spec.name))
            shape = self._c_shapes.get(spec.shape)
            if shape is None:
                shape = cache_store(self._c_shapes, spec.shape, ffi.new("int64_t[]", list(spec.shape) or [0]))
            keep += [name, shape]
            t = tensors[i]
            t.name = name
            t.input = ffi.cast("void*", spec.input_ptr)
            t.output = ffi.cast("void*", spec.output_ptr)
            t.dtype = spec.dtype
            t.ndim = len(spec.shape)
            t.shape = shape
            t.device = spec.device
            t.output_bytes = spec.output_bytes
        handles = ffi.new("horo_handle_t[]", count)
        with self._use() as rt:
            check(lib.horo_enqueue(rt, op_type, tensors, len(specs), opts, handles))
        return list(handles)

    def refuse(self, op_type, names: Sequence[str], process_set_id, reason):
        """Fails the operation on the named tensors (several names: one grouped call) on every
        member of the process set, because this rank cannot take part, for reason: an argument only
        this rank could check, which would otherwise leave the others waiting. Waits until every
        member has submitted the names, then raises the error they all get, which names this rank."""
        c_names = [_c_name(n) for n in names]
        c_reason = ffi.new("char[]", reason.encode())
        handles = ffi.new("horo_handle_t[]", max(1, len(names)))
        with self._use() as rt:
            check(lib.horo_refuse(rt, op_type, ffi.new("const char*[]", c_names), len(names), process_set_id,
                                  c_reason, handles))
        failure = None
        for handle in handles:
            try:
                self.wait_release(handle)
            except Exception as e:  # the first member's error is everyone's; the others are waited for
                failure = failure or e
        raise failure or HoroInvalidArgument(f"{names[0]}: this rank {reason}")

    @staticmethod
    def _options(process_set_id, reduce_op, prescale_factor, postscale_factor, root_rank, caller_waits):
        """The C options of a call. Raises HoroInvalidArgument naming an argument of the wrong type
        (op="sum", root_rank=0.0), where cffi's own error would name neither."""
        opts = ffi.new("horo_op_options_t*")
        lib.horo_op_options_init(opts)
        opts.process_set_id = process_set_id
        opts.reduce_op = lib.HORO_OP_SUM if reduce_op is None else _integer(
            reduce_op, "op", "one of hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max and hvd.Product")
        opts.prescale_factor = _number(prescale_factor, "prescale_factor")
        opts.postscale_factor = _number(postscale_factor, "postscale_factor")
        opts.root_rank = _integer(root_rank, "root_rank", "an integer rank")
        opts.caller_waits = 1 if caller_waits else 0
        return opts

    def run(self, op_type, name, input_ptr, output_ptr, dtype, shape, process_set_id=0, reduce_op=None,
            prescale_factor=1.0, postscale_factor=1.0, root_rank=0):
        """Runs one operation on a host tensor whose output the caller gave, and waits for it, in one
        call into the core (horo_run; the waiting thread runs the negotiation). The synchronous fast
        path of the framework adapters. Raises the operation's error."""
        described = (op_type, name, dtype, shape, process_set_id, reduce_op, prescale_factor, postscale_factor,
                     root_rank)
        key, prepared = cache_lookup(self._prepared, described)
        if prepared is None:
            prepared = cache_store(self._prepared, key, prepare_run(*described, runtime=self))
        self.run_prepared(prepared, input_ptr, output_ptr)

    def run_prepared(self, prepared, input_ptr, output_ptr):
        """run() of a description made once by prepare_run(): per call, only the two addresses
        cross into the core (horo_run_at)."""
        rt = self._rt
        if rt is None:
            check(lib.HORO_ERR_SHUT_DOWN, self._gone)
        status = lib.horo_run_at(rt, prepared.op_type, prepared.tensor, prepared.options, input_ptr, output_ptr)
        if status != lib.HORO_OK:
            check(status, last_error())

    def bind_run(self, prepared, reader=None, expected=None):
        """run_prepared() of prepared on this runtime as one C-level callable, for an adapter's
        per-step path: run(input_ptr, output_ptr) calls the core (horo_run_at) with no Python frame
        of its own and returns the core's status; a status other than HORO_OK goes to
        bound_run_failed(run, status). The Python frames it saves (this method's and the lookup of
        the runtime) were a fifth of a 4-byte allreduce_ with 4 ranks on 2 cores (docs/benchmarks.md,
        "The adapter calls the core through a bound run").
        With a tensor reader (horo_tensor_reader_t) and expected, its reading of the tensor that
        prepared describes, run takes the two tensors instead, as the reader's handles
        (horo_run_read): the core checks them against expected and reads their addresses.
        run holds the runtime's handle: once the runtime is destroyed, its calls are refused."""
        rt = self._rt
        if rt is None:
            check(lib.HORO_ERR_SHUT_DOWN, self._gone)
        if reader is None:
            run = functools.partial(lib.horo_run_at, rt, prepared.op_type, prepared.tensor, prepared.options)
        else:
            run = functools.partial(lib.horo_run_read, rt, prepared.op_type, prepared.tensor, prepared.options,
                                    reader, expected)
        # prepared and expected: keep the C memory run points to.
        run.runtime, run.prepared, run.expected = self, prepared, expected
        return run

    def run_result_prepared(self, prepared, input_ptr, output_ptr, output_bytes):
        """run_prepared() of an allgather, alltoall or reducescatter, whose result the core sizes
        (horo_run_result_at): output_ptr holds output_bytes bytes, a guess of the result's size (0
        and 0: none). Returns (handle, r): r is this thread's horo_result_t, valid until its next
        call here (r.nbytes is the result's size; result_of(r) makes a Result of it,
        received_splits_of(r) reads only the splits). A handle of 0 means the result was written
        to output_ptr; otherwise the caller copies it out of r (copy_result), then calls
        release(handle). The received splits stay readable until the thread's next call either way."""
        slots = _result_slots.__dict__
        out = slots.get("result")
        if out is None:
            out = slots["result"] = ffi.new("horo_result_t*")
            slots["handle"] = ffi.new("horo_handle_t*")
        handle = slots["handle"]
        rt = self._rt
        if rt is None:
            check(lib.HORO_ERR_SHUT_DOWN, self._gone)
        status = lib.horo_run_result_at(rt, prepared.op_type, prepared.tensor, prepared.options, input_ptr, output_ptr,
                                        output_bytes, out, handle)
        if status != lib.HORO_OK:
            check(status, last_error())
        return handle[0], out

    @staticmethod
    def result_of(r) -> Result:
        """A Result of a filled horo_result_t (run_result_prepared's r)."""
        return _result_of(r)

    @staticmethod
    def received_splits_of(r):
        """The received splits of a filled horo_result_t, as a list; None when it has none."""
        n = r.num_received_splits
        return ffi.unpack(r.received_splits, n) if n else None

    def enqueue_prepared(self, prepared, input_ptr, output_ptr) -> int:
        """enqueue() of one tensor from a description made once by prepare_run(caller_waits=False):
        per call only the two addresses cross into the core (horo_enqueue_at). Returns the handle."""
        out = _result_slots.__dict__.get("enqueued")  # this thread's, read back at once
        if out is None:
            out = _result_slots.enqueued = ffi.new("horo_handle_t*")
        rt = self._rt
        if rt is None:
            check(lib.HORO_ERR_SHUT_DOWN, self._gone)
        status = lib.horo_enqueue_at(rt, prepared.op_type, prepared.tensor, prepared.options, input_ptr, output_ptr,
                                     out)
        if status != lib.HORO_OK:
            check(status, last_error())
        return out[0]

    def poll(self, handle, driving=False) -> bool:
        """Whether the handle completed. driving: for a thread that polls in a loop, which then
        moves the collectives itself (horo_poll_driving) instead of starving the thread that would."""
        done = ffi.new("int32_t*")
        with self._use() as rt:
            check((lib.horo_poll_driving if driving else lib.horo_poll)(rt, handle, done))
        return bool(done[0])

    def wait(self, handle, timeout=None):
        """Blocks until the handle completes; raises the operation's error, if any."""
        with self._use() as rt:
            check(lib.horo_wait(rt, handle, -1.0 if timeout is None else float(timeout)))

    def wait_release(self, handle):
        """wait() then release() in one call, for operations whose outputs the caller gave. The
        handle is released even when the operation failed; its error is raised afterwards."""
        rt = self._rt
        if rt is None:
            check(lib.HORO_ERR_SHUT_DOWN, self._gone)
        status = lib.horo_wait(rt, handle, -1.0)
        message = last_error() if status != lib.HORO_OK else ""
        lib.horo_release(rt, handle)
        check(status, message)

    def result(self, handle) -> Result:
        r = ffi.new("horo_result_t*")
        with self._use() as rt:
            check(lib.horo_handle_result(rt, handle, r))
        return _result_of(r)

    def release(self, handle):
        with self._use() as rt:
            check(lib.horo_release(rt, handle))

    def copy_result(self, result: Result, dest_ptr: int):
        """Copies a core-owned result into caller memory of at least result.nbytes bytes. Counted as
        a call (in _active, which destroy() waits for), so that another thread's shutdown() cannot
        free the result under the copy; once the runtime is destroyed it raises HoroShutdownError
        instead."""
        if not result.nbytes:
            return
        active = self._active
        active.append(None)
        try:
            if self._rt is None:
                check(lib.HORO_ERR_SHUT_DOWN, self._gone)
            ffi.memmove(ffi.cast("void*", dest_ptr), ffi.cast("void*", result.data_ptr), result.nbytes)
        finally:
            active.pop()

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
