"""Averaging a list of gradients across ranks: the one step that DistributedGradientTape and the
Keras DistributedOptimizer share.

Dense gradients go out as grouped allreduces (one group, or the groups asked for), IndexedSlices as
allgathers of values and indices (or densified with ``sparse_as_dense``). ``None`` gradients stay
``None``, so every rank must have the same set of missing gradients, as in Horovod; where the sets
differ, every rank's reduction fails with a mismatch error (Horovod's waits for ever).
"""
import dataclasses
import warnings
from typing import Any, Optional, Sequence

import tensorflow as tf

from horo_core.errors import HoroInvalidArgument
from horo_core.process_sets import ProcessSet, global_process_set
from horo_tf import _chain, mpi_ops
from horo_tf.compression import Compression


_GRADIENT_OPS = (mpi_ops.Average, mpi_ops.Sum, mpi_ops.Adasum, mpi_ops.Min, mpi_ops.Max, mpi_ops.Product)


@dataclasses.dataclass(frozen=True)
class ReductionOptions:
    """How gradients are reduced.

    Attributes:
        op: Average (default), Sum, Adasum, Min, Max or Product, as Horovod's tape takes them
            (IndexedSlices: Average or Sum, unless sparse_as_dense).
        compression: Compression.none, .fp16 or .bf16.
        sparse_as_dense: densify IndexedSlices before reducing them.
        gradient_predivide_factor: with Average, divide by this factor before the sum and by
            size/factor after it.
        groups: None (one group), an int (that many groups of about equal count), or a list of lists
            of variables (each list one group; the other gradients form one more group).
        process_set: the ranks taking part; ranks outside it keep their gradients.
        name: base of the operation names (must be the same on every rank).
    """
    op: int = mpi_ops.Average
    compression: Any = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0
    groups: Any = None
    process_set: ProcessSet = global_process_set
    name: str = "gradients"

    def __post_init__(self):
        if self.op not in _GRADIENT_OPS:
            raise HoroInvalidArgument(f"gradients are reduced with op=Average, Sum, Adasum, Min, Max or Product, "
                                      f"got op={self.op!r}")
        if self.gradient_predivide_factor != 1.0 and self.op != mpi_ops.Average:
            raise HoroInvalidArgument("gradient_predivide_factor needs op=Average")
        if self.groups is not None and (isinstance(self.groups, bool) or not isinstance(self.groups, (int, list, tuple))
                                        or (isinstance(self.groups, int) and self.groups <= 0)):
            raise HoroInvalidArgument("groups should be a positive integer or a list of lists of variables, got "
                                      f"{self.groups!r}")


def _group_indices(options, variables, count):
    """Lists of gradient positions, one list per group."""
    groups = options.groups
    if not groups:
        return [list(range(count))]
    if isinstance(groups, int):
        size = -(-count // groups)
        return [list(range(i, min(i + size, count))) for i in range(0, count, size)]
    if variables is None:
        raise HoroInvalidArgument("groups given as lists of variables need the variables the gradients belong to")
    position = {id(v): i for i, v in enumerate(variables)}
    out, used = [], set()
    for group in groups:
        members = [position[id(v)] for v in group if id(v) in position]
        used.update(members)
        if members:
            out.append(members)
    rest = [i for i in range(count) if i not in used]
    if rest:
        out.append(rest)
    return out


@_chain.traced_together()
def reduce_gradients(grads: Sequence, options: ReductionOptions, variables: Optional[Sequence] = None) -> list:
    """Reduces grads across the ranks of options.process_set.

    Args:
        grads: tensors, IndexedSlices or None.
        options: a ReductionOptions.
        variables: the variables of grads, needed when options.groups lists variables.
    Returns:
        A list of reduced gradients in grads' order (None stays None).
    Raises:
        ValueError: invalid options. HorovodInternalError: a reduction failed.
    """
    grads = list(grads)
    ps = options.process_set
    if options.sparse_as_dense:  # also when nothing is reduced, as Horovod's: dense gradients either way
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    if not ps.included() or ps.size() == 1:
        return grads
    op, prescale, postscale = options.op, 1.0, 1.0
    if options.gradient_predivide_factor != 1.0:
        op, prescale, postscale = mpi_ops.Sum, 1.0 / options.gradient_predivide_factor, \
            options.gradient_predivide_factor / ps.size()
    out = list(grads)
    for g_index, members in enumerate(_group_indices(options, variables, len(grads))):
        present = [i for i in members if grads[i] is not None]
        # A group with no gradient on this rank takes part all the same, through an empty stand-in:
        # skipped, it would leave the others' reduction of it to pair with this rank's next step.
        # The stand-in meets only another rank's stand-in; against gradients it is a mismatch.
        tensors = [grads[i] for i in present] or [tf.zeros([0], tf.float32)]
        reduced = mpi_ops.grouped_allreduce(tensors, compression=options.compression, op=op,
                                            prescale_factor=prescale, postscale_factor=postscale,
                                            process_set=ps, name=f"{options.name}.{g_index}",
                                            ignore_name_scope=True)
        for i, r in zip(present, reduced):
            out[i] = r
    return out


def for_variable_set(options: ReductionOptions, numbers: dict, layout: str) -> ReductionOptions:
    """options with their name followed by the number of layout (the variables' dtypes and
    shapes) among the layouts one optimizer has reduced (numbers, the optimizer's own), in the order
    each first came: one optimizer applied to two models' variables reduces each set under its own
    names. Every rank runs the same code and numbers alike. A name made from the layout itself
    would differ between ranks whose models differ, and each would wait for names the others never
    submit; under the same names the core reports the difference on every rank (a mismatch)."""
    return dataclasses.replace(options, name=f"{options.name}.{numbers.setdefault(layout, len(numbers))}")


def local_layer_variables(local_layers):
    """The trainable variables of Horovod's local_layers argument (a layer, a list of them, or None).

    Raises:
        ValueError: an entry is not a Keras layer.
    """
    if local_layers is None:
        local_layers = []
    elif not isinstance(local_layers, (list, tuple)):
        local_layers = [local_layers]
    variables = []
    for layer in local_layers:
        if not hasattr(layer, "trainable_weights"):
            raise HoroInvalidArgument(f"local_layers must hold Keras layers (keras.layers.Layer), got {layer!r}")
        variables.extend(layer.trainable_weights)
    return variables


def groups_option(groups, num_groups, stacklevel=3):
    """The groups option given Horovod's deprecated num_groups (which warns, as Horovod's does, at
    the caller stacklevel frames up)."""
    if num_groups:
        warnings.warn("Parameter `num_groups` has been replaced by `groups`.", DeprecationWarning,
                      stacklevel=stacklevel)
    return groups if groups is not None else (num_groups or None)


def reduction_options(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups, process_set,
                      name):
    """ReductionOptions from Horovod's keyword arguments (num_groups: the deprecated form of groups)."""
    return ReductionOptions(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                            gradient_predivide_factor=gradient_predivide_factor,
                            groups=groups_option(groups, num_groups, stacklevel=4), process_set=process_set,
                            name=name)


def reduce_gradients_keeping_local(grads: Sequence, options: ReductionOptions, variables: Sequence,
                                   local_ids, scale_local_gradients: bool) -> list:
    """reduce_gradients for every gradient whose variable is not local; a local variable's gradient
    stays this rank's own, divided by the process set's size when scale_local_gradients (Horovod's
    rule for register_local_source / register_local_var).

    Args:
        grads: tensors, IndexedSlices or None, one per variable.
        options: a ReductionOptions.
        variables: the variables of grads.
        local_ids: ids (``id(variable)``) of the local variables.
        scale_local_gradients: divide local gradients by the process set's size.
    Returns:
        A list of gradients in grads' order.
    """
    return keep_local_gradients(grads, variables, local_ids, scale_local_gradients, options.process_set,
                                lambda shared, their_variables: reduce_gradients(shared, options, their_variables))


def keep_local_gradients(grads: Sequence, variables: Sequence, local_ids, scale_local_gradients: bool,
                         process_set: ProcessSet, reduce) -> list:
    """reduce_gradients_keeping_local with the reduction given: ``reduce(grads, variables)`` gets
    the gradients of the variables that are not local and returns them reduced, in their order."""
    grads, variables = list(grads), list(variables)
    is_local = [id(v) in local_ids for v in variables]
    shared = [i for i, local in enumerate(is_local) if not local]
    out = list(grads)
    for i, g in zip(shared, reduce([grads[i] for i in shared], [variables[i] for i in shared])):
        out[i] = g
    ps = process_set
    if scale_local_gradients and any(is_local) and ps.included() and ps.size() > 1:
        for i, local in enumerate(is_local):
            if local and out[i] is not None:
                out[i] = _scale(out[i], 1.0 / ps.size())
    return out


def _scale(grad, factor):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices, grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)
