"""How horo_torch's collectives reach the core: dtype codes and names, the synchronous one-call
path and its memo of descriptions, the asynchronous enqueue and how results come back as tensors.
Private to horo_torch: mpi_ops, _allreduce_ops and _sized_ops build Horovod's functions on these.
"""
import threading

import torch

from horo_core import basics, dtypes
from horo_core.errors import HoroInvalidArgument
from horo_core.runtime import TensorSpec, cache_lookup, cache_store, prepare_run
from horo_torch import device
from horo_torch._handles import _register, synchronize


_TORCH_DTYPES = {
    torch.uint8: dtypes.UINT8, torch.int8: dtypes.INT8, torch.int16: dtypes.INT16, torch.int32: dtypes.INT32,
    torch.int64: dtypes.INT64, torch.float16: dtypes.FLOAT16, torch.bfloat16: dtypes.BFLOAT16,
    torch.float32: dtypes.FLOAT32, torch.float64: dtypes.FLOAT64, torch.bool: dtypes.BOOL,
    torch.uint16: dtypes.UINT16,
}


def _dtype_code(tensor, name, op_type, set_id):
    """The core's code for tensor's dtype. A dtype it has none for fails the operation on every
    member of the set (_refuse), not on this rank alone."""
    code = _TORCH_DTYPES.get(tensor.dtype)
    if code is None:
        _refuse(op_type, [name], set_id, _dtype_refusal(tensor))
    return code


def _dtype_refusal(tensor, member=None):
    supported = ", ".join(str(d).replace("torch.", "") for d in _TORCH_DTYPES)
    which = f" for '{member}'" if member is not None else ""
    return f"passed dtype {tensor.dtype}{which}, which is not supported (supported: {supported})"


def _refuse(op_type, names, set_id, reason):
    """Raises the error that every member of the set gets for the operation on names (one grouped
    call if several), which this rank cannot take part in, for reason. Waits until every member has
    submitted the names: a rank that alone failed at once would leave the others waiting for it.

    Raises:
        HoroInvalidArgument: always; the message names this rank and reason.
    """
    basics.runtime().refuse(op_type, names, set_id, reason)


def _refuse_unless_dense(op_type, kind, name, tensors, process_set):
    """Fails the operation on every member (_refuse) when one of tensors is not a torch.Tensor (a
    Python number, a NumPy array), or is sparse (or of another non-strided layout): the collectives
    read neither, and a rank that alone raised would leave the others waiting for it."""
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor) and t.layout is torch.strided:
            continue
        set_id = _process_set_id(process_set)
        names = basics.member_names(_op_name(kind, name, set_id), len(tensors))
        which = f" for '{names[i]}'" if len(tensors) > 1 else ""
        if not isinstance(t, torch.Tensor):
            _refuse(op_type, names, set_id, f"passed a value of type {type(t).__name__}{which} where a torch.Tensor "
                                            "is expected: convert it with torch.as_tensor()")
        _refuse(op_type, names, set_id,
                f"passed a tensor of layout {t.layout}{which}; collectives take dense (strided) tensors: call "
                ".to_dense(), or reduce a sparse gradient with sparse_allreduce_async or DistributedOptimizer")


def _compressed(compression, op_type, kind, name, tensors, process_set):
    """compression.compress(t) of each of tensors, as (compressed, context) pairs. A compression
    that fails on this rank (not a compressor at all, or one that raises for this rank's data)
    fails the operation on every member (_refuse) instead of on this rank alone, which would leave
    the others waiting for its tensors."""
    try:
        return [compression.compress(t) for t in tensors]
    except Exception as error:  # noqa: BLE001 - every kind of failure is passed on to every member
        set_id = _process_set_id(process_set)
        what = getattr(compression, "__name__", type(compression).__name__)
        _refuse(op_type, basics.member_names(_op_name(kind, name, set_id), len(tensors)), set_id,
                f"could not compress its tensor with compression {what}: {type(error).__name__}: {error}")


def _is_host_contiguous(tensor):
    return tensor.device.type == "cpu" and tensor.is_contiguous()


def _process_set_id(process_set):
    """The core id of process_set; a ProcessSet that init/add_process_set never registered has none."""
    if process_set.process_set_id is None:
        raise HoroInvalidArgument(f"{process_set} is not registered: pass it to hvd.init(process_sets=[...]) or "
                                  "hvd.add_process_set() first")
    return process_set.process_set_id


def _op_name(kind, name, process_set_id):
    if name is None:
        return basics.auto_name(kind, process_set_id)
    return f"{kind}.{name}"


class _Caller(threading.local):
    """Per thread: whether the operation being enqueued is waited for at once (_now). A class
    attribute gives threads that never set it False without the exception (about 1 us) that
    getattr with a default raises and catches for a missing attribute."""
    waits = False


_caller = _Caller()


def _now(start, *args):
    """Starts an operation with start(*args) and waits for it. The core is told that the caller
    waits at once, so the wait itself runs the negotiation instead of waking the core's background
    thread (a hand-off that costs more than a small collective)."""
    _caller.waits = True
    try:
        handle = start(*args)
    finally:
        _caller.waits = False
    return synchronize(handle)


# Named synchronous host calls repeat every step with the same tensor description: the core's
# description of each (name, set, options, dtype, shape) is made once (Runtime.run_prepared).
_prepared_runs = {}
_PREPARED_RUNS_LIMIT = 4096


def _run_host(op_type, kind, name, tensor, output, process_set, reduce_op=None, prescale_factor=1.0,
              postscale_factor=1.0, root_rank=0):
    """The synchronous fast path for one contiguous host tensor whose output is given: a single call
    into the core enqueues, runs the negotiation in this thread and waits. Returns output."""
    _run_host_described(op_type, kind, name, tensor, output, process_set, reduce_op, prescale_factor,
                        postscale_factor, root_rank)
    return output


def _run_host_described(op_type, kind, name, tensor, output, process_set, reduce_op, prescale_factor,
                        postscale_factor, root_rank):
    """_run_host; returns the prepared description it ran (None for an auto-named call)."""
    set_id = process_set.process_set_id
    runtime = basics.runtime()
    if name is None or set_id is None:  # auto-named: a new name every call, nothing to reuse
        set_id = _process_set_id(process_set)
        base = _op_name(kind, name, set_id)
        runtime.run(op_type, base, tensor.data_ptr(), output.data_ptr(), _dtype_code(tensor, base, op_type, set_id),
                    tuple(tensor.shape), set_id, reduce_op, prescale_factor, postscale_factor, root_rank)
        return None
    key = (op_type, name, set_id, reduce_op, prescale_factor, postscale_factor, root_rank, tensor.dtype, tensor.shape)
    key, prepared = cache_lookup(_prepared_runs, key)  # key None: an option given as an array or a list
    if prepared is None:
        base = _op_name(kind, name, set_id)
        prepared = prepare_run(op_type, base, _dtype_code(tensor, base, op_type, set_id), tuple(tensor.shape), set_id,
                               reduce_op, prescale_factor, postscale_factor, root_rank, runtime=runtime)
        cache_store(_prepared_runs, key, prepared, _PREPARED_RUNS_LIMIT)
    runtime.run_prepared(prepared, tensor.data_ptr(), output.data_ptr())
    return prepared


def _last_description(memo, name, tensor, average, op, prescale_factor, postscale_factor, process_set):
    """The description memo holds for name when this call matches the one that made it: equal
    arguments (average, op, scales, process set), the set's id unchanged, and a dense host tensor
    of the same dtype and shape. Else None."""
    last = memo.get(name)
    try:
        if (last is not None and last[0] == (average, op, prescale_factor, postscale_factor, process_set)
                and last[1] == process_set.process_set_id and tensor.dtype is last[2] and tensor.shape == last[3]
                and tensor.is_cpu and tensor.is_contiguous()):
            return last[4]
    except AttributeError:  # not a tensor: the caller's general path refuses it on every rank
        pass
    return None


def _remember(memo, name, tensor, average, op, prescale_factor, postscale_factor, process_set, prepared):
    """Keeps prepared for _last_description. tensor None: prepared is a run bound to the core's
    reading of the tensor, which checks the tensor itself, and the entry has no dtype or shape
    (allreduce_ and allreduce check its other fields)."""
    if len(memo) >= _PREPARED_RUNS_LIMIT:
        memo.clear()
    dtype, shape = (None, None) if tensor is None else (tensor.dtype, tensor.shape)
    memo[name] = ((average, op, prescale_factor, postscale_factor, process_set), process_set.process_set_id,
                  dtype, shape, prepared)


def _is_host_dense(tensor):
    return tensor.is_cpu and tensor.is_contiguous()


def _records_graph(tensors):
    """Whether autograd would record an operation on tensors. When it would not, the differentiable
    collectives skip their autograd Function, which costs about 5 us per call (docs/benchmarks.md)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _enqueue(op_type, kind, name, inputs, outputs, process_set, finish, staging=None, event=None, needs_result=None,
             **options):
    """Enqueues one operation over inputs (contiguous host tensors, or CUDA tensors on the core
    path, whose producers event follows); returns a Python-level handle. finish reads the core's
    results when an output is None, or when needs_result says so (an output that is only a guess
    of an allgather's size, which the result tells whether it fitted)."""
    runtime = basics.runtime()
    set_id = _process_set_id(process_set)
    base = _op_name(kind, name, set_id)
    names = basics.member_names(base, len(inputs))
    try:
        specs = []
        for n, src, dst in zip(names, inputs, outputs):
            code = _TORCH_DTYPES.get(src.dtype)
            if code is None:  # the whole call fails on every member
                _refuse(op_type, names, set_id, _dtype_refusal(src, n if len(names) > 1 else None))
            specs.append(TensorSpec(n, src.data_ptr(), 0 if dst is None else dst.data_ptr(), code, tuple(src.shape),
                                    device.device_code(src), 0 if dst is None else dst.numel() * dst.element_size()))
        if staging is not None:
            staging.ready()
        core_handles = runtime.enqueue(op_type, specs, process_set_id=set_id,
                                       ready_event=0 if event is None else event.cuda_event,
                                       caller_waits=_caller.waits, **options)
    except BaseException:
        if staging is not None:
            staging.release()
        raise
    if needs_result is None:
        needs_result = any(dst is None for dst in outputs)
    return _register(runtime, core_handles, (inputs, outputs, event), finish, staging, needs_result)


def _copy_back(target, computed, staging=None):
    """Finishes an operation whose result landed in `computed` but belongs in `target` (for a CUDA
    target, on the operation's stream; synchronize() waits for that copy)."""
    if computed is not target:
        if staging is not None:
            staging.copy(target, computed)
        else:
            with torch.no_grad():
                target.copy_(computed)
    return target


def _from_result(rt, result, like, staging):
    """The core-allocated result as a tensor on like's device."""
    if device.is_cuda(like):
        host = staging.host_empty(result.shape, like.dtype)
        if result.nbytes:
            rt.copy_result(result, host.data_ptr())
        return staging.to_device(host, like)
    out = torch.empty(result.shape, dtype=like.dtype, device="cpu")
    if result.nbytes:
        rt.copy_result(result, out.data_ptr())
    return out.to(like.device) if like.device.type != "cpu" else out


def _host_output(output, src, staging):
    """Where the core writes a result that belongs in output: output itself when it is contiguous
    host memory, the staged input when output is that same tensor (in place), else a new buffer."""
    if _is_host_contiguous(output):
        return output
    if device.is_cuda(output):
        return staging.host_empty(src.shape, src.dtype)
    return torch.empty_like(src)
