"""Collective operations on torch tensors, with Horovod's names, signatures and semantics.

Each function validates its arguments, describes the tensors to the core as (pointer, dtype, shape,
device) and returns a handle or waits for it. CUDA tensors go to the core as they are for allreduce
and broadcast, and are staged through pooled pinned host buffers otherwise (horo_torch/device.py);
other tensors that do not live in contiguous host memory are staged through a contiguous CPU copy
(horo_torch/_calls.py: how a call reaches the core). The synchronous forms are autograd functions:
the gradient of a broadcast is an averaged allreduce kept on the root.

This module holds broadcast, join and barrier, and carries the rest under Horovod's module name:
allreduce is in horo_torch/_allreduce_ops.py; allgather, alltoall and reducescatter, whose result
size only the negotiation tells, in horo_torch/_sized_ops.py.
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
from horo_core.reduce_ops import Adasum, Average, Max, Min, Product, Sum  # noqa: F401 (re-exported)
from horo_core.runtime import bound_run_failed
from horo_torch import device
from horo_torch._allreduce_ops import (HorovodAllreduce, HorovodGroupedAllreduce, allreduce,  # noqa: F401
                                       allreduce_, allreduce_async, allreduce_async_, grouped_allreduce,
                                       grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_,
                                       handle_average_backwards_compatibility)
from horo_torch._calls import (_copy_back, _enqueue, _host_output, _is_host_contiguous, _is_host_dense, _now,
                               _process_set_id, _records_graph, _refuse_unless_dense, _remember, _run_host,
                               _run_host_described)
from horo_torch._compile import eager_under_compile
from horo_torch._handles import _register, abandon, poll, synchronize  # noqa: F401 (abandon, poll re-exported)
from horo_torch._reading import READABLE, facts_of, reader
from horo_torch._sized_ops import (HorovodAllgather, HorovodAlltoall, HorovodGroupedAllgather,  # noqa: F401
                                   HorovodGroupedReducescatter, HorovodReducescatter, allgather, allgather_async,
                                   alltoall, alltoall_async, grouped_allgather, grouped_allgather_async,
                                   grouped_reducescatter, grouped_reducescatter_async, reducescatter,
                                   reducescatter_async)


# Broadcast ---------------------------------------------------------------------------------------

def _broadcast_async(tensor, output, root_rank, name, process_set):
    _refuse_unless_dense(lib.HORO_BROADCAST, "broadcast", name, [tensor], process_set)
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


@eager_under_compile
def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's tensor to every rank into a new tensor. root_rank is a global rank.
    Returns a handle."""
    _refuse_unless_dense(lib.HORO_BROADCAST, "broadcast", name, [tensor], process_set)
    output = torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device)
    return _broadcast_async(tensor, output, root_rank, name, process_set)


@eager_under_compile
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


@eager_under_compile
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
    _refuse_unless_dense(lib.HORO_BROADCAST, "broadcast", name, [tensor], process_set)
    if _records_graph((tensor,)):
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    return _broadcast_now(tensor, root_rank, name, process_set)


# The last in-place broadcast_ of each name on a host tensor, as allreduce_'s (_allreduce_ops): a
# call with the same arguments goes to the core through the run bound to the core's reading of the
# tensor, which checks the tensor itself. Entries: ((root_rank, None, 1.0, 1.0, process set), the
# set's id, None, None, bound run), the fields _remember keeps.
_last_broadcast = {}


@eager_under_compile
def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """In-place broadcast; returns tensor."""
    last = _last_broadcast.get(name)  # the memo's check written out, as in allreduce_
    if (last is not None and last[0] == (root_rank, None, 1.0, 1.0, process_set)
            and last[1] == process_set.process_set_id and type(tensor) in READABLE):
        run = last[4]
        impl = tensor._cdata
        status = run(impl, impl)
        if status == 0:  # HORO_OK
            return tensor
        bound_run_failed(run, status)  # returned: a changed tensor, or a runtime since destroyed
    _refuse_unless_dense(lib.HORO_BROADCAST, "broadcast", name, [tensor], process_set)
    if not _is_host_dense(tensor):
        return _now(broadcast_async_, tensor, root_rank, name, process_set)
    prepared = _run_host_described(lib.HORO_BROADCAST, "broadcast", name, tensor, tensor, process_set, None, 1.0, 1.0,
                                   root_rank)
    expected = None if prepared is None else facts_of(tensor)
    if expected is not None:
        _remember(_last_broadcast, name, None, root_rank, None, 1.0, 1.0, process_set,
                  basics.runtime().bind_run(prepared, reader(), expected))
    return tensor


# Join and barrier --------------------------------------------------------------------------------

@eager_under_compile
def join(device=-1):
    """Declares that this rank has no more data. Until every rank has joined, the ranks that have
    joined take part in other ranks' allreduces with neutral values, which no prescale factor
    changes: zeros for Sum/Average, ones for Product, the dtype's largest value for Min and its
    smallest for Max (Horovod sends zeros for every op). Blocks until all ranks joined.

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


@eager_under_compile
def barrier(process_set=global_process_set):
    """Blocks until every rank of process_set has called barrier."""
    runtime = basics.runtime()
    (h,) = runtime.enqueue(lib.HORO_BARRIER, [], process_set_id=_process_set_id(process_set))
    synchronize(_register(runtime, [h], None, lambda rt, results: None))


def __getattr__(name):
    # horovod.torch.mpi_ops defines sparse_allreduce_async; here it lives in horo_torch.functions,
    # which imports this module, so it is looked up on first use.
    if name == "sparse_allreduce_async":
        from horo_torch.functions import sparse_allreduce_async
        return sparse_allreduce_async
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
