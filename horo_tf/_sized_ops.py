"""Allgather, alltoall and reducescatter on TensorFlow tensors: the collectives whose result's size
depends on the ranks (horo_tf.mpi_ops re-exports them, with Horovod's names and signatures; their
gradients are described there).
"""
import numpy as np
import tensorflow as tf

from horo_core import basics
from horo_core._binding import lib
from horo_core.errors import HoroInvalidArgument, HoroUnsupportedError
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import Average, Sum
from horo_core.runtime import split_counts
from horo_tf import _bridge
from horo_tf._primitives import allgather_group, as_tensors, dtype_codes, grad_or_zeros
from horo_tf.compression import Compression


# Allgather ---------------------------------------------------------------------------------------

def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenates tensor from every rank of process_set along dimension 0; differentiable.

    Args:
        tensor: rank >= 1; dimension 0 may differ per rank, the others must agree.
        name: operation name (see allreduce).
        ignore_name_scope: leave the current name scope out of the name.
        process_set: the ranks taking part.
    Returns:
        A tensor whose dimension 0 is the sum over ranks.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    return allgather_group([tensor], _bridge.op_name("allgather", name, process_set, ignore_name_scope, [tensor]),
                      process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Allgathers a list of tensors as one group; differentiable. Returns a list.

    Raises:
        As allgather.
    """
    if not tensors:
        return []
    base = _bridge.op_name("grouped_allgather", name, process_set, ignore_name_scope, tensors)
    return allgather_group(list(tensors), base, process_set)


# Alltoall ----------------------------------------------------------------------------------------

def alltoall(tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Scatters rows of tensor to the ranks of process_set and gathers what they send; differentiable.

    Args:
        tensor: rank >= 1; dimension 0 is split.
        splits: rows for each rank of the set (list or integer tensor); None splits equally.
        name: operation name.
        ignore_name_scope: leave the current name scope out of the name.
        process_set: the ranks taking part.
    Returns:
        The gathered tensor, or (tensor, received_splits as int32) when splits is given.
    Raises:
        ValueError: invalid splits or arguments. HorovodInternalError: the collective failed.
    """
    base = _bridge.op_name("alltoall", name, process_set, ignore_name_scope, [tensor])
    tensor, = as_tensors([tensor], lib.HORO_ALLTOALL, process_set, lambda: [base])
    if _bridge.no_gradient_needed([tensor]):  # eagerly, no tape: no wrapper, no tensors for the splits
        code = _bridge.dtype_code(tensor.dtype, base)
        # Checked by the runtime, which refuses a split that is not a whole number on every rank.
        split_list = None if splits is None else np.reshape(np.asarray(splits), [-1]).tolist()
        (out,), (result,) = _bridge.execute(lib.HORO_ALLTOALL, [base], [_bridge.to_numpy(tensor)], [code], [None],
                                            _bridge.process_set_id(process_set), splits=split_list)
        out = tf.convert_to_tensor(out, dtype=tensor.dtype)
        return out if splits is None else (out, tf.constant(result.received_splits or [], tf.int32))
    out, received = _alltoall(tensor, splits, base, process_set)
    return out if splits is None else (out, received)


def _alltoall(tensor, splits, base, process_set):
    code = _bridge.dtype_code(tensor.dtype, base)
    set_id = _bridge.process_set_id(process_set)
    if splits is not None and not any(tf.is_tensor(s) for s in tf.nest.flatten(splits)):
        splits = split_counts(np.reshape(np.asarray(splits), [-1]).tolist())
    elif splits is not None:
        splits = tf.convert_to_tensor(splits)  # a tensor, or a list holding tensors (tf.shape(x)[0])
        if not splits.dtype.is_integer:
            # Cast to int64 in the graph, fractional splits would be truncated without a word.
            raise HoroInvalidArgument(f"alltoall splits must be integers, got a tensor of dtype {splits.dtype.name}")
    split_tensor = tf.zeros([0], tf.int64) if splits is None else tf.cast(tf.reshape(splits, [-1]), tf.int64)

    def body(array, split_array):
        split_list = [int(s) for s in split_array] if splits is not None else None
        (out,), (result,) = _bridge.execute(lib.HORO_ALLTOALL, [base], [array], [code], [None], set_id,
                                            splits=split_list)
        return [out, np.asarray(result.received_splits or [], dtype=np.int32)]

    @tf.custom_gradient
    def exchange(x, s):
        out, received = _bridge.call(body, [x, s], [x.dtype, tf.int32],
                                     [[None] + x.shape[1:].as_list() if x.shape.rank is not None else None,
                                      [None]])

        def grad(dy, unused_dreceived):
            dy = tf.zeros_like(out) if dy is None else dy
            g, _ = _alltoall(dy, received, _bridge.auto_name("alltoall.grad", set_id, [dy]), process_set)
            return g, None

        return (out, received), grad

    return exchange(tensor, split_tensor)


# Reducescatter -----------------------------------------------------------------------------------

def _reducescatter(tensors, base, op, prescale_factor, postscale_factor, process_set):
    names = basics.member_names(base, len(tensors))
    codes = dtype_codes(tensors, names)
    set_id = _bridge.process_set_id(process_set)

    def body(*arrays):
        return _bridge.execute(lib.HORO_REDUCESCATTER, names, arrays, codes, [None] * len(arrays), set_id,
                               reduce_op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor)[0]

    def forward(*xs):
        return _bridge.call(body, xs, [x.dtype for x in xs],
                            [[None] + x.shape[1:].as_list() if x.shape.rank is not None else None for x in xs])

    if _bridge.no_gradient_needed(tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def scatter(*xs):
        ys = forward(*xs)

        def grad(*dys):
            if op not in (Sum, Average):  # the allgather below would be no gradient of theirs
                raise HoroUnsupportedError("the gradient of a reducescatter is defined for Sum and Average only; "
                                           "stop the gradient of the input of a reducescatter with op=Min, Max "
                                           "or Product")
            grads = grad_or_zeros(dys, ys)
            # Horovod's factor (the set's size for Sum), and the scales as the allreduce's gradient
            # applies them; horo_torch's reducescatter gradient is the same.
            scale = prescale_factor * postscale_factor * (process_set.size() if op == Sum else 1)
            if scale != 1.0:
                grads = [g * tf.cast(scale, g.dtype) for g in grads]
            return allgather_group(grads, _bridge.auto_name("reducescatter.grad", set_id, grads), process_set,
                              differentiable=False)

        return ys, grad

    return list(scatter(*tensors))


def reducescatter(tensor, device_dense="", compression=Compression.none, op=Average, name=None,
                  process_set=global_process_set, ignore_name_scope=False, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces tensor across ranks and returns this rank's part along dimension 0; differentiable.

    Rank i of the set keeps part i; the first (dim 0 % size) parts get one extra row.

    Args:
        tensor: same shape on every rank, rank >= 1.
        device_dense: accepted for Horovod compatibility.
        compression: the dtype the data travels in.
        op: Average (default), Sum, Min, Max or Product (whose gradients raise
            HoroUnsupportedError: detach the input).
        name: operation name.
        process_set: the ranks taking part.
        ignore_name_scope: leave the current name scope out of the name.
        prescale_factor, postscale_factor: scale before and after the reduction.
    Returns:
        This rank's rows of the reduced tensor.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    # Named after the compressed tensor in a graph; eagerly op_name looks at no tensor.
    tensor, = as_tensors([tensor], lib.HORO_REDUCESCATTER, process_set,
                         lambda: [_bridge.op_name("reducescatter", name, process_set, ignore_name_scope)])
    compressed, ctx = compression.compress(tensor)
    base = _bridge.op_name("reducescatter", name, process_set, ignore_name_scope, [compressed])
    out = _reducescatter([compressed], base, op, prescale_factor, postscale_factor, process_set)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, device_dense="", compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0, name=None):
    """Reducescatters a list of tensors as one group; differentiable. Returns a list.

    Raises:
        As reducescatter.
    """
    if not tensors:
        return []
    converted = as_tensors(tensors, lib.HORO_REDUCESCATTER, process_set, lambda: basics.member_names(
        _bridge.op_name("grouped_reducescatter", name, process_set, True), len(tensors)))
    pairs = [compression.compress(t) for t in converted]
    base = _bridge.op_name("grouped_reducescatter", name, process_set, True, [p[0] for p in pairs])
    outs = _reducescatter([p[0] for p in pairs], base, op, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]
