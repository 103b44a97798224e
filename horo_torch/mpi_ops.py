"""Collective operations on torch tensors, with Horovod's names, signatures and semantics.

Each function validates its arguments, describes the tensors to the core as (pointer, dtype, shape,
device) and returns a handle or waits for it. CUDA tensors go to the core as they are for allreduce
and broadcast, and are staged through pooled pinned host buffers otherwise (horo_torch/device.py);
other tensors that do not live in contiguous host memory are staged through a contiguous CPU copy
(horo_torch/_calls.py: how a call reaches the core). The synchronous forms are autograd functions:
the gradient of an allreduce is an allreduce, of an allgather an averaged allreduce sliced to this
rank's rows, of a broadcast an averaged allreduce kept on the root, of an alltoall the reverse
alltoall, and of a reducescatter an allgather, times the set's size for Sum (Horovod's factors).
"""
import torch

from horo_core import basics
from horo_core._binding import lib
# As horovod.torch.mpi_ops, this module also carries the basics, so that scripts importing them from
# here (``from horovod.torch.mpi_ops import rank, size``) run after the import is renamed.
from horo_core.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built,  # noqa: F401
                              gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                              mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
                              start_timeline, stop_timeline, sycl_built)
from horo_core.errors import HorovodInternalError  # noqa: F401 (re-exported)
from horo_core.process_sets import ProcessSet, add_process_set, remove_process_set  # noqa: F401 (re-exported)
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import Adasum, Average, Max, Min, Product, Sum, resolve_op  # noqa: F401 (re-exported)
from horo_core.runtime import prepare_run
from horo_torch import _sized_runs, device
from horo_torch._calls import (_PREPARED_RUNS_LIMIT, _caller, _copy_back, _dtype_code, _enqueue, _from_result,
                               _host_output, _is_host_contiguous, _is_host_dense, _last_description, _now, _op_name,
                               _process_set_id, _records_graph, _remember, _run_host, _run_host_described)
from horo_torch._handles import _register, abandon, poll, synchronize  # noqa: F401 (abandon, poll re-exported)
from horo_torch.compression import Compression


# Allreduce ---------------------------------------------------------------------------------------

# The last in-place allreduce_ of each name on a host tensor, checked field by field before the
# dictionary of descriptions (_calls._prepared_runs) is consulted: a loop of metric allreduces then
# skips building and hashing that dictionary's key (0.3 us of a 2.6 us call on one rank;
# docs/benchmarks.md).
# Entries: (average, op, prescale, postscale, process set, its id, dtype, shape, description).
_last_allreduce = {}
# The same for the out-of-place allreduce without compression or a graph (a loop of metric
# averages, the most common call of all): its output is a new tensor every call, made with
# empty_like (a third of the cost of torch.empty(shape, dtype=...)).
_last_allreduce_copy = {}


def _allreduce_host(tensor, output, memo, average, name, op, prescale_factor, postscale_factor, process_set):
    """The allreduce of a dense host tensor into output (tensor itself, in place), waited for; its
    description is remembered in memo (_last_allreduce or _last_allreduce_copy). Returns output."""
    prepared = _run_host_described(lib.HORO_ALLREDUCE, "allreduce", name, tensor, output, process_set,
                                   resolve_op(average, op), prescale_factor, postscale_factor, 0)
    if prepared is not None:
        _remember(memo, name, tensor, average, op, prescale_factor, postscale_factor, process_set, prepared)
    return output


def _allreduce_async(tensors, output_tensors, name, op, prescale_factor, postscale_factor, process_set, kind):
    if all(t.device.type == "cpu" for t in tensors) and all(o.device.type == "cpu" for o in output_tensors):
        # Host tensors, the common case: no staging, no device checks on the per-step path.
        srcs = [t.detach().contiguous() for t in tensors]
        outs = [o if o.is_contiguous() else torch.empty_like(s) for o, s in zip(output_tensors, srcs)]

        def finish_host(rt, results):
            done = [_copy_back(o, c) for o, c in zip(output_tensors, outs)]
            return done if kind.startswith("grouped") else done[0]

        return _enqueue(lib.HORO_ALLREDUCE, kind, name, srcs, outs, process_set, finish_host, reduce_op=op,
                        prescale_factor=prescale_factor, postscale_factor=postscale_factor)
    if device.core_takes(basics.runtime(), list(tensors) + list(output_tensors)):
        return _allreduce_on_device(tensors, output_tensors, name, op, prescale_factor, postscale_factor,
                                    process_set, kind)
    staging = device.Staging()
    srcs = [staging.to_host(t) for t in tensors]
    outs = [s if o is t and not _is_host_contiguous(o) else _host_output(o, s, staging)
            for o, s, t in zip(output_tensors, srcs, tensors)]

    def finish(rt, results):
        done = [_copy_back(o, c, staging) for o, c in zip(output_tensors, outs)]
        return done if kind.startswith("grouped") else done[0]

    return _enqueue(lib.HORO_ALLREDUCE, kind, name, srcs, outs, process_set, finish, staging, reduce_op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def _allreduce_on_device(tensors, output_tensors, name, op, prescale_factor, postscale_factor, process_set, kind):
    """The core reduces the CUDA tensors in place on the GPU; scaling happens here (device.py)."""
    srcs = [device.prescaled(t, prescale_factor) for t in tensors]
    outs = [o if o.is_contiguous() else torch.empty_like(s) for o, s in zip(output_tensors, srcs)]
    event = device.ready_event(srcs)
    members = process_set.size()

    def finish(rt, results):
        done = []
        for o, c in zip(output_tensors, outs):
            done.append(_copy_back(o, device.postscale_(c, op, postscale_factor, members)))
            if c is not o and c.is_cuda:
                # c was allocated on the stream current at enqueue, and the work above is queued on
                # the one current now: the caching allocator must not hand c out again before
                # that work has read it.
                c.record_stream(torch.cuda.current_stream(c.device))
        return done if kind.startswith("grouped") else done[0]

    return _enqueue(lib.HORO_ALLREDUCE, kind, name, srcs, outs, process_set, finish, event=event, reduce_op=op,
                    prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts an allreduce of tensor into a new tensor (the input is not modified).

    Args:
        tensor: the tensor to reduce; same shape and dtype on every rank.
        average: deprecated, use op.
        name: names the operation; ranks match tensors by name. Unnamed calls are named in call order.
        op: Average (default), Sum, Min, Max or Product.
        prescale_factor, postscale_factor: multiply the input before and the result after reducing.
        process_set: restricts the operation to the ranks of this set.
    Returns:
        A handle for poll() and synchronize().
    Raises:
        ValueError: invalid arguments (unsupported dtype, both average and op, name in flight...).
    """
    op = resolve_op(average, op)
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _allreduce_async([tensor], [out], name, op, prescale_factor, postscale_factor, process_set, "allreduce")


# The last allreduce_async_ of each name on a host tensor, checked as _last_allreduce is: a
# gradient enqueued step after step then crosses into the core with its two addresses only
# (horo_enqueue_at), skipping the general path's specs and C structs (docs/benchmarks.md).
_last_async = {}


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """In-place form of allreduce_async: the result overwrites tensor. Returns a handle."""
    waits = getattr(_caller, "waits", False)
    prepared = None if waits else _last_description(_last_async, name, tensor, average, op, prescale_factor,
                                                    postscale_factor, process_set)
    if prepared is not None:
        runtime = basics.runtime()
        address = tensor.data_ptr()
        core_handle = runtime.enqueue_prepared(prepared, address, address)
        return _register(runtime, (core_handle,), tensor, lambda rt, results: tensor, None, False)
    resolved = resolve_op(average, op)
    handle = _allreduce_async([tensor], [tensor], name, resolved, prescale_factor, postscale_factor, process_set,
                              "allreduce")
    set_id = process_set.process_set_id
    if name is not None and set_id is not None and _is_host_dense(tensor) and not waits:
        base = _op_name("allreduce", name, set_id)
        prepared = prepare_run(lib.HORO_ALLREDUCE, base, _dtype_code(tensor, base), tuple(tensor.shape), set_id,
                               resolved, prescale_factor, postscale_factor, 0, caller_waits=False)
        _remember(_last_async, name, tensor, average, op, prescale_factor, postscale_factor, process_set, prepared)
    return handle


def _allreduce_now(tensor, name, op, prescale_factor, postscale_factor, process_set):
    """The reduced copy of tensor (op resolved), waited for."""
    if _is_host_dense(tensor):
        # empty_like: a third of the cost of torch.empty(shape, dtype=...) per call.
        return _run_host(lib.HORO_ALLREDUCE, "allreduce", name, tensor,
                         torch.empty_like(tensor, memory_format=torch.contiguous_format),
                         process_set, reduce_op=op, prescale_factor=prescale_factor,
                         postscale_factor=postscale_factor)
    return _now(allreduce_async, tensor, None, name, op, prescale_factor, postscale_factor, process_set)


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce whose gradient is the allreduce of the incoming gradient with the same op."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.scales, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return _allreduce_now(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.scales[0], postscale_factor=ctx.scales[1],
                         process_set=ctx.process_set)
        return grad, None, None, None, None, None


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """Reduces tensor across ranks and returns the result in a new tensor; differentiable.

    Args:
        tensor: the tensor to reduce.
        average: deprecated, use op.
        name: operation name (see allreduce_async).
        compression: Compression.none, .fp16 or .bf16: the dtype the data travels in.
        op: Average (default), Sum, Min, Max or Product.
        prescale_factor, postscale_factor: scale before and after the reduction.
        process_set: the ranks taking part.
    Returns:
        A tensor of tensor's shape and dtype.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed (e.g. a mismatch).
    """
    if compression is Compression.none:
        prepared = _last_description(_last_allreduce_copy, name, tensor, average, op, prescale_factor,
                                     postscale_factor, process_set)
        if prepared is not None and not (tensor.requires_grad and torch.is_grad_enabled()):
            output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            basics.runtime().run_prepared(prepared, tensor.data_ptr(), output.data_ptr())
            return output
    resolved = resolve_op(average, op)
    compressed, ctx = compression.compress(tensor)
    if _records_graph((compressed,)):
        reduced = HorovodAllreduce.apply(compressed, name, resolved, prescale_factor, postscale_factor, process_set)
    elif compression is Compression.none and _is_host_dense(tensor):
        reduced = _allreduce_host(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format),
                                  _last_allreduce_copy, average, name, op, prescale_factor, postscale_factor,
                                  process_set)
    else:
        reduced = _allreduce_now(compressed, name, resolved, prescale_factor, postscale_factor, process_set)
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In-place allreduce; returns tensor."""
    prepared = _last_description(_last_allreduce, name, tensor, average, op, prescale_factor, postscale_factor,
                                 process_set)
    if prepared is not None:
        address = tensor.data_ptr()
        basics.runtime().run_prepared(prepared, address, address)
        return tensor
    if _is_host_dense(tensor):
        return _allreduce_host(tensor, tensor, _last_allreduce, average, name, op, prescale_factor, postscale_factor,
                               process_set)
    return _now(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts an allreduce of a list of tensors negotiated and fused as one group. Returns a handle
    whose synchronize() gives the list of reduced tensors."""
    op = resolve_op(average, op)
    outs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    return _allreduce_async(list(tensors), outs, name, op, prescale_factor, postscale_factor, process_set,
                            "grouped_allreduce")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    """In-place form of grouped_allreduce_async."""
    op = resolve_op(average, op)
    return _allreduce_async(list(tensors), list(tensors), name, op, prescale_factor, postscale_factor, process_set,
                            "grouped_allreduce")


class HorovodGroupedAllreduce(torch.autograd.Function):
    """Grouped allreduce; the gradient is the grouped allreduce of the gradients."""

    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.scales, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        handle = grouped_allreduce_async(list(tensors), None, name, op, prescale_factor, postscale_factor,
                                         process_set)
        return tuple(synchronize(handle))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=ctx.op, prescale_factor=ctx.scales[0],
                                  postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return (None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one atomic, fused group; differentiable. Returns a list."""
    op = resolve_op(average, op)
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _records_graph(compressed):
        reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, *compressed)
    else:
        reduced = synchronize(grouped_allreduce_async(compressed, None, name, op, prescale_factor, postscale_factor,
                                                      process_set))
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """In-place grouped allreduce; returns the list of tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


# Allgather ---------------------------------------------------------------------------------------

# The shape of the last gathered result per kind, name (None for unnamed calls, whose names change
# every call), process set, dtype and input shape. Only the negotiation tells an allgather's size,
# and in a loop it is the same as the last call's: a host tensor of that shape is allocated up front
# and the core gathers straight into it when it fits (horo.h, output_bytes), instead of into a
# buffer of its own that is then copied.
_gathered_shapes = {}


def _gathered_key(kind, name, process_set, tensor):
    return kind, name, process_set.process_set_id, tensor.dtype, tuple(tensor.shape)


def _remember_gathered(key, shape):
    if len(_gathered_shapes) >= _PREPARED_RUNS_LIMIT:
        _gathered_shapes.clear()
    _gathered_shapes[key] = shape


def _allgather_async(tensors, name, process_set, kind):
    staging = device.Staging()
    srcs = [staging.to_host(t) for t in tensors]
    keys = [_gathered_key(kind, name, process_set, t) for t in tensors]
    guesses = []
    for key, t in zip(keys, tensors):
        shape = _gathered_shapes.get(key) if t.device.type == "cpu" else None
        guesses.append(None if shape is None else torch.empty(shape, dtype=t.dtype, device="cpu"))

    def finish(rt, results):
        outs = []
        for r, t, key, guess in zip(results, tensors, keys, guesses):
            if guess is not None and r.nbytes == guess.numel() * guess.element_size():  # gathered into it
                outs.append(guess if tuple(guess.shape) == r.shape else guess.view(r.shape))
            else:
                outs.append(_from_result(rt, r, t, staging))
            if t.device.type == "cpu":
                _remember_gathered(key, r.shape)
        return outs if kind.startswith("grouped") else outs[0]

    return _enqueue(lib.HORO_ALLGATHER, kind, name, srcs, guesses, process_set, finish, staging, needs_result=True)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating tensor from every rank along dimension 0 (dimension 0 may differ per
    rank, the others must agree). Returns a handle."""
    return _allgather_async([tensor], name, process_set, "allgather")


class HorovodAllgather(torch.autograd.Function):
    """Allgather; the gradient is the averaged allreduce of the gradient, sliced to this rank's rows."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        output = _allgather_now(tensor, name, process_set)  # the core rejects scalars first
        ctx.dim, ctx.process_set = tensor.shape[0], process_set
        return output

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        return _own_rows([grad], [ctx.dim], ctx.process_set)[0], None, None


def _own_rows(gathered, my_dims, process_set):
    """This rank's rows of each gathered tensor, given this rank's first dimension of each."""
    # Row r: rank r's first dimensions.
    dims = allgather(torch.tensor([my_dims], dtype=torch.int64), process_set=process_set)
    offsets = dims[:process_set.rank()].sum(0).tolist()
    return [g.narrow(0, offset, dim) for g, offset, dim in zip(gathered, offsets, my_dims)]


def allgather(tensor, name=None, process_set=global_process_set):
    """Concatenates tensor from every rank of process_set along dimension 0; differentiable.

    Args:
        tensor: a tensor of rank >= 1; dimension 0 may differ per rank.
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        A tensor whose dimension 0 is the sum over ranks.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    if _records_graph((tensor,)):
        return HorovodAllgather.apply(tensor, name, process_set)
    return _allgather_now(tensor, name, process_set)


def _describe_sized(op_type, kind, name, tensor, process_set, reduce_op=None, prescale_factor=1.0,
                    postscale_factor=1.0, splits=None):
    """The core's description of a synchronous call for _sized_runs.run (named as _enqueue names it)."""
    set_id = process_set.process_set_id
    base = _op_name(kind, name, set_id)
    return prepare_run(op_type, base, _dtype_code(tensor, base), tuple(tensor.shape), set_id, reduce_op,
                       prescale_factor, postscale_factor, splits=splits)


def _allgather_now(tensor, name, process_set):
    """A synchronous allgather: a named dense host tensor takes one call into the core (_sized_runs)."""
    got = _sized_runs.run(lib.HORO_ALLGATHER, name, tensor, process_set, (),
                          lambda: _describe_sized(lib.HORO_ALLGATHER, "allgather", name, tensor, process_set))
    return _now(allgather_async, tensor, name, process_set) if got is None else got[0]


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """Starts allgathers of a list of tensors negotiated as one group. Returns a handle."""
    return _allgather_async(list(tensors), name, process_set, "grouped_allgather")


class HorovodGroupedAllgather(torch.autograd.Function):
    """Grouped allgather; each gradient is the grouped, averaged allreduce of the gradients, sliced
    to this rank's rows."""

    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        outputs = _now(grouped_allgather_async, tensors, name, process_set)  # the core rejects scalars first
        ctx.dims, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce(list(grad_outputs), op=Average, process_set=ctx.process_set)
        return (None, None, *_own_rows(grads, ctx.dims, ctx.process_set))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    """Allgathers a list of tensors as one group; differentiable.

    Args:
        tensors: tensors of rank >= 1; dimension 0 may differ per rank.
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        A list of tensors, each with dimension 0 summed over ranks.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    tensors = list(tensors)
    if _records_graph(tensors):
        return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))
    return _now(grouped_allgather_async, tensors, name, process_set)


# Broadcast ---------------------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set):
    if device.core_takes(basics.runtime(), [tensor, output]):
        src = tensor.detach().contiguous()
        out = output if output.is_contiguous() else torch.empty_like(src)
        return _enqueue(lib.HORO_BROADCAST, "broadcast", name, [src], [out], process_set,
                        lambda rt, results: _copy_back(output, out), event=device.ready_event([src]),
                        root_rank=root_rank)
    staging = device.Staging()
    src = staging.to_host(tensor)
    out = src if output is tensor and not _is_host_contiguous(output) else _host_output(output, src, staging)
    return _enqueue(lib.HORO_BROADCAST, "broadcast", name, [src], [out], process_set,
                    lambda rt, results: _copy_back(output, out, staging), staging, root_rank=root_rank)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's tensor to every rank into a new tensor. root_rank is a global rank.
    Returns a handle."""
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place form of broadcast_async. Returns a handle."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def _broadcast_now(tensor, root_rank, name, process_set):
    """root_rank's tensor in a new tensor, waited for."""
    if _is_host_dense(tensor):
        return _run_host(lib.HORO_BROADCAST, "broadcast", name, tensor,
                         torch.empty_like(tensor, memory_format=torch.contiguous_format), process_set,
                         root_rank=root_rank)
    return _now(broadcast_async, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """Broadcast; the gradient is the averaged allreduce of the gradient, kept on the root only."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _broadcast_now(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=Average, process_set=ctx.process_set)
        if basics.rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """Returns root_rank's tensor on every rank (a new tensor); differentiable.

    Args:
        tensor: same shape and dtype on every rank.
        root_rank: the global rank whose value is sent.
        name: operation name.
        process_set: the ranks taking part (root_rank must be one of them).
    Returns:
        A tensor with root_rank's values.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    if _records_graph((tensor,)):
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    return _broadcast_now(tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast; returns tensor."""
    if _is_host_dense(tensor):
        return _run_host(lib.HORO_BROADCAST, "broadcast", name, tensor, tensor, process_set, root_rank=root_rank)
    return _now(broadcast_async_, tensor, root_rank, name, process_set)


# Alltoall ----------------------------------------------------------------------------------------

def _splits_list(splits):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return [int(s) for s in splits.reshape(-1).tolist()]
    return [int(s) for s in splits]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: rows splits[j] of tensor go to rank j of the set (equal parts if splits is
    None). Returns a handle whose synchronize() gives (output, received_splits)."""
    staging = device.Staging()
    src = staging.to_host(tensor)

    def finish(rt, results):
        out = _from_result(rt, results[0], tensor, staging)
        return out, torch.tensor(results[0].received_splits or [], dtype=torch.int32)

    return _enqueue(lib.HORO_ALLTOALL, "alltoall", name, [src], [None], process_set, finish, staging,
                    splits=_splits_list(splits))


class HorovodAlltoall(torch.autograd.Function):
    """Alltoall; the gradient is the alltoall of the gradient with the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = _alltoall_now(tensor, splits, name, process_set)
        ctx.process_set, ctx.received = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = alltoall(grad_output, splits=ctx.received, process_set=ctx.process_set)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Scatters rows of tensor to the ranks of process_set and gathers what they send; differentiable.

    Args:
        tensor: rank >= 1; dimension 0 is split.
        splits: rows for each rank of the set (list or int tensor); None splits equally.
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        The gathered tensor, or (tensor, received_splits) when splits is given.
    Raises:
        ValueError: invalid splits or arguments. HorovodInternalError: the collective failed.
    """
    if _records_graph((tensor,)):
        return HorovodAlltoall.apply(tensor, splits, name, process_set)
    output, received = _alltoall_now(tensor, splits, name, process_set, received_as_tensor=splits is not None)
    return output if splits is None else (output, received)


def _alltoall_now(tensor, splits, name, process_set, received_as_tensor=True):
    """A synchronous alltoall: (output, received splits as an int32 tensor, or None when
    received_as_tensor is False). A named dense host tensor takes one call into the core."""
    split_list = _splits_list(splits)
    got = _sized_runs.run(lib.HORO_ALLTOALL, name, tensor, process_set,
                          (None if split_list is None else tuple(split_list),),
                          lambda: _describe_sized(lib.HORO_ALLTOALL, "alltoall", name, tensor, process_set,
                                                  splits=split_list))
    if got is None:
        return _now(alltoall_async, tensor, splits, name, process_set)
    output, received = got
    return output, torch.tensor(received or [], dtype=torch.int32) if received_as_tensor else None


# Reducescatter -----------------------------------------------------------------------------------

def _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor, kind):
    staging = device.Staging()
    srcs = [staging.to_host(t) for t in tensors]

    def finish(rt, results):
        outs = [_from_result(rt, r, t, staging) for r, t in zip(results, tensors)]
        return outs if kind.startswith("grouped") else outs[0]

    return _enqueue(lib.HORO_REDUCESCATTER, kind, name, srcs, [None] * len(srcs), process_set, finish, staging,
                    reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reduction of tensor across ranks whose result is split along dimension 0; rank i of
    the set keeps part i (the first dim % size parts get one extra row). Returns a handle."""
    return _reducescatter_async([tensor], name, op, process_set, prescale_factor, postscale_factor, "reducescatter")


class HorovodReducescatter(torch.autograd.Function):
    """Reducescatter; the gradient is the allgather of the gradient times the scales, and times the
    set's size for Sum: Horovod's factor (its tests assert it), the set's size times the derivative
    of the sum. horo_tf's reducescatter gradient is the same."""

    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set, ctx.scale = op, process_set, prescale_factor * postscale_factor
        return _reducescatter_now(tensor, name, op, process_set, prescale_factor, postscale_factor)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allgather(grad_output, process_set=ctx.process_set)
        scale = ctx.scale * (ctx.process_set.size() if ctx.op == Sum else 1)
        if scale != 1.0:
            grad = grad * scale
        return grad, None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces tensor across ranks and returns this rank's part of the result along dimension 0;
    differentiable.

    Args:
        tensor: same shape on every rank, rank >= 1.
        name: operation name.
        compression: the dtype the data travels in.
        op: Average (default), Sum, Min, Max or Product.
        process_set: the ranks taking part.
        prescale_factor, postscale_factor: scale before and after the reduction.
    Returns:
        This rank's rows of the reduced tensor.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    compressed, ctx = compression.compress(tensor)
    if _records_graph((compressed,)):
        out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    else:
        out = _reducescatter_now(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def _reducescatter_now(tensor, name, op, process_set, prescale_factor, postscale_factor):
    """A synchronous reducescatter: a named dense host tensor takes one call into the core."""
    got = _sized_runs.run(lib.HORO_REDUCESCATTER, name, tensor, process_set,
                          (op, float(prescale_factor), float(postscale_factor)),
                          lambda: _describe_sized(lib.HORO_REDUCESCATTER, "reducescatter", name, tensor, process_set,
                                                  op, prescale_factor, postscale_factor))
    if got is None:
        return _now(reducescatter_async, tensor, name, op, process_set, prescale_factor, postscale_factor)
    return got[0]


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    """Starts reducescatters of a list of tensors negotiated as one group. Returns a handle."""
    return _reducescatter_async(list(tensors), name, op, process_set, prescale_factor, postscale_factor,
                                "grouped_reducescatter")


class HorovodGroupedReducescatter(torch.autograd.Function):
    """Grouped reducescatter; the gradients as reducescatter's (Horovod's factors)."""

    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set, ctx.scale = op, process_set, prescale_factor * postscale_factor
        return tuple(_now(grouped_reducescatter_async, tensors, name, op, process_set, prescale_factor,
                          postscale_factor))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allgather(list(grad_outputs), process_set=ctx.process_set)
        scale = ctx.scale * (ctx.process_set.size() if ctx.op == Sum else 1)
        if scale != 1.0:
            grads = [g * scale for g in grads]
        return (None, None, None, None, None, *grads)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    """Reducescatters a list of tensors as one group; differentiable.

    Args:
        tensors: each as reducescatter's tensor; the other arguments as reducescatter's.
    Returns:
        A list: this rank's rows of each reduced tensor.
    Raises:
        As reducescatter.
    """
    pairs = [compression.compress(t) for t in tensors]
    compressed = [p[0] for p in pairs]
    if _records_graph(compressed):
        outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                 *compressed)
    else:
        outs = synchronize(grouped_reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                                       postscale_factor))
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


# Join and barrier --------------------------------------------------------------------------------

def join(device=-1):
    """Declares that this rank has no more data. Until every rank has joined, the ranks that have
    joined take part in other ranks' allreduces with neutral values (zeros for Sum/Average).
    Blocks until all ranks joined.

    Args:
        device: accepted for Horovod compatibility; stand-in tensors live in host memory.
    Returns:
        The rank that joined last.
    """
    return join_set(global_process_set)


def join_set(process_set):
    """join() for the ranks of process_set: returns the global rank of the member that joined last."""
    runtime = basics.runtime()
    (h,) = runtime.enqueue(lib.HORO_JOIN, [], process_set_id=_process_set_id(process_set))
    handle = _register(runtime, [h], None, lambda rt, results: results[0].value)
    return synchronize(handle)


def barrier(process_set=global_process_set):
    """Blocks until every rank of process_set has called barrier."""
    runtime = basics.runtime()
    (h,) = runtime.enqueue(lib.HORO_BARRIER, [], process_set_id=_process_set_id(process_set))
    synchronize(_register(runtime, [h], None, lambda rt, results: None))


def handle_average_backwards_compatibility(op, average):
    """Horovod's helper: the op given (op, average), Average when neither is set.

    Raises:
        ValueError: both op and average were given.
    """
    return resolve_op(average, op)


def __getattr__(name):
    # horovod.torch.mpi_ops defines sparse_allreduce_async; here it lives in horo_torch.functions,
    # which imports this module, so it is looked up on first use.
    if name == "sparse_allreduce_async":
        from horo_torch.functions import sparse_allreduce_async
        return sparse_allreduce_async
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
