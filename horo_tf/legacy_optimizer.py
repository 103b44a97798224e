"""Horovod's TF1 training API: ``hvd.DistributedOptimizer`` around a ``tf.compat.v1.train.Optimizer``
and ``hvd.BroadcastGlobalVariablesHook``, for ``session.run`` scripts (``MonitoredTrainingSession``,
``tf.compat.v1.Session``) and for TF1 optimizers used eagerly.

``compute_gradients`` (which ``minimize`` calls) reduces the wrapped optimizer's gradients across
the ranks; ``apply_gradients`` is the wrapped optimizer's. With ``backward_passes_per_step=N`` the
gradients are summed locally in variables, reduced on every Nth pass and applied then; the passes in
between apply nothing but still advance ``global_step``, as Horovod's aggregation does.

``op=Adasum`` builds Horovod's delta optimizer: every rank applies its own gradients, and every
``backward_passes_per_step`` passes the ranks combine how far their variables moved since the last
combination with Adasum and all continue from the combined point. (Horovod 0.28's TF1 delta
optimizer never reaches its combination: its ``apply_gradients`` calls the wrapped optimizer
directly. Horo's combines as described.)

The state these keep (local sums, pass counters, Adasum's start points) lives in local variables, as
Horovod's aggregation state does: ``local_variables_initializer()`` (which MonitoredTrainingSession
runs) initializes it, and checkpoints neither hold nor need it.
"""
import dataclasses

import tensorflow as tf

from horo_core.errors import HoroInvalidArgument
from horo_tf import _chain, mpi_ops
from horo_tf.gradient_aggregation import (LocalGradientAggregationHelper, State, control_inputs, find_state,
                                          local_variable)
from horo_tf.gradient_reduction import for_variable_set, reduce_gradients, reduce_gradients_keeping_local


class _WrappingOptimizer(tf.compat.v1.train.Optimizer):
    """A TF1 optimizer around another: slots and variables are the wrapped one's."""

    def __init__(self, optimizer, name, use_locking, options):
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._options = options
        self._variable_sets = {}  # for_variable_set's numbers

    def _named(self, variables):
        """The reduction options named for these variables (for_variable_set), made unique in a TF1
        graph (every rank builds its graph alike, so the same names come out)."""
        layout = ";".join(f"{v.dtype.base_dtype.name}{tuple(v.shape.as_list())}" for v in variables)
        options = for_variable_set(self._options, self._variable_sets, layout)
        if mpi_ops.in_tf1_graph():
            options = dataclasses.replace(options, name=tf.compat.v1.get_default_graph().unique_name(options.name))
        return options

    def get_slot(self, *args, **kwargs):
        """The wrapped optimizer's get_slot."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args, **kwargs):
        """The wrapped optimizer's get_slot_names."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args, **kwargs):
        """The wrapped optimizer's variables."""
        return self._optimizer.variables(*args, **kwargs)


class _DistributedOptimizer(_WrappingOptimizer):
    """A TF1 optimizer whose compute_gradients reduces across ranks; built by DistributedOptimizer."""

    def __init__(self, optimizer, name, use_locking, options, backward_passes_per_step,
                 average_aggregated_gradients, scale_local_gradients):
        super().__init__(optimizer, name, use_locking, options)
        self._scale_local_gradients = scale_local_gradients
        self._local_vars = {}
        self._aggregation = None
        if backward_passes_per_step > 1:
            self._aggregation = LocalGradientAggregationHelper(
                backward_passes_per_step, self._reduce, options.sparse_as_dense, average_aggregated_gradients,
                rank=None, optimizer_type=LocalGradientAggregationHelper._OPTIMIZER_TYPE_LEGACY,
                process_set=options.process_set, scale_local_gradients=scale_local_gradients, name=self.get_name())

    def register_local_var(self, var):
        """Marks a variable whose gradient stays this rank's own: not reduced, and divided by the
        process set's size when scale_local_gradients (Horovod's register_local_var).

        Args:
            var: a variable this optimizer updates.
        """
        self._local_vars[id(var)] = var
        if self._aggregation is not None:
            self._aggregation.register_local_var(var)

    def _reduce(self, grads, variables):
        return reduce_gradients(grads, self._named(variables), variables)

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's compute_gradients, reduced across the ranks (with
        backward_passes_per_step=N: this rank's running sum, reduced on every Nth pass).

        Args:
            As tf.compat.v1.train.Optimizer.compute_gradients.
        Returns:
            A list of (gradient, variable) pairs.
        Raises:
            ValueError: IndexedSlices with backward_passes_per_step > 1 and not sparse_as_dense.
            HorovodInternalError: a reduction failed.
        """
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if self._aggregation is not None:
            return list(zip(self._aggregation.compute_gradients(grads, variables), variables))
        with _chain.traced_together():
            reduced = reduce_gradients_keeping_local(grads, self._named(variables), variables,
                                                     self._local_vars, self._scale_local_gradients)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """The wrapped optimizer's apply_gradients; with backward_passes_per_step=N only on the passes
        that reduced, the others advancing global_step alone.

        Args:
            grads_and_vars, global_step, name: as for tf.compat.v1.train.Optimizer.apply_gradients.
        Returns:
            The operation that applies the gradients.
        """
        grads_and_vars = list(grads_and_vars)
        if self._aggregation is None:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        return self._aggregation.apply_gradients(
            lambda: self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name),
            self._optimizer, grads_and_vars, global_step=global_step)

class _DeltaState(State):
    """Adasum's start points (where the variables were at the last combination) and pass count."""

    def __init__(self, variables, name):
        super().__init__(variables)
        with tf.init_scope():
            self.count = local_variable(tf.constant(0, tf.int64), f"{name}_passes")
            # Each start is of its variable's kind: a resource variable assigned a TF1 reference
            # variable's value keeps that variable's buffer (and so moves with it) instead of a copy.
            self.starts = [local_variable(tf.zeros(v.shape, v.dtype.base_dtype), f"{name}_start_{i}",
                                           use_resource=hasattr(v, "handle")) for i, v in enumerate(variables)]


class _DistributedAdasumOptimizer(_WrappingOptimizer):
    """Horovod's TF1 delta optimizer (op=Adasum); built by DistributedOptimizer."""

    def __init__(self, optimizer, name, use_locking, options, backward_passes_per_step):
        super().__init__(optimizer, name, use_locking, options)
        self._passes_per_step = backward_passes_per_step
        self._states = []

    def compute_gradients(self, *args, **kwargs):
        """The wrapped optimizer's compute_gradients: this rank's own gradients.

        Returns:
            A list of (gradient, variable) pairs.
        """
        return self._optimizer.compute_gradients(*args, **kwargs)

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        """Applies this rank's gradients with the wrapped optimizer; every backward_passes_per_step
        passes, combines the ranks' moves since the last combination with Adasum.

        Args:
            grads_and_vars, global_step, name: as for tf.compat.v1.train.Optimizer.apply_gradients.
        Returns:
            The operation that applies the gradients (and combines, on those passes).
        Raises:
            HorovodInternalError: the combination failed.
        """
        grads_and_vars = list(grads_and_vars)
        process_set = self._options.process_set
        if not process_set.included() or process_set.size() == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step, name=name)
        variables = [v for g, v in grads_and_vars if g is not None]
        state = find_state(self._states, variables)
        if state is None:
            state = _DeltaState(variables, self.get_name())
            self._states.append(state)

        def remember_start():
            with tf.control_dependencies([s.assign(_read(v)) for s, v in zip(state.starts, variables)]):
                return tf.constant(True)

        started = tf.cond(tf.equal(state.count.read_value(), 0), remember_start, lambda: tf.constant(False))
        # The gradients pass through the start's assignment, so that the update comes after it: a
        # control dependency around apply_gradients reaches only the ops without inputs made under it.
        with tf.control_dependencies([started]):
            gated = [(_identity(g), v) for g, v in grads_and_vars]
        update = self._optimizer.apply_gradients(gated, global_step=global_step, name=name)

        def combine():
            with tf.control_dependencies(control_inputs(update)), _chain.traced_together():
                moves = [_read(v) - s.read_value() for v, s in zip(variables, state.starts)]
                options = self._named(variables)
                combined = mpi_ops.grouped_allreduce(moves, op=mpi_ops.Adasum, compression=options.compression,
                                                     process_set=options.process_set, name=options.name,
                                                     ignore_name_scope=True)
            assigned = []
            for v, s, c in zip(variables, state.starts, combined):
                with tf.control_dependencies([s.assign_add(c)]):
                    assigned.append(v.assign(s.read_value()))
            with tf.control_dependencies(assigned):
                return tf.constant(True)

        with tf.control_dependencies(control_inputs(update)):
            combining = tf.equal(state.count.read_value() % self._passes_per_step, self._passes_per_step - 1)
        combined = tf.cond(combining, combine, lambda: tf.constant(False))
        one = tf.constant(1, tf.int64)
        with tf.control_dependencies([combined]):
            counted = state.count.assign_add(one)
        return None if tf.executing_eagerly() else tf.group(counted)


def _identity(grad):
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(tf.identity(grad.values), tf.identity(grad.indices), grad.dense_shape)
    return tf.identity(grad)


def _read(variable):
    """variable's value, read where this is called: a TF1 reference variable converted to a tensor
    is a snapshot that control dependencies do not order."""
    return variable.read_value() if hasattr(variable, "read_value") else tf.convert_to_tensor(variable)


def distributed_optimizer(optimizer, name, use_locking, options, backward_passes_per_step,
                          average_aggregated_gradients, scale_local_gradients):
    """horo_tf.DistributedOptimizer for a tf.compat.v1.train.Optimizer (see the module's docstring).

    Args:
        optimizer: the tf.compat.v1.train.Optimizer to wrap.
        name: the optimizer's name; None: Distributed<class> (DistributedDelta<class> with Adasum).
        use_locking: the TF1 optimizer's use_locking.
        options: the ReductionOptions (its name is the base of the collectives' names).
        backward_passes_per_step, average_aggregated_gradients, scale_local_gradients: as for
            horo_tf.DistributedOptimizer.
    Returns:
        A tf.compat.v1.train.Optimizer.
    Raises:
        ValueError: backward_passes_per_step below 1; op=Adasum with average_aggregated_gradients.
    """
    if backward_passes_per_step < 1:
        raise HoroInvalidArgument(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
    if options.op == mpi_ops.Adasum:
        if average_aggregated_gradients:
            raise HoroInvalidArgument("Adasum does not support average_aggregated_gradients == True")
        return _DistributedAdasumOptimizer(optimizer, name or f"DistributedDelta{type(optimizer).__name__}",
                                           use_locking, options, backward_passes_per_step)
    return _DistributedOptimizer(optimizer, name or f"Distributed{type(optimizer).__name__}", use_locking, options,
                                 backward_passes_per_step, average_aggregated_gradients, scale_local_gradients)


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """A SessionRunHook that overwrites every global variable with root_rank's value once the session
    exists (after initialization or a restore from a checkpoint), as Horovod's does.

    Args:
        root_rank: the rank whose values every rank takes.
        device: accepted for Horovod compatibility.
    """

    def __init__(self, root_rank, device=""):
        super().__init__()
        self.root_rank = root_rank
        self.device = device
        self.bcast_op = None

    def begin(self):
        """Builds the broadcast in the graph being finalized (again for a new graph)."""
        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            from horo_tf.functions import broadcast_variables
            self.bcast_op = broadcast_variables(tf.compat.v1.global_variables(), self.root_rank)

    def after_create_session(self, session, coord):
        """Runs the broadcast."""
        session.run(self.bcast_op)
