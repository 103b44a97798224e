"""Horovod's ``LocalGradientAggregationHelper``: sums gradients locally over
``backward_passes_per_step`` passes and reduces the sums across the ranks on every Nth pass only.

``compute_gradients(grads, vars)`` adds the pass's gradients to this rank's running sums; on every
Nth pass it reduces the sums with the ``allreduce_func(grads, vars)`` it was given (divided by N
first when ``average_aggregated_gradients``), clears them and returns the reduced gradients. On the
other passes it returns the running sums, which ``apply_gradients`` does not apply:
``apply_gradients(apply_grads_closure, optimizer, grads_and_vars, ...)`` runs the closure only on
the passes that reduced; on the others it advances ``optimizer.iterations`` (when the optimizer has
one) and the ``global_step`` keyword argument (when given), as Horovod's helper does.

It works in a TF1 graph, inside a ``tf.function`` and eagerly, so one class serves both of
Horovod's (``LocalGradientAggregationHelperEager`` is the same helper with the eager constructor).
The sums and the pass count live in local variables, made once per set of variables and graph:
``local_variables_initializer()`` (which MonitoredTrainingSession runs) initializes them in a TF1
graph, and checkpoints neither hold nor need them. TF1's ``DistributedOptimizer`` aggregates with
this helper.
"""
import weakref

import tensorflow as tf

from horo_core.errors import HoroInvalidArgument
from horo_core.process_sets import global_process_set
from horo_tf import _chain
from horo_tf.gradient_reduction import keep_local_gradients


def _state_graph():
    """The graph that state variables are made in: the TF1 graph, or None when they are made eagerly
    (also while a tf.function traces, which may trace again: the state must outlive the trace)."""
    with tf.init_scope():
        return None if tf.executing_eagerly() else weakref.ref(tf.compat.v1.get_default_graph())


def local_variable(initial_value, name, use_resource=True):
    """A variable of an optimizer's own state: untrainable and local (initialized by
    ``local_variables_initializer()``, which MonitoredTrainingSession runs; neither saved in
    checkpoints nor broadcast), as Horovod keeps its aggregation state. A resource variable unless
    told otherwise: a TF1 reference variable's read shares its buffer, which a later assignment
    (clearing the sums) would change under the reader."""
    return tf.compat.v1.Variable(initial_value, trainable=False, name=name, use_resource=use_resource,
                                 collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])


class State:
    """What an optimizer keeps for one set of variables, in one graph (or made eagerly)."""

    def __init__(self, variables):
        self.graph = _state_graph()
        self.variables = {id(v) for v in variables}


def find_state(states, variables, exact=True):
    """The last of states made in the current graph (or eagerly) for exactly variables, or (not
    exact) for variables among others: apply_gradients may get the pairs without their Nones."""
    graph = _state_graph()
    ids = {id(v) for v in variables}
    return next((a for a in reversed(states)
                 if a.graph == graph and (ids == a.variables if exact else ids <= a.variables)), None)


class _Sums(State):
    """The local gradient sums and the pass count of one set of variables."""

    def __init__(self, grads, variables, name):
        super().__init__(variables)
        with tf.init_scope():
            self.count = local_variable(tf.constant(0, tf.int64), f"{name}_passes")
            self.sums = [None if g is None else local_variable(tf.zeros(v.shape, g.dtype), f"{name}_sum_{i}")
                         for i, (g, v) in enumerate(zip(grads, variables))]


class LocalGradientAggregationHelper:
    """Aggregates gradients locally and reduces them every backward_passes_per_step passes (see the
    module's docstring).

    Args:
        backward_passes_per_step: N, the passes summed before a reduction (at least 1).
        allreduce_func: ``f(grads, vars)`` returning the reduced grads, a list in their order. It
            gets the variables that are not local (register_local_var) and their sums, None where a
            variable has no gradient, as Horovod's eager helper passes them: reducing a None as the
            other ranks' gradient keeps ranks whose missing gradients differ in step.
        sparse_as_dense: densify IndexedSlices; without it an IndexedSlices is refused, as in
            Horovod, since sums of sparse gradients are not kept.
        average_aggregated_gradients: divide the sums by N before reducing them.
        rank, optimizer_type: accepted for Horovod's signature; this helper makes its state the same
            way for every optimizer.
        process_set: the ranks reducing; a local variable's gradient is divided by its size when
            scale_local_gradients.
        scale_local_gradients: as above.
        name: the prefix of the state variables' names.
    Raises:
        ValueError: backward_passes_per_step below 1.
    """

    _OPTIMIZER_TYPE_KERAS = "optimizer_type_keras"
    _OPTIMIZER_TYPE_LEGACY = "optimizer_type_legacy"

    def __init__(self, backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                 rank, optimizer_type, process_set=global_process_set, scale_local_gradients=True, name=""):
        if backward_passes_per_step < 1:
            raise HoroInvalidArgument(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
        self.backward_passes_per_step = backward_passes_per_step
        self.average_aggregated_gradients = average_aggregated_gradients
        self.sparse_as_dense = sparse_as_dense
        self.rank = rank
        self.optimizer_type = optimizer_type
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self.name = name
        self._allreduce_grads = allreduce_func
        self._local_vars = {}
        self._states = []

    def register_local_var(self, var):
        """Marks a variable whose gradient stays this rank's own: not passed to allreduce_func, and
        divided by the process set's size when scale_local_gradients.

        Args:
            var: a variable whose gradients this helper sums.
        """
        self._local_vars[id(var)] = var

    def compute_gradients(self, grads, vars):  # pylint: disable=redefined-builtin  (Horovod's name)
        """Adds grads to this rank's sums; on every Nth pass reduces the sums and clears them.

        Args:
            grads: tensors, IndexedSlices (with sparse_as_dense) or None, one per variable.
            vars: the variables of grads.
        Returns:
            A list in grads' order: the reduced sums on every Nth pass, the running sums on the others
            (None stays None).
        Raises:
            ValueError: an IndexedSlices without sparse_as_dense.
        """
        grads, variables = list(grads), list(vars)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if any(isinstance(g, tf.IndexedSlices) for g in grads):
            raise HoroInvalidArgument("IndexedSlices are not supported when `backward_passes_per_step` > 1 and "
                                      "`sparse_as_dense` is False.")
        present = [i for i, g in enumerate(grads) if g is not None]
        if not present:
            return grads
        state = find_state(self._states, variables)
        if state is None:
            state = _Sums(grads, variables, self.name or "aggregation")
            self._states.append(state)
        with _chain.traced_together():
            chosen = self._add_and_maybe_reduce(state, grads, variables, present)
        out = [None] * len(grads)
        for i, g in zip(present, chosen if isinstance(chosen, (list, tuple)) else [chosen]):
            out[i] = g
        return out

    def _add_and_maybe_reduce(self, state, grads, variables, present):
        added = [total.assign_add(g) for total, g in zip(state.sums, grads) if g is not None]
        # (Made outside the control dependencies: TF1 adds those only to new ops without new inputs.)
        one, zero = tf.constant(1, tf.int64), tf.constant(0, tf.int64)
        with tf.control_dependencies(added):
            passes = state.count.assign_add(one)
        steps = self.backward_passes_per_step

        def communicate():
            summed = [None if total is None else total.read_value() for total in state.sums]
            if self.average_aggregated_gradients:
                summed = [None if s is None else s / tf.cast(steps, s.dtype) for s in summed]
            reduced = keep_local_gradients(summed, variables, self._local_vars, self.scale_local_gradients,
                                           self.process_set, self._allreduce_grads)
            done = [r for r in reduced if r is not None]
            with tf.control_dependencies(done):
                cleared = [total.assign(tf.zeros_like(total)) for total in state.sums if total is not None]
                cleared.append(state.count.assign(zero))
            with tf.control_dependencies(cleared):
                return [tf.identity(reduced[i]) for i in present]

        def keep():
            return [state.sums[i].read_value() for i in present]

        return tf.cond(tf.equal(passes, steps), communicate, keep)

    def apply_gradients(self, apply_grads_closure, optimizer, *args, **kwargs):
        """Runs apply_grads_closure on the passes that reduced; on the others advances
        optimizer.iterations (if it has them) and the global_step keyword argument (if given).

        Args:
            apply_grads_closure: a function of no arguments that applies the gradients.
            optimizer: the optimizer the closure applies with.
            *args: args[0] is the list of (gradient, variable) pairs that compute_gradients' result
                made.
            **kwargs: global_step, if any.
        Returns:
            In a graph, the operation that applies (or skips); None eagerly.
        Raises:
            ValueError: pairs for variables that compute_gradients never summed.
        """
        pairs = list(args[0]) if args else list(kwargs.get("grads_and_vars", ()))
        state = find_state(self._states, [v for g, v in pairs if g is not None], exact=False)
        if state is None:
            raise HoroInvalidArgument("with backward_passes_per_step > 1, apply_gradients takes the gradients that "
                                      "compute_gradients returned, for the same variables")
        global_step = kwargs.get("global_step")

        def apply():
            with tf.control_dependencies(control_inputs(apply_grads_closure())):
                return tf.constant(True)

        def skip():
            advanced = []
            iterations = getattr(optimizer, "iterations", None)
            if iterations is not None:
                advanced.append(iterations.assign_add(1))
            if global_step is not None:
                advanced.append(global_step.assign_add(1))
            with tf.control_dependencies([] if tf.executing_eagerly() else advanced):
                return tf.constant(False)

        with tf.control_dependencies([g for g, _ in pairs if g is not None]):
            applied = tf.cond(tf.equal(state.count.read_value(), 0), apply, skip)
        return None if tf.executing_eagerly() else tf.group(applied)


class LocalGradientAggregationHelperEager(LocalGradientAggregationHelper):
    """LocalGradientAggregationHelper with the constructor of Horovod's eager helper (no rank, no
    optimizer type)."""

    def __init__(self, backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                 process_set=global_process_set, scale_local_gradients=True):
        super().__init__(backward_passes_per_step, allreduce_func, sparse_as_dense, average_aggregated_gradients,
                         rank=None, optimizer_type=None, process_set=process_set,
                         scale_local_gradients=scale_local_gradients)


def control_inputs(result):
    """Control inputs for what an apply returned (an op or a tensor in a graph, None eagerly)."""
    return [] if result is None or tf.executing_eagerly() else [result]
