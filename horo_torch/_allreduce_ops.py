"""Allreduce on torch tensors, single and grouped, in place or not, synchronous or not (Horovod's
names, re-exported by horo_torch.mpi_ops). The gradient of an allreduce is an allreduce with the
same op, for Sum, Average and Adasum; for Min, Max and Product it raises, as in horo_tf: Horovod
reduces the incoming gradient with the op, which is not the gradient of those ops.
"""
import torch

from horo_core import basics
from horo_core._binding import lib
from horo_core.errors import HoroUnsupportedError
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import (Max, Min, Product, handle_average_backwards_compatibility,  # noqa: F401 (re-exported)
                                   resolve_op)
from horo_core.runtime import bound_run_failed, prepare_run
from horo_torch import device
from horo_torch._calls import (_caller, _compressed, _copy_back, _dtype_code, _enqueue, _host_output,
                               _is_host_contiguous, _is_host_dense, _last_description, _now, _op_name,
                               _records_graph, _refuse_unless_dense, _remember, _run_host, _run_host_described)
from horo_torch._compile import eager_under_compile
from horo_torch._handles import _register, synchronize
from horo_torch._reading import READABLE, facts_of, reader
from horo_torch.compression import Compression


# Allreduce ---------------------------------------------------------------------------------------

# The last in-place allreduce_ of each name on a host tensor, checked field by field before the
# dictionary of descriptions (_calls._prepared_runs) is consulted: a loop of metric allreduces then
# skips building and hashing that dictionary's key (0.3 us of a 2.6 us call on one rank;
# docs/benchmarks.md), and calls the core through the run bound to the runtime and to the core's
# reading of the tensor (Runtime.bind_run, _reading): the core, not Python, checks the tensor's
# dtype, shape, device and layout and reads its address.
# Entries: ((average, op, prescale, postscale, process set), the set's id, None, None, bound run).
_last_allreduce = {}
# The same for the out-of-place allreduce without compression or a graph (a loop of metric
# averages, the most common call of all): its output is a new tensor every call, made with
# empty_like (a third of the cost of torch.empty(shape, dtype=...)).
_last_allreduce_copy = {}


def _allreduce_host(tensor, output, memo, average, name, op, prescale_factor, postscale_factor, process_set):
    """The allreduce of a dense host tensor into output (tensor itself, in place), waited for; its
    description, bound to the runtime and to the core's reading of the tensor (_reading), is
    remembered in memo (_last_allreduce or _last_allreduce_copy). Returns output."""
    prepared = _run_host_described(lib.HORO_ALLREDUCE, "allreduce", name, tensor, output, process_set,
                                   resolve_op(average, op, stacklevel=4), prescale_factor, postscale_factor, 0)
    expected = None if prepared is None else facts_of(tensor)
    if expected is not None:
        _remember(memo, name, None, average, op, prescale_factor, postscale_factor, process_set,
                  basics.runtime().bind_run(prepared, reader(), expected))
    return output


def _allreduce_async(tensors, output_tensors, name, op, prescale_factor, postscale_factor, process_set, kind):
    _refuse_unless_dense(lib.HORO_ALLREDUCE, kind, name, tensors, process_set)
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


@eager_under_compile
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
    return _allreduce_async_described(_last_async_copy, tensor, None, average, name, op, prescale_factor,
                                      postscale_factor, process_set)


@eager_under_compile
def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """In-place form of allreduce_async: the result overwrites tensor. Returns a handle."""
    return _allreduce_async_described(_last_async, tensor, tensor, average, name, op, prescale_factor,
                                      postscale_factor, process_set)


# The last allreduce_async_ and allreduce_async of each name on a host tensor, checked as
# _last_allreduce is: a gradient enqueued step after step then crosses into the core with its two
# addresses only (horo_enqueue_at), skipping the general path's specs and C structs
# (docs/benchmarks.md).
_last_async = {}
_last_async_copy = {}


def _allreduce_async_described(memo, tensor, output, average, name, op, prescale_factor, postscale_factor,
                               process_set):
    """The handle of an allreduce of tensor into output (tensor itself, in place; None: a new tensor),
    enqueued from the description memo holds for the name when the call matches it, else by the
    general path, whose description memo then keeps (for a named dense host tensor)."""
    waits = _caller.waits
    prepared = None if waits else _last_description(memo, name, tensor, average, op, prescale_factor,
                                                    postscale_factor, process_set)
    if prepared is not None:
        if output is None:
            output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        runtime = basics.runtime()
        core_handle = runtime.enqueue_prepared(prepared, tensor.data_ptr(), output.data_ptr())
        return _register(runtime, (core_handle,), (tensor, output), lambda rt, results: output, None, False)
    _refuse_unless_dense(lib.HORO_ALLREDUCE, "allreduce", name, [tensor], process_set)
    resolved = resolve_op(average, op)
    if output is None:
        output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    handle = _allreduce_async([tensor], [output], name, resolved, prescale_factor, postscale_factor, process_set,
                              "allreduce")
    set_id = process_set.process_set_id
    if name is not None and set_id is not None and _is_host_dense(tensor) and not waits:
        base = _op_name("allreduce", name, set_id)
        prepared = prepare_run(lib.HORO_ALLREDUCE, base, _dtype_code(tensor, base, lib.HORO_ALLREDUCE, set_id),
                               tuple(tensor.shape), set_id, resolved, prescale_factor, postscale_factor, 0,
                               caller_waits=False)
        _remember(memo, name, tensor, average, op, prescale_factor, postscale_factor, process_set, prepared)
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


def _gradient_op(op):
    """op, for the allreduce of an allreduce's incoming gradient.

    Raises:
        HoroUnsupportedError: op is Min, Max or Product, whose gradient that allreduce is not.
    """
    if op in (Min, Max, Product):
        raise HoroUnsupportedError("the gradient of an allreduce is defined for Sum, Average and Adasum only; "
                                   "detach the input of an allreduce with op=Min, Max or Product")
    return op


class HorovodAllreduce(torch.autograd.Function):
    """Allreduce whose gradient is the allreduce of the incoming gradient with the same op."""

    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.scales, ctx.process_set = op, (prescale_factor, postscale_factor), process_set
        return _allreduce_now(tensor, name, op, prescale_factor, postscale_factor, process_set)

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=_gradient_op(ctx.op), prescale_factor=ctx.scales[0],
                         postscale_factor=ctx.scales[1],
                         process_set=ctx.process_set)
        return grad, None, None, None, None, None


@eager_under_compile
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
    last = _last_allreduce_copy.get(name)  # as in allreduce_
    if (last is not None and compression is Compression.none
            and last[0] == (average, op, prescale_factor, postscale_factor, process_set)
            and last[1] == process_set.process_set_id and type(tensor) in READABLE):
        if not (tensor.requires_grad and torch.is_grad_enabled()):
            run = last[4]
            output = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            status = run(tensor._cdata, output._cdata)
            if status == 0:  # HORO_OK
                return output
            bound_run_failed(run, status)  # returned: a changed tensor, or a runtime since destroyed
    _refuse_unless_dense(lib.HORO_ALLREDUCE, "allreduce", name, [tensor], process_set)
    (compressed, ctx), = _compressed(compression, lib.HORO_ALLREDUCE, "allreduce", name, [tensor], process_set)
    records_graph = _records_graph((compressed,))
    if not records_graph and compression is Compression.none and _is_host_dense(tensor):
        # _allreduce_host resolves (average, op) itself, and remembers them for the path above.
        reduced = _allreduce_host(tensor, torch.empty_like(tensor, memory_format=torch.contiguous_format),
                                  _last_allreduce_copy, average, name, op, prescale_factor, postscale_factor,
                                  process_set)
    elif records_graph:
        reduced = HorovodAllreduce.apply(compressed, name, resolve_op(average, op), prescale_factor,
                                         postscale_factor, process_set)
    else:
        reduced = _allreduce_now(compressed, name, resolve_op(average, op), prescale_factor, postscale_factor,
                                 process_set)
    return compression.decompress(reduced, ctx)


@eager_under_compile
def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """In-place allreduce; returns tensor."""
    # The memo's check, written out here: a call of a Python function costs about 1 us of a 4-byte
    # allreduce's latency with 4 ranks on 2 cores. The core checks the tensor itself.
    last = _last_allreduce.get(name)
    if (last is not None and last[0] == (average, op, prescale_factor, postscale_factor, process_set)
            and last[1] == process_set.process_set_id and type(tensor) in READABLE):
        run = last[4]
        impl = tensor._cdata
        status = run(impl, impl)
        if status == 0:  # HORO_OK
            return tensor
        bound_run_failed(run, status)  # returned: a changed tensor, or a runtime since destroyed
    _refuse_unless_dense(lib.HORO_ALLREDUCE, "allreduce", name, [tensor], process_set)
    if _is_host_dense(tensor):
        return _allreduce_host(tensor, tensor, _last_allreduce, average, name, op, prescale_factor, postscale_factor,
                               process_set)
    return _now(allreduce_async_, tensor, average, name, op, prescale_factor, postscale_factor, process_set)


@eager_under_compile
def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts an allreduce of a list of tensors negotiated and fused as one group. Returns a handle
    whose synchronize() gives the list of reduced tensors."""
    tensors = list(tensors)
    _refuse_unless_dense(lib.HORO_ALLREDUCE, "grouped_allreduce", name, tensors, process_set)
    op = resolve_op(average, op)
    outs = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    return _allreduce_async(list(tensors), outs, name, op, prescale_factor, postscale_factor, process_set,
                            "grouped_allreduce")


@eager_under_compile
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
        grads = grouped_allreduce(list(grad_outputs), op=_gradient_op(ctx.op), prescale_factor=ctx.scales[0],
                                  postscale_factor=ctx.scales[1], process_set=ctx.process_set)
        return (None, None, None, None, None, *grads)


@eager_under_compile
def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """Allreduces a list of tensors as one atomic, fused group; differentiable. Returns a list."""
    tensors = list(tensors)
    _refuse_unless_dense(lib.HORO_ALLREDUCE, "grouped_allreduce", name, tensors, process_set)
    op = resolve_op(average, op)
    pairs = _compressed(compression, lib.HORO_ALLREDUCE, "grouped_allreduce", name, tensors, process_set)
    compressed = [p[0] for p in pairs]
    if _records_graph(compressed):
        reduced = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set, *compressed)
    else:
        reduced = synchronize(grouped_allreduce_async(compressed, None, name, op, prescale_factor, postscale_factor,
                                                      process_set))
    return [compression.decompress(r, p[1]) for r, p in zip(reduced, pairs)]


@eager_under_compile
def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    """In-place grouped allreduce; returns the list of tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))
