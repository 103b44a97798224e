"""Collective operations on TensorFlow tensors, with Horovod's names, signatures and semantics.

Each function validates its arguments, names the operation (see ``_bridge``) and runs it eagerly or
as one ``tf.numpy_function`` inside a ``tf.function``. The results are differentiable with
``tf.custom_gradient``, with the gradients of Horovod's TensorFlow ops: of an allreduce with Sum
or Average the allreduce of the gradient with the same op (Min, Max, Product and Adasum raise:
Horovod's same-op allreduce is not their gradient), of an allgather the averaged allreduce of the gradient
sliced to this rank's rows, of a broadcast the averaged allreduce kept on the root (zeros
elsewhere), of an alltoall the reverse alltoall, and of a reducescatter the allgather of the
gradient times the pre- and postscale factors, and times the set's size for Sum (Horovod's factor,
not the derivative of the sum: they differ by the set's size).

``device_dense``, ``device_sparse`` and ``ignore_name_scope`` are accepted for compatibility; the
data always passes through host memory.
"""
import numpy as np
import tensorflow as tf

from horo_core import basics
from horo_core._binding import lib
from horo_core.errors import HoroError, HoroUnsupportedError
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import (Adasum, Average, Max, Min, Product, Sum,  # noqa: F401 (re-exported)
                                   check_num_rank_power_of_2, handle_average_backwards_compatibility, resolve_op)
# What Horovod's horovod.tensorflow.mpi_ops exports from its basics, for scripts that import it from there.
from horo_core.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built,  # noqa: F401 (re-exported)
                              gloo_built, gloo_enabled, init, is_homogeneous, is_initialized, local_rank, local_size,
                              mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built, shutdown,
                              size, start_timeline, stop_timeline)
from horo_tf import _bridge, _chain, errors
from horo_tf._primitives import allgather_group, allreduce_dense, as_tensors, dtype_codes, grad_or_zeros
from horo_tf._sized_ops import (allgather, alltoall, grouped_allgather, grouped_reducescatter,  # noqa: F401 (re-exported)
                                reducescatter)
from horo_tf.compression import Compression


# Allreduce ---------------------------------------------------------------------------------------

SPARSE_JOIN_HINT = ("IndexedSlices (e.g. embedding gradients) are reduced by allgathering their values and "
                    "indices; to reduce them while ranks have joined, densify them: sparse_as_dense=True in "
                    "DistributedOptimizer / DistributedGradientTape, or tf.convert_to_tensor before allreduce")


def _check_sparse(slices, op, prescale_factor, postscale_factor):
    """Refuses what IndexedSlices cannot take, before any collective of the call moves."""
    if op not in (Sum, Average):
        raise HoroUnsupportedError("IndexedSlices can only be summed or averaged; pass sparse_as_dense=True to "
                                   "the optimizer or tape, or tf.convert_to_tensor them, to reduce them with "
                                   "another op")
    factor = prescale_factor * postscale_factor
    if factor != 1.0 and not all(s.values.dtype.is_floating for s in slices):
        raise HoroUnsupportedError(f"IndexedSlices of an integer dtype cannot be scaled (prescale_factor * "
                                   f"postscale_factor = {factor:g}): Horo scales their values in their own "
                                   f"dtype; scale floating-point IndexedSlices, or the dense tensor")


def _allreduce_sparse(slices, base, op, prescale_factor, postscale_factor, process_set):
    """Allreduce of IndexedSlices (checked by _check_sparse) as one grouped allgather of values and
    indices. Average divides the values by the set's size as Horovod does (a true division: integer
    values become floats)."""
    factor = prescale_factor * postscale_factor
    gathered = allgather_group([s.values for s in slices] + [s.indices for s in slices], base, process_set,
                          differentiable=False, join_hint=SPARSE_JOIN_HINT)
    out = []
    for i, s in enumerate(slices):
        values = gathered[i]
        if factor != 1.0:
            values = values * tf.cast(factor, values.dtype)
        if op == Average:
            values = values / tf.cast(process_set.size(), values.dtype)
        out.append(tf.IndexedSlices(values, gathered[len(slices) + i], s.dense_shape))
    return out


@_chain.traced_together()
def _grouped_allreduce(tensors, base, op, compression, prescale_factor, postscale_factor, process_set):
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse([tensors[i] for i in sparse], op, prescale_factor, postscale_factor)  # before dense ones move
    # IndexedSlices travel as they are, as in Horovod (their allgather comes before compression
    # there): compressors see dense tensors only, and fp16 cannot overflow a sparse gradient.
    dense_base = base if not sparse else f"{base}.dense"
    converted = as_tensors([tensors[i] for i in dense], lib.HORO_ALLREDUCE, process_set,
                           lambda: basics.member_names(dense_base, len(dense)))
    pairs = [(t, None) for t in tensors]
    for i, t in zip(dense, converted):
        pairs[i] = compression.compress(t)
    out = [None] * len(tensors)
    if dense:
        reduced = allreduce_dense([pairs[i][0] for i in dense], dense_base, op, prescale_factor, postscale_factor,
                                   process_set)
        for i, r in zip(dense, reduced):
            out[i] = r
    if sparse:
        reduced = _allreduce_sparse([pairs[i][0] for i in sparse], base if not dense else f"{base}.sparse", op,
                                    prescale_factor, postscale_factor, process_set)
        for i, r in zip(sparse, reduced):
            out[i] = r
    return [o if isinstance(o, tf.IndexedSlices) else compression.decompress(o, p[1]) for o, p in zip(out, pairs)]


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduces tensor across the ranks of process_set; differentiable.

    Args:
        tensor: a tf.Tensor, tf.Variable or tf.IndexedSlices; same shape and dtype on every rank.
            IndexedSlices are allgathered (values and indices) instead of reduced.
        average: deprecated, use op.
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: Compression.none, .fp16 or .bf16: the dtype the data travels in.
        op: Average (default), Sum, Min, Max or Product (IndexedSlices: Sum or Average).
        prescale_factor, postscale_factor: multiply the input before and the result after reducing.
        name: ranks match operations by name; unnamed calls share one name eagerly (as Horovod's), and
            are named after their input tensor inside a tf.function (see ``_bridge``).
        process_set: the ranks taking part.
        ignore_name_scope: leave the current name scope out of the name.
    Returns:
        A tensor (or IndexedSlices) of tensor's shape and dtype.
    Raises:
        ValueError: invalid arguments (unsupported dtype, both average and op...).
        NotImplementedError: an op other than Sum/Average on IndexedSlices; tracing under XLA.
        HorovodInternalError: the collective failed (e.g. ranks disagree on the shape).
    """
    op = resolve_op(average, op)
    base = _bridge.op_name("allreduce", name, process_set, ignore_name_scope, [tensor])
    return _grouped_allreduce([tensor], base, op, compression, prescale_factor, postscale_factor, process_set)[0]


def grouped_allreduce(tensors, average=None, device_dense="", device_sparse="", compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduces a list of tensors (dense and IndexedSlices may mix) as one fused group; differentiable.

    Args:
        tensors: a list of tf.Tensor, tf.Variable or tf.IndexedSlices.
        Other arguments: as for allreduce.
    Returns:
        A list of reduced tensors, in the order of tensors.
    Raises:
        As allreduce.
    """
    op = resolve_op(average, op)
    if not tensors:
        return []
    base = _bridge.op_name("grouped_allreduce", name, process_set, ignore_name_scope, tensors)
    return _grouped_allreduce(list(tensors), base, op, compression, prescale_factor, postscale_factor, process_set)




# Broadcast ---------------------------------------------------------------------------------------

def _broadcast(tensors, root_rank, base, process_set, group=False):
    names = basics.member_names(base, len(tensors), group)
    tensors = as_tensors(tensors, lib.HORO_BROADCAST, process_set, lambda: names)
    codes = dtype_codes(tensors, names)
    set_id = _bridge.process_set_id(process_set)

    def body(*arrays):
        outs = [_bridge.host_empty(a.shape, a.dtype) for a in arrays]
        return _bridge.execute(lib.HORO_BROADCAST, names, arrays, codes, outs, set_id, root_rank=root_rank)[0]

    def forward(*xs):
        return _bridge.call(body, xs, [x.dtype for x in xs], [x.shape for x in xs])

    if _bridge.no_gradient_needed(tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def bcast(*xs):
        ys = forward(*xs)

        def grad(*dys):
            grads = grad_or_zeros(dys, ys)
            averaged = allreduce_dense(grads, _bridge.auto_name("broadcast.grad", set_id, grads), Average,
                                        1.0, 1.0, process_set)
            # Only the root's input reaches the result. The same ops on every rank (a factor of 1
            # or 0): collectives named after their input tensors later in a graph then agree.
            keep = 1 if basics.rank() == root_rank else 0
            return [g * tf.constant(keep, g.dtype) for g in averaged]

        return ys, grad

    return list(bcast(*tensors))


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Returns root_rank's tensor on every rank of process_set; differentiable.

    Args:
        tensor: same shape and dtype on every rank.
        root_rank: the global rank whose value is sent.
        name: operation name.
        ignore_name_scope: leave the current name scope out of the name.
        process_set: the ranks taking part (root_rank must be one of them).
    Returns:
        A tensor with root_rank's values.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    return _broadcast([tensor], root_rank,
                      _bridge.op_name("broadcast", name, process_set, ignore_name_scope, [tensor]), process_set)[0]


def broadcast_(variables, root_rank, name=None, process_set=global_process_set):
    """Overwrites variables with root_rank's values, in place, as one group.

    Args:
        variables: a tf.Variable (or Keras variable) or a list of them.
        root_rank: the global rank whose values are sent.
        name: operation name.
        process_set: the ranks taking part.
    Returns:
        The variables' new values as tensors, a list as Horovod's (one tensor for one variable).
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    single = not isinstance(variables, (list, tuple))
    var_list = [variables] if single else list(variables)
    assignments = assign_broadcast(var_list, root_rank, name, process_set, group=not single)
    # In a TF1 graph nothing orders a read after an assignment unless told; elsewhere (eager, or a
    # tf.function's automatic control dependencies) the reads come after the assignments anyway.
    with tf.control_dependencies(assignments if in_tf1_graph() else None):
        values = [var.read_value() if hasattr(var, "read_value") else tf.convert_to_tensor(var) for var in var_list]
    return values[0] if single else values


def in_tf1_graph():
    """Building a TF1 graph (for session.run), not executing eagerly nor tracing a tf.function."""
    return not tf.executing_eagerly() and not tf.inside_function()


def assign_broadcast(var_list, root_rank, name, process_set, group=True):
    """Assigns root_rank's values to the variables of var_list as one group; returns the assignments
    (ops to run in a TF1 graph). group: whether a list of one is a group (ranks passing lists of
    different lengths then get a mismatch error)."""
    if not var_list:
        return []
    base = _bridge.op_name("broadcast_", name, process_set, True, var_list)
    values = _broadcast(var_list, root_rank, base, process_set, group)
    return [var.assign(value) for var, value in zip(var_list, values)]


# Join and graph-time topology -------------------------------------------------------------------

def join():
    """Declares that this rank has no more data and waits until every rank has joined. Until then,
    joined ranks take part in the other ranks' allreduces with neutral values.

    Returns:
        An int32 scalar tensor: the rank that joined last.
    Raises:
        HorovodInternalError: the job failed while waiting.
    """
    def body():
        rt = basics.runtime()
        try:
            (handle,) = rt.enqueue(lib.HORO_JOIN, [])
            try:
                rt.wait(handle)
                return [np.int32(rt.result(handle).value)]
            finally:
                rt.release(handle)
        except HoroError as error:  # as a TensorFlow error too (horo_tf/errors.py)
            raise errors.converted(error) from None

    return _bridge.call(body, [], [tf.int32], [[]])[0]


def _topology_op(value_fn, name):
    with tf.name_scope(name or "horo_topology"):
        return _bridge.call(lambda: [np.int32(value_fn())], [], [tf.int32], [[]], local=True)[0]


def rank_op(name=None):
    """An int32 scalar tensor read when it runs: this process's global rank."""
    return _topology_op(basics.rank, name)


def local_rank_op(name=None):
    """An int32 scalar tensor read when it runs: this process's rank on its host."""
    return _topology_op(basics.local_rank, name)


def size_op(process_set_id=0, name=None):
    """An int32 scalar tensor read when it runs: the number of ranks in the process set."""
    return _topology_op(lambda: len(basics.runtime().process_set_ranks(process_set_id)), name)


def local_size_op(name=None):
    """An int32 scalar tensor read when it runs: the number of ranks on this host."""
    return _topology_op(basics.local_size, name)


def process_set_included_op(process_set_id=0, name=None):
    """An int32 scalar tensor read when it runs: 1 if this process belongs to the process set, else 0."""
    return _topology_op(lambda: int(basics.rank() in basics.runtime().process_set_ranks(process_set_id)), name)
