"""The two differentiable collectives every TensorFlow op's gradient is built from (horo_tf/mpi_ops.py,
horo_tf/_sized_ops.py): a grouped allreduce of dense tensors and a grouped allgather, and the small
helpers the ops share.
"""
import tensorflow as tf

from horo_core import basics
from horo_core._binding import lib
from horo_core.errors import HoroError, HoroInvalidArgument, HoroMismatchError, HoroUnsupportedError
from horo_core.reduce_ops import Average, Sum
from horo_tf import _bridge, _chain, errors


def as_tensor(value):
    """A tf.Tensor with value's current contents (reads tf.Variable and Keras variables).

    Raises:
        HoroInvalidArgument (a ValueError): value is a tf.RaggedTensor or tf.SparseTensor, which the
            collectives take only once made dense (TensorFlow's own error names neither).
    """
    if isinstance(value, tf.Tensor):
        return value
    if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
        dense = "value.to_tensor()" if isinstance(value, tf.RaggedTensor) else "tf.sparse.to_dense(value)"
        raise HoroInvalidArgument(f"Horo's collectives take dense tensors (and tf.IndexedSlices in allreduce), got a "
                                  f"{type(value).__name__}; pass {dense}")
    return tf.convert_to_tensor(value)


def as_tensors(values, op_type, process_set, names_of):
    """as_tensor of each of values, the inputs of one collective (op_type) over process_set. When a
    value cannot be made a dense tensor (None, rows of different lengths, a tf.RaggedTensor),
    eagerly the collective fails on every member of the set with this rank's reason
    (Runtime.refuse), as for an unsupported dtype: raised on this rank alone, the error would leave
    the others waiting for it. names_of() gives the collective's member names; it is called only
    then. While a tf.function traces, the error is this rank's alone: the other ranks name the
    collective after tensors of their own graphs, which this rank cannot know.

    Raises:
        HoroInvalidArgument (horo_tf.errors: a ValueError and a tf.errors.InvalidArgumentError): a
            value could not be converted; eagerly, on every member, naming the ranks that failed.
        ValueError, TypeError: the same while tracing (TensorFlow's error, or as_tensor's).
    """
    tensors = []
    for i, value in enumerate(values):
        try:
            tensors.append(as_tensor(value))
        except (TypeError, ValueError) as exc:
            if not tf.executing_eagerly():
                raise
            names = names_of()
            which = f" for '{names[i]}'" if len(names) > 1 else ""
            reason = f"passed a value of type {type(value).__name__}{which} that could not be made a dense tensor " \
                     f"({exc})"
            try:
                basics.runtime().refuse(op_type, names, _bridge.process_set_id(process_set), reason)
            except HoroError as error:
                raise errors.converted(error) from exc
    return tensors


def dtype_codes(tensors, names):
    return [_bridge.dtype_code(t.dtype, n) for t, n in zip(tensors, names)]


def grad_or_zeros(dys, outputs):
    return [tf.zeros_like(y) if dy is None else dy for dy, y in zip(dys, outputs)]


def allreduce_dense(tensors, base, op, prescale_factor, postscale_factor, process_set):
    """Grouped allreduce of dense tensors; differentiable."""
    names = basics.member_names(base, len(tensors))
    codes = dtype_codes(tensors, names)
    set_id = _bridge.process_set_id(process_set)

    def body(*arrays):
        outs = [_bridge.host_empty(a.shape, a.dtype) for a in arrays]
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
            grads = grad_or_zeros(dys, ys)
            return allreduce_dense(grads, _bridge.auto_name("allreduce.grad", set_id, grads), op,
                                    prescale_factor, postscale_factor, process_set)

        return ys, grad

    return list(reduce(*tensors))


def allgather_group(tensors, base, process_set, differentiable=True, join_hint=None):
    """join_hint: appended to the error when the allgather fails because ranks have joined."""
    names = basics.member_names(base, len(tensors))
    tensors = as_tensors(tensors, lib.HORO_ALLGATHER, process_set, lambda: names)
    codes = dtype_codes(tensors, names)
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

        @_chain.traced_together()
        def grad(*dys):
            grads = grad_or_zeros(dys, ys)
            averaged = allreduce_dense(grads, _bridge.auto_name("allgather.grad", set_id, grads), Average,
                                        1.0, 1.0, process_set)
            rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
            all_rows = tf.reshape(allgather_group([rows], _bridge.auto_name("allgather.grad.rows", set_id, [rows]),
                                             process_set, differentiable=False)[0], [-1, len(xs)])
            me = process_set.rank()
            offsets = tf.reduce_sum(all_rows[:me], axis=0)
            return [g[offsets[i]:offsets[i] + rows[i]] for i, g in enumerate(averaged)]

        return ys, grad

    return list(gather(*tensors))
