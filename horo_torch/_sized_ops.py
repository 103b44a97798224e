"""The collectives whose result size only the negotiation tells: allgather, alltoall and
reducescatter, single and grouped (Horovod's names, re-exported by horo_torch.mpi_ops). The
gradient of an allgather is an averaged allreduce sliced to this rank's rows, of an alltoall the
reverse alltoall, and of a reducescatter an allgather, times the set's size for Sum (Horovod's
factors).
"""
import torch

from horo_core import basics
from horo_core._binding import lib
from horo_core.errors import HoroUnsupportedError
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import Average, Sum
from horo_core.runtime import prepare_run
from horo_torch import _sized_runs, device
from horo_torch._calls import (_PREPARED_RUNS_LIMIT, _compressed, _dtype_code, _enqueue, _from_result, _now,
                               _op_name, _records_graph, _refuse_unless_dense)
from horo_torch._compile import eager_under_compile
from horo_torch._handles import synchronize
from horo_torch.compression import Compression
from horo_torch._allreduce_ops import allreduce, grouped_allreduce


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
    _refuse_unless_dense(lib.HORO_ALLGATHER, kind, name, tensors, process_set)
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


@eager_under_compile
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


@eager_under_compile
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
    _refuse_unless_dense(lib.HORO_ALLGATHER, "allgather", name, [tensor], process_set)
    if _records_graph((tensor,)):
        return HorovodAllgather.apply(tensor, name, process_set)
    return _allgather_now(tensor, name, process_set)


def _describe_sized(op_type, kind, name, tensor, process_set, reduce_op=None, prescale_factor=1.0,
                    postscale_factor=1.0, splits=None):
    """The core's description of a synchronous call for _sized_runs.run (named as _enqueue names it)."""
    set_id = process_set.process_set_id
    base = _op_name(kind, name, set_id)
    return prepare_run(op_type, base, _dtype_code(tensor, base, op_type, set_id), tuple(tensor.shape), set_id,
                       reduce_op, prescale_factor, postscale_factor, splits=splits, runtime=basics.runtime())


def _allgather_now(tensor, name, process_set):
    """A synchronous allgather: a named dense host tensor takes one call into the core (_sized_runs)."""
    got = _sized_runs.run(lib.HORO_ALLGATHER, name, tensor, process_set, (),
                          lambda: _describe_sized(lib.HORO_ALLGATHER, "allgather", name, tensor, process_set))
    return _now(allgather_async, tensor, name, process_set) if got is None else got[0]


@eager_under_compile
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


@eager_under_compile
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
    _refuse_unless_dense(lib.HORO_ALLGATHER, "grouped_allgather", name, tensors, process_set)
    if _records_graph(tensors):
        return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))
    return _now(grouped_allgather_async, tensors, name, process_set)


# Alltoall ----------------------------------------------------------------------------------------

def _splits_list(splits):
    """splits as a flat list; the runtime refuses a split that is not a whole number, on every rank."""
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        return splits.reshape(-1).tolist()
    try:
        return list(splits)
    except TypeError:  # one number, not one per rank: refused on every rank as a wrong count
        return [splits]


@eager_under_compile
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts an alltoall: rows splits[j] of tensor go to rank j of the set (equal parts if splits is
    None). Returns a handle whose synchronize() gives (output, received_splits)."""
    _refuse_unless_dense(lib.HORO_ALLTOALL, "alltoall", name, [tensor], process_set)
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


@eager_under_compile
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
    _refuse_unless_dense(lib.HORO_ALLTOALL, "alltoall", name, [tensor], process_set)
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
    _refuse_unless_dense(lib.HORO_REDUCESCATTER, kind, name, tensors, process_set)
    staging = device.Staging()
    srcs = [staging.to_host(t) for t in tensors]

    def finish(rt, results):
        outs = [_from_result(rt, r, t, staging) for r, t in zip(results, tensors)]
        return outs if kind.startswith("grouped") else outs[0]

    return _enqueue(lib.HORO_REDUCESCATTER, kind, name, srcs, [None] * len(srcs), process_set, finish, staging,
                    reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)


@eager_under_compile
def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reduction of tensor across ranks whose result is split along dimension 0; rank i of
    the set keeps part i (the first dim % size parts get one extra row). Returns a handle."""
    return _reducescatter_async([tensor], name, op, process_set, prescale_factor, postscale_factor, "reducescatter")


def _refuse_gradient_of(op):
    """Raises HoroUnsupportedError for Min, Max and Product, whose gradient the allgather of the
    incoming gradient is not (it would reach every rank, whichever held the extreme or the factors)."""
    if op not in (Sum, Average):
        raise HoroUnsupportedError("the gradient of a reducescatter is defined for Sum and Average only; "
                                   "detach the input of a reducescatter with op=Min, Max or Product")


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
        _refuse_gradient_of(ctx.op)
        grad = allgather(grad_output, process_set=ctx.process_set)
        scale = ctx.scale * (ctx.process_set.size() if ctx.op == Sum else 1)
        if scale != 1.0:
            grad = grad * scale
        return grad, None, None, None, None, None


@eager_under_compile
def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces tensor across ranks and returns this rank's part of the result along dimension 0;
    differentiable.

    Args:
        tensor: same shape on every rank, rank >= 1.
        name: operation name.
        compression: the dtype the data travels in.
        op: Average (default), Sum, Min, Max or Product (whose gradients raise
            HoroUnsupportedError: detach the input).
        process_set: the ranks taking part.
        prescale_factor, postscale_factor: scale before and after the reduction.
    Returns:
        This rank's rows of the reduced tensor.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    _refuse_unless_dense(lib.HORO_REDUCESCATTER, "reducescatter", name, [tensor], process_set)
    (compressed, ctx), = _compressed(compression, lib.HORO_REDUCESCATTER, "reducescatter", name, [tensor],
                                     process_set)
    if _records_graph((compressed,)):
        out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    else:
        out = _reducescatter_now(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


def _reducescatter_now(tensor, name, op, process_set, prescale_factor, postscale_factor):
    """A synchronous reducescatter: a named dense host tensor takes one call into the core."""
    try:  # floats: compared with ==, a tensor of several elements would raise
        options = (op, float(prescale_factor), float(postscale_factor))
    except (TypeError, ValueError, OverflowError):  # the general path refuses them on every rank
        options = None
    got = None if options is None else _sized_runs.run(
        lib.HORO_REDUCESCATTER, name, tensor, process_set, options,
        lambda: _describe_sized(lib.HORO_REDUCESCATTER, "reducescatter", name, tensor, process_set, op,
                                prescale_factor, postscale_factor))
    if got is None:
        return _now(reducescatter_async, tensor, name, op, process_set, prescale_factor, postscale_factor)
    return got[0]


@eager_under_compile
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
        _refuse_gradient_of(ctx.op)
        grads = grouped_allgather(list(grad_outputs), process_set=ctx.process_set)
        scale = ctx.scale * (ctx.process_set.size() if ctx.op == Sum else 1)
        if scale != 1.0:
            grads = [g * scale for g in grads]
        return (None, None, None, None, None, *grads)


@eager_under_compile
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
    tensors = list(tensors)
    _refuse_unless_dense(lib.HORO_REDUCESCATTER, "grouped_reducescatter", name, tensors, process_set)
    pairs = _compressed(compression, lib.HORO_REDUCESCATTER, "grouped_reducescatter", name, tensors, process_set)
    compressed = [p[0] for p in pairs]
    if _records_graph(compressed):
        outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                 *compressed)
    else:
        outs = synchronize(grouped_reducescatter_async(compressed, name, op, process_set, prescale_factor,
                                                       postscale_factor))
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
