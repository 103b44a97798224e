"""``DistributedOptimizer`` for Keras 3 (TensorFlow backend).

Keras 3 trains with ``optimizer.apply_gradients`` -> ``optimizer.apply(grads, variables)`` (its
``train_step`` computes the gradients with a plain ``tf.GradientTape``). The distributed optimizer
is a subclass of the wrapped optimizer's class, created from its config as Horovod does, whose
``apply`` reduces the gradients across ranks before the wrapped class applies them; so clipping,
weight decay, loss scaling and EMA all run on the averaged gradients, and ``isinstance`` checks,
``get_config`` and saving behave as for the wrapped class (a saved model reloads as the plain
optimizer; ``horo_tf.keras.load_model`` wraps it again).

``backward_passes_per_step=N`` sums N local gradients and communicates and updates once every N
calls, as Horovod's local gradient aggregation does. Unlike Horovod, ``iterations`` counts updates,
not passes: Adam's bias correction and learning-rate schedules then see what one process training
on the N batches at once would see. A wrapped
optimizer with Keras's own ``gradient_accumulation_steps`` also works: every micro-step's gradients
are averaged across ranks before Keras accumulates them.

Mixed precision (``mixed_float16``) works in either order. Wrapping the loss-scale optimizer::

    opt = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))

averages the gradients before the ``LossScaleOptimizer`` checks them; a non-finite value on any
rank stays non-finite through the sum, so every rank skips the same steps and lowers its scale
identically (``compile`` sees a ``LossScaleOptimizer`` and does not wrap it again). The other
order, ``LossScaleOptimizer(DistributedOptimizer(opt))``, is what ``compile`` builds by itself
from a plain DistributedOptimizer under ``mixed_float16`` (Horovod's scripts do this). There the
``LossScaleOptimizer`` checks each rank's own gradients, so its check is made to agree across the
ranks (one more small allreduce per step): a non-finite gradient on any rank skips the step on all.
"""
import copy
import dataclasses
import re
import sys

import keras
import tensorflow as tf

from horo_core.errors import HoroInvalidArgument
from horo_core.process_sets import global_process_set
from horo_core.reduce_ops import name_of
from horo_tf import mpi_ops
from horo_tf.compression import Compression
from horo_tf.gradient_reduction import (ReductionOptions, for_variable_set, groups_option, local_layer_variables,
                                        reduce_gradients_keeping_local)


class _AccumulationState:
    """Local gradient sums and the count of passes since the last update (plain tf.Variables, kept
    out of the optimizer's tracked variables so that saved models stay loadable without Horo)."""

    def __init__(self, variables, name):
        with tf.init_scope():
            self.count = tf.Variable(0, dtype=tf.int64, trainable=False, name=f"{name}_passes")
            self.sums = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name=f"{name}_sum_{i}")
                         for i, v in enumerate(variables)]
            self.keys = [id(v) for v in variables]


def _wrapping_loss_scale_optimizer(inner, depth=6):
    """The LossScaleOptimizer among the nearest callers whose inner_optimizer is inner, or None.

    Keras gives an inner optimizer no reference to its wrapper, and LossScaleOptimizer.build is the
    one place that calls the inner build, so the callers' frames are where the wrapper shows.
    """
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        caller = frame.f_locals.get("self")
        if isinstance(caller, keras.optimizers.LossScaleOptimizer) and caller.inner_optimizer is inner:
            return caller
        frame = frame.f_back
    return None


def _snake_case(class_name):
    """What Keras names an instance of class_name before numbering it (Adam: adam, AdamW: adam_w)."""
    try:
        from keras.src.utils.naming import to_snake_case
    except ImportError:  # a Keras that moved it: its single-word names still match
        return class_name.lower()
    return to_snake_case(class_name)


class _DistributedMixin:
    """What the distributed optimizer adds to the wrapped class; options live on the class."""

    _horo_reduction = ReductionOptions()
    _horo_backward_passes_per_step = 1
    _horo_average_aggregated_gradients = False
    _horo_scale_local_gradients = True

    def register_local_var(self, var):
        """Marks a variable whose gradient stays this rank's own: not reduced, and divided by the
        process set's size when scale_local_gradients (as Horovod's register_local_var).

        Args:
            var: a model variable this optimizer updates.
        """
        # Kept out of Keras's attribute tracking, so that the optimizer's saved state is unchanged.
        local = self.__dict__.get("_horo_local_vars")
        if local is None:
            local = {}
            object.__setattr__(self, "_horo_local_vars", local)
        local[id(var)] = var

    def _horo_reduce(self, grads, variables):
        return reduce_gradients_keeping_local(grads, self._horo_named_options(variables), variables,
                                              self.__dict__.get("_horo_local_vars") or {},
                                              self._horo_scale_local_gradients)

    def _horo_named_options(self, variables):
        """The reduction options, their operation names made for these variables: the base name
        (_horo_base_options) and the number of their set (for_variable_set)."""
        numbers = self.__dict__.get("_horo_variable_sets")
        if numbers is None:  # kept out of Keras's attribute tracking, as _horo_local_vars
            numbers = {}
            object.__setattr__(self, "_horo_variable_sets", numbers)
        layout = ";".join(f"{v.dtype}{tuple(v.shape)}" for v in variables)
        return for_variable_set(self._horo_base_options(), numbers, layout)

    def _horo_base_options(self):
        """The reduction options named "DistributedOptimizer." and the optimizer's Keras name where
        someone chose it (DistributedOptimizer's name argument, or the wrapped optimizer's own),
        else the class name. A chosen name is saved with the model, so a rank that restores the
        model with load_model names its reductions as the ranks that build their optimizer do.
        Keras's own names (adam, adam_1, ...; of this class or of one it derives from, whose config
        it was made from) count the optimizers each process made before, so they would differ
        between ranks: the class name stands for them."""
        cached = self.__dict__.get("_horo_base")  # (Keras name, options): 12 us saved per eager apply
        if cached is not None and cached[0] == self.name:
            return cached[1]
        cls = type(self)
        made_up = any(re.fullmatch(rf"{re.escape(_snake_case(c.__name__))}(_\d+)?", self.name or "")
                      for c in cls.__mro__)
        options = dataclasses.replace(self._horo_reduction,
                                      name=f"DistributedOptimizer.{cls.__name__ if made_up else self.name}")
        object.__setattr__(self, "_horo_base", (self.name, options))  # kept out of Keras's tracking
        return options

    def build(self, variables):
        """Builds the wrapped optimizer; a LossScaleOptimizer that wraps this one (as model.compile
        does by itself under the mixed_float16 policy) is made to decide with every rank whether
        the gradients are finite (LossScaleOptimizer.build is what builds its inner optimizer)."""
        wrapper = _wrapping_loss_scale_optimizer(self)
        if wrapper is not None:
            _agree_on_finite_gradients(wrapper, self._horo_base_options())
        return super().build(variables)

    def apply(self, grads, trainable_variables=None):
        """Reduces grads across ranks (every backward_passes_per_step calls), then applies them.

        Args:
            grads: gradients (tensors, IndexedSlices or None), one per variable.
            trainable_variables: the variables; None once the optimizer is built.
        Raises:
            HorovodInternalError: a reduction failed.
        """
        grads = list(grads)
        if not grads:
            return
        variables = self._horo_variables(trainable_variables)
        if self._horo_backward_passes_per_step == 1:
            return super().apply(self._horo_reduce(grads, variables), trainable_variables)
        return self._horo_accumulate(grads, variables)

    def _horo_variables(self, trainable_variables):
        if trainable_variables is not None:
            return list(trainable_variables)
        if not self.built:
            raise ValueError("When passing `grads` without `variables`, the optimizer must already be built on a "
                             "list of variables. Call `optimizer.build(trainable_variables)` first.")
        return list(self._trainable_variables)

    def _horo_accumulate(self, grads, variables):
        if not self.built:
            self.build(variables)
        state = self.__dict__.get("_horo_state")
        if state is None or state.keys != [id(v) for v in variables]:
            state = _AccumulationState(variables, self.name)
            object.__setattr__(self, "_horo_state", state)
        for total, grad in zip(state.sums, grads):
            if grad is not None:
                total.assign_add(tf.convert_to_tensor(grad))
        passes = state.count.assign_add(1)
        steps = self._horo_backward_passes_per_step
        wrapped_apply = super().apply

        def update():
            summed = [None if g is None else total.read_value() for total, g in zip(state.sums, grads)]
            if self._horo_average_aggregated_gradients:
                summed = [None if s is None else s / tf.cast(steps, s.dtype) for s in summed]
            wrapped_apply(self._horo_reduce(summed, variables), variables)
            for total in state.sums:
                total.assign(tf.zeros_like(total))
            state.count.assign(0)
            return tf.constant(True)

        tf.cond(passes >= steps, update, lambda: tf.constant(False))


def _agree_on_finite_gradients(wrapper, options):
    """Makes wrapper, a LossScaleOptimizer around a DistributedOptimizer, skip a step on every rank
    when any rank's gradients are not finite. It checks each rank's gradients before they are
    averaged, so alone it would skip the step, and the averaging, on some ranks only; Horovod's
    optimizer under Keras 2 averaged them before the check. The ranks now agree through one more
    allreduce (Min of the local answers) per step; the dynamic scale then moves alike everywhere."""
    from horo_tf import mpi_ops

    if wrapper.__dict__.get("_horo_agrees_on_finite"):
        return
    local_check = wrapper.check_finite
    process_set = options.process_set

    def check_finite(grads):
        finite = local_check(grads)
        if not process_set.included() or process_set.size() == 1:
            return finite
        every = mpi_ops.allreduce(tf.cast(finite, tf.int32), op=mpi_ops.Min, name=f"{options.name}.finite",
                                  process_set=process_set)
        return tf.equal(every, 1)

    # Past Keras's attribute tracking: the saved optimizer stays the plain LossScaleOptimizer.
    object.__setattr__(wrapper, "check_finite", check_finite)
    object.__setattr__(wrapper, "_horo_agrees_on_finite", True)


def distributed_class(optimizer_class, options, backward_passes_per_step=1, average_aggregated_gradients=False,
                      scale_local_gradients=True):
    """The distributed subclass of a Keras optimizer class, with the given reduction options.

    Args:
        optimizer_class: a keras.optimizers.Optimizer subclass.
        options: a ReductionOptions.
        backward_passes_per_step: local passes per communication.
        average_aggregated_gradients: divide the summed passes by backward_passes_per_step.
        scale_local_gradients: divide the gradients of registered local variables by size.
    Returns:
        A class named like optimizer_class, constructible from its config.
    """
    attributes = {
        "_horo_reduction": options,
        "_horo_backward_passes_per_step": int(backward_passes_per_step),
        "_horo_average_aggregated_gradients": bool(average_aggregated_gradients),
        "_horo_scale_local_gradients": bool(scale_local_gradients),
        "__module__": optimizer_class.__module__,
        "__doc__": optimizer_class.__doc__,
    }
    cls = type(optimizer_class.__name__, (_DistributedMixin, optimizer_class), attributes)
    cls.__qualname__ = optimizer_class.__qualname__
    _save_under_name_of(cls, optimizer_class)
    return cls


def _save_under_name_of(cls, optimizer_class):
    """Makes a model saved with cls name optimizer_class's registration ("package>Name"), so that
    it loads without Horo. Keras looks a class's registered name up by the class object, and a
    subclass made by type() has none: the file then said "Name", which no loader finds. Only that
    lookup is added; loading "package>Name" still builds the user's class."""
    registered = keras.saving.get_registered_name(optimizer_class)
    if registered == optimizer_class.__name__:
        return
    try:
        from keras.src.saving import object_registration
    except ImportError:  # a Keras that moved its registry: the saved name stays the class name
        return
    object_registration.GLOBAL_CUSTOM_NAMES[cls] = registered


def DistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="", compression=Compression.none,
                         sparse_as_dense=False, gradient_predivide_factor=1.0, op=mpi_ops.Average,
                         backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """Returns a copy of a Keras optimizer that averages gradients across ranks before applying them.

    Args:
        optimizer: a keras.optimizers.Optimizer (its state, if already built, is not copied).
        name: the new optimizer's name (default: optimizer's), which also names its collectives
            (as does a name the wrapped optimizer was given; else its class name, the same on
            every rank whatever other optimizers a rank made first); give every rank the same.
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: Compression.none (default), .fp16 or .bf16.
        sparse_as_dense: reduce IndexedSlices gradients as dense tensors.
        gradient_predivide_factor: with Average, divide before the sum by this factor and after it
            by size/factor.
        op: Average (default) or Sum.
        backward_passes_per_step: calls of apply per communication and update; the gradients of
            the calls in between are summed locally.
        average_aggregated_gradients: divide those sums by backward_passes_per_step.
        num_groups: deprecated form of groups=int.
        groups: an int (that many fused groups) or a list of lists of variables (one group each).
        process_set: the ranks taking part (default: all).
        scale_local_gradients: divide the gradients of variables given to register_local_var
            (which are not reduced) by the process set's size.
    Returns:
        An optimizer of optimizer's class (a subclass of it).
    Raises:
        ValueError: invalid options, optimizer is not a Keras 3 optimizer, or Keras runs on a
            backend other than TensorFlow.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise HoroInvalidArgument(f"DistributedOptimizer wraps a keras.optimizers.Optimizer, got "
                                  f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedMixin):
        raise HoroInvalidArgument("the optimizer is already a DistributedOptimizer")
    cls = distributed_class_of(type(optimizer), compression, sparse_as_dense, gradient_predivide_factor, op,
                               backward_passes_per_step, average_aggregated_gradients, num_groups, groups,
                               process_set, scale_local_gradients)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    distributed = cls.from_config(config)
    _keep_weight_decay_exclusions(optimizer, distributed)
    return distributed


def distributed_class_of(optimizer_class, compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=mpi_ops.Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set, scale_local_gradients=True):
    """The distributed subclass of optimizer_class with DistributedOptimizer's options (which see),
    validated.

    Raises:
        ValueError: invalid options, or Keras runs on a backend other than TensorFlow.
    """
    backend = keras.backend.backend()
    if backend != "tensorflow":
        # Another backend's optimizer gets its gradients as that backend's tensors, which the
        # TensorFlow collectives would hand back as TensorFlow tensors it cannot apply.
        raise HoroInvalidArgument(f"horo_tf.keras's DistributedOptimizer reduces gradients with TensorFlow, but "
                                  f"Keras runs on its {backend!r} backend (KERAS_BACKEND); set "
                                  f"KERAS_BACKEND=tensorflow, or train in PyTorch with horo_torch")
    if int(backward_passes_per_step) < 1:
        raise HoroInvalidArgument(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
    op = mpi_ops.Average if op is None else op
    if op not in (mpi_ops.Average, mpi_ops.Sum):
        # As Horovod's Keras optimizer; DistributedGradientTape takes the other ops.
        raise HoroInvalidArgument(f"the Keras DistributedOptimizer reduces gradients with op=Average or op=Sum, "
                                  f"got op={name_of(op)}; DistributedGradientTape takes Adasum, Min, Max and "
                                  f"Product")
    options = ReductionOptions(op=op,
                               compression=compression or Compression.none, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor,
                               groups=groups_option(groups, num_groups),
                               process_set=process_set or global_process_set)
    return distributed_class(optimizer_class, options, backward_passes_per_step, average_aggregated_gradients,
                             scale_local_gradients)


def _keep_weight_decay_exclusions(source, target):
    """What exclude_from_weight_decay() set is no part of an optimizer's config, so an optimizer
    rebuilt from it would decay those variables too; also the inner optimizer's of a
    LossScaleOptimizer, whose config holds the inner one's."""
    for attribute in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
        if getattr(source, attribute, None):
            setattr(target, attribute, copy.copy(getattr(source, attribute)))
    inner, rebuilt = getattr(source, "inner_optimizer", None), getattr(target, "inner_optimizer", None)
    if inner is not None and rebuilt is not None:
        _keep_weight_decay_exclusions(inner, rebuilt)


def PartialDistributedOptimizer(optimizer, name=None, device_dense="", device_sparse="",
                                compression=Compression.none, sparse_as_dense=False, gradient_predivide_factor=1.0,
                                op=mpi_ops.Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                                groups=None, process_set=global_process_set, local_layers=None,
                                scale_local_gradients=True):
    """A DistributedOptimizer whose local_layers' variables keep local gradients (horovod.keras's).

    Args:
        local_layers: a Keras layer or a list of them; their trainable weights are registered with
            register_local_var.
        Other arguments: as for DistributedOptimizer.
    Returns:
        An optimizer of optimizer's class.
    Raises:
        ValueError: invalid options or local_layers.
    """
    local_variables = local_layer_variables(local_layers)
    distributed = DistributedOptimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                                       compression=compression, sparse_as_dense=sparse_as_dense,
                                       gradient_predivide_factor=gradient_predivide_factor, op=op,
                                       backward_passes_per_step=backward_passes_per_step,
                                       average_aggregated_gradients=average_aggregated_gradients, groups=groups,
                                       process_set=process_set, scale_local_gradients=scale_local_gradients)
    for var in local_variables:
        distributed.register_local_var(var)
    return distributed


def _uses_horo(optimizer):
    """Whether optimizer is a distributed optimizer, or a LossScaleOptimizer around one."""
    for _ in range(4):
        if isinstance(optimizer, _DistributedMixin):
            return True
        optimizer = getattr(optimizer, "inner_optimizer", None)
        if optimizer is None:
            return False
    return False
