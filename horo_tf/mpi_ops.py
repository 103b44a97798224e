"""Collective operations on TensorFlow tensors, with Horovod's names, signatures and semantics.

Each function validates its arguments, names the operation (see ``_bridge``) and runs it eagerly or
as one ``tf.numpy_function`` inside a ``tf.function``. The results are differentiable with
``tf.custom_gradient``, with the gradients of Horovod's TensorFlow ops: of an allreduce the
allreduce of the gradient with the same op, of an allgather the averaged allreduce of the gradient
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
from horo_core.errors import HoroError, HoroInvalidArgument, HoroMismatchError, HoroUnsupportedError
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import Adasum, Average, Max, Min, Product, Sum, resolve_op  # noqa: F401 (re-exported)
from horo_tf import _bridge, errors
from horo_tf.compression import Compression



def _as_tensor(value):
    """A tf.Tensor with value's current contents (reads tf.Variable and Keras variables)."""
    return value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)


def _codes(tensors, names):
    return [_bridge.dtype_code(t.dtype, n) for t, n in zip(tensors, names)]


def _grad_or_zeros(dys, outputs):
    return [tf.zeros_like(y) if dy is None else dy for dy, y in zip(dys, outputs)]


# Allreduce ---------------------------------------------------------------------------------------

def _allreduce_dense(tensors, base, op, prescale_factor, postscale_factor, process_set):
    """Grouped allreduce of dense tensors; differentiable."""
    names = _bridge.member_names(base, len(tensors))
    codes = _codes(tensors, names)
    set_id = _bridge.process_set_id(process_set)

    def body(*arrays):
        outs = [np.empty_like(a) for a in arrays]
        return _bridge.execute(lib.HORO_ALLREDUCE, names, arrays, codes, outs, set_id, reduce_op=op,
                               prescale_factor=prescale_factor, postscale_factor=postscale_factor)[0]

    def forward(*xs):
        return _bridge.call(body, xs, [x.dtype for x in xs], [x.shape for x in xs])

    if _bridge.no_gradient_needed(tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def reduce(*xs):
        ys = forward(*xs)

        def grad(*dys):
            if op not in (Sum, Average):
                raise HoroUnsupportedError("the gradient of an allreduce is defined for Sum and Average only")
            grads = _grad_or_zeros(dys, ys)
            return _allreduce_dense(grads, _bridge.auto_name("allreduce.grad", set_id, grads), op,
                                    prescale_factor, postscale_factor, process_set)

        return ys, grad

    return list(reduce(*tensors))


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
    gathered = _allgather([s.values for s in slices] + [s.indices for s in slices], base, process_set,
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


def _grouped_allreduce(tensors, base, op, compression, prescale_factor, postscale_factor, process_set):
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    if sparse:
        _check_sparse([tensors[i] for i in sparse], op, prescale_factor, postscale_factor)  # before dense ones move
    pairs = [compression.compress(t if isinstance(t, tf.IndexedSlices) else _as_tensor(t)) for t in tensors]
    out = [None] * len(tensors)
    if dense:
        reduced = _allreduce_dense([pairs[i][0] for i in dense], base if not sparse else f"{base}.dense", op,
                                   prescale_factor, postscale_factor, process_set)
        for i, r in zip(dense, reduced):
            out[i] = r
    if sparse:
        reduced = _allreduce_sparse([pairs[i][0] for i in sparse], base if not dense else f"{base}.sparse", op,
                                    prescale_factor, postscale_factor, process_set)
        for i, r in zip(sparse, reduced):
            out[i] = r
    return [compression.decompress(o, p[1]) for o, p in zip(out, pairs)]


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
        name: ranks match operations by name; unnamed calls are named by call order eagerly, and after
            their input tensor inside a tf.function (see ``_bridge``).
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


# Allgather ---------------------------------------------------------------------------------------

def _allgather(tensors, base, process_set, differentiable=True, join_hint=None):
    """join_hint: appended to the error when the allgather fails because ranks have joined."""
    tensors = [_as_tensor(t) for t in tensors]
    names = _bridge.member_names(base, len(tensors))
    codes = _codes(tensors, names)
    set_id = _bridge.process_set_id(process_set)

    def body(*arrays):
        try:
            return _bridge.execute(lib.HORO_ALLGATHER, names, arrays, codes, [None] * len(arrays), set_id)[0]
        except HoroMismatchError as exc:
            if join_hint and "have joined" in str(exc):
                raise errors.HoroMismatchError(f"{exc}. {join_hint}") from None
            raise

    def forward(*xs):
        return _bridge.call(body, xs, [x.dtype for x in xs], [[None] + x.shape[1:].as_list()
                                                              if x.shape.rank is not None else None for x in xs])

    if not differentiable or _bridge.no_gradient_needed(tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def gather(*xs):
        ys = forward(*xs)

        def grad(*dys):
            grads = _grad_or_zeros(dys, ys)
            averaged = _allreduce_dense(grads, _bridge.auto_name("allgather.grad", set_id, grads), Average,
                                        1.0, 1.0, process_set)
            rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
            all_rows = tf.reshape(_allgather([rows], _bridge.auto_name("allgather.grad.rows", set_id, [rows]),
                                             process_set, differentiable=False)[0], [-1, len(xs)])
            me = process_set.rank()
            offsets = tf.reduce_sum(all_rows[:me], axis=0)
            return [g[offsets[i]:offsets[i] + rows[i]] for i, g in enumerate(averaged)]

        return ys, grad

    return list(gather(*tensors))


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
    return _allgather([tensor], _bridge.op_name("allgather", name, process_set, ignore_name_scope, [tensor]),
                      process_set)[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Allgathers a list of tensors as one group; differentiable. Returns a list.

    Raises:
        As allgather.
    """
    if not tensors:
        return []
    base = _bridge.op_name("grouped_allgather", name, process_set, ignore_name_scope, tensors)
    return _allgather(list(tensors), base, process_set)


# Broadcast ---------------------------------------------------------------------------------------

def _broadcast(tensors, root_rank, base, process_set):
    tensors = [_as_tensor(t) for t in tensors]
    names = _bridge.member_names(base, len(tensors))
    codes = _codes(tensors, names)
    set_id = _bridge.process_set_id(process_set)

    def body(*arrays):
        outs = [np.empty_like(a) for a in arrays]
        return _bridge.execute(lib.HORO_BROADCAST, names, arrays, codes, outs, set_id, root_rank=root_rank)[0]

    def forward(*xs):
        return _bridge.call(body, xs, [x.dtype for x in xs], [x.shape for x in xs])

    if _bridge.no_gradient_needed(tensors):
        return forward(*tensors)

    @tf.custom_gradient
    def bcast(*xs):
        ys = forward(*xs)

        def grad(*dys):
            grads = _grad_or_zeros(dys, ys)
            averaged = _allreduce_dense(grads, _bridge.auto_name("broadcast.grad", set_id, grads), Average,
                                        1.0, 1.0, process_set)
            if basics.rank() != root_rank:
                averaged = [g * tf.zeros([], g.dtype) for g in averaged]
            return averaged

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
    assignments = assign_broadcast(var_list, root_rank, name, process_set)
    # In a TF1 graph nothing orders a read after an assignment unless told; elsewhere (eager, or a
    # tf.function's automatic control dependencies) the reads come after the assignments anyway.
    with tf.control_dependencies(assignments if in_tf1_graph() else None):
        values = [var.read_value() if hasattr(var, "read_value") else tf.convert_to_tensor(var) for var in var_list]
    return values[0] if single else values


def in_tf1_graph():
    """Building a TF1 graph (for session.run), not executing eagerly nor tracing a tf.function."""
    return not tf.executing_eagerly() and not tf.inside_function()


def assign_broadcast(var_list, root_rank, name, process_set):
    """Assigns root_rank's values to the variables of var_list as one group; returns the assignments
    (ops to run in a TF1 graph)."""
    if not var_list:
        return []
    base = _bridge.op_name("broadcast_", name, process_set, True, var_list)
    return [var.assign(value) for var, value in zip(var_list, _broadcast(var_list, root_rank, base, process_set))]


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
    tensor = _as_tensor(tensor)
    if _bridge.no_gradient_needed([tensor]):  # eagerly, no tape: no wrapper, no tensors for the splits
        code = _bridge.dtype_code(tensor.dtype, base)
        split_list = None if splits is None else [int(s) for s in np.reshape(np.asarray(splits), [-1])]
        (out,), (result,) = _bridge.execute(lib.HORO_ALLTOALL, [base], [_bridge.to_numpy(tensor)], [code], [None],
                                            _bridge.process_set_id(process_set), splits=split_list)
        out = tf.convert_to_tensor(out, dtype=tensor.dtype)
        return out if splits is None else (out, tf.constant(result.received_splits or [], tf.int32))
    out, received = _alltoall(tensor, splits, base, process_set)
    return out if splits is None else (out, received)


def _alltoall(tensor, splits, base, process_set):
    code = _bridge.dtype_code(tensor.dtype, base)
    set_id = _bridge.process_set_id(process_set)
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
    tensors = [_as_tensor(t) for t in tensors]
    names = _bridge.member_names(base, len(tensors))
    codes = _codes(tensors, names)
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
            grads = _grad_or_zeros(dys, ys)
            # Horovod's factor (the set's size for Sum), and the scales as the allreduce's gradient
            # applies them; horo_torch's reducescatter gradient is the same.
            scale = prescale_factor * postscale_factor * (process_set.size() if op == Sum else 1)
            if scale != 1.0:
                grads = [g * tf.cast(scale, g.dtype) for g in grads]
            return _allgather(grads, _bridge.auto_name("reducescatter.grad", set_id, grads), process_set,
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
        op: Average (default), Sum, Min, Max or Product.
        name: operation name.
        process_set: the ranks taking part.
        ignore_name_scope: leave the current name scope out of the name.
        prescale_factor, postscale_factor: scale before and after the reduction.
    Returns:
        This rank's rows of the reduced tensor.
    Raises:
        ValueError: invalid arguments. HorovodInternalError: the collective failed.
    """
    compressed, ctx = compression.compress(_as_tensor(tensor))
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
    pairs = [compression.compress(_as_tensor(t)) for t in tensors]
    base = _bridge.op_name("grouped_reducescatter", name, process_set, True, [p[0] for p in pairs])
    outs = _reducescatter([p[0] for p in pairs], base, op, prescale_factor, postscale_factor, process_set)
    return [compression.decompress(o, p[1]) for o, p in zip(outs, pairs)]


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
        return _bridge.call(lambda: [np.int32(value_fn())], [], [tf.int32], [[]])[0]


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
