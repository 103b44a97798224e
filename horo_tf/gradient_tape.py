"""``DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` averages across ranks.

Wrap a tape after (or before) recording::

    with tf.GradientTape() as tape:
        loss = ...
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)

The wrapper takes over the recorded tape, so it works eagerly and inside ``tf.function``; all
gradients of one ``gradient()`` call travel as one fused group (or the groups asked for).
"""
import tensorflow as tf

from horo_core.process_sets import global_process_set
from horo_tf import mpi_ops
from horo_tf.compression import Compression
from horo_tf.gradient_reduction import local_layer_variables, reduce_gradients_keeping_local, reduction_options


class _DistributedGradientTape(tf.GradientTape):
    """A GradientTape that reduces the gradients it computes; built by DistributedGradientTape."""

    def __init__(self, tape, options, local_sources=(), scale_local_gradients=True):
        super().__init__(persistent=tape._persistent, watch_accessed_variables=tape._watch_accessed_variables)
        self._tape = tape._tape
        # Only the wrapped tape pushed self._tape on TensorFlow's stack, so only it may pop it (its
        # __exit__, or gradient() below when called inside the with block): a second pop freed
        # the tape twice and crashed the process.
        self._recording = False
        self._wrapped = tape
        self._watched_variables = tape._watched_variables
        self._horo_options = options
        self._local_sources = {id(v): v for v in local_sources}
        self._scale_local_gradients = scale_local_gradients

    def register_local_source(self, source):
        """Marks a variable whose gradient stays local (not reduced; scaled by 1/size when
        scale_local_gradients).

        Args:
            source: a tf.Variable or Keras variable.
        """
        self._local_sources[id(source)] = source

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 unconnected_gradients=tf.UnconnectedGradients.NONE):
        """Computes the gradients of target with respect to sources and reduces them across ranks.

        Args:
            target, sources, output_gradients, unconnected_gradients: as for tf.GradientTape.gradient.
            use_generic_names: accepted for Horovod compatibility (where it names the reductions
                grad_0, grad_1, ... instead of after the variables); Horo's names are its own. An
                UnconnectedGradients value here (tf.GradientTape's fourth argument) is taken as
                unconnected_gradients.
        Returns:
            The reduced gradients, in the structure of sources (a list for a tuple of sources, as
            in Horovod).
        Raises:
            HorovodInternalError: a reduction failed (e.g. ranks have different variables).
        """
        if isinstance(use_generic_names, tf.UnconnectedGradients):  # tf.GradientTape's fourth argument
            unconnected_gradients, use_generic_names = use_generic_names, False
        wrapped = self._wrapped
        # (While this wrapper records itself, e.g. inside jacobian(), the wrapped tape stays pushed.)
        if wrapped is not None and wrapped._recording and wrapped._tape is self._tape and not self._persistent \
                and not self._recording:
            # Called inside the with block: stop recording as a plain tape's gradient() does, so the
            # gradient's own ops are not recorded and the block's end pops nothing more.
            wrapped._pop_tape()
        self._wrapped = None
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_sources = tf.nest.flatten(sources)
        flat_grads = tf.nest.flatten(grads, expand_composites=False)
        out = reduce_gradients_keeping_local(flat_grads, self._horo_options, flat_sources, self._local_sources,
                                             self._scale_local_gradients)
        result = tf.nest.pack_sequence_as(grads, out)
        # Horovod returns a list for a list or tuple of sources; other structures keep their shape.
        return list(result) if isinstance(sources, tuple) else result

    def get_local_and_global_gradients(self, target, sources, output_gradients=None, use_generic_names=False):
        """gradient(), split into the variables registered as local and the others.

        Args:
            target, sources, output_gradients, use_generic_names: as for gradient().
        Returns:
            (local, global): two lists of (variable, gradient) pairs in the order of the flattened
            sources; local gradients are this rank's own (scaled by 1/size when
            scale_local_gradients), global ones are reduced across the ranks.
        Raises:
            HorovodInternalError: a reduction failed.
        """
        grads = self.gradient(target, sources, output_gradients, use_generic_names)
        local, shared = [], []
        for source, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(grads, expand_composites=False)):
            (local if id(source) in self._local_sources else shared).append((source, grad))
        return local, shared


def DistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                            sparse_as_dense=False, op=mpi_ops.Average, gradient_predivide_factor=1.0, num_groups=0,
                            groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Wraps a tf.GradientTape so that gradient() returns gradients reduced across ranks.

    Args:
        gradtape: the tf.GradientTape to wrap (recorded already, or about to be entered).
        device_dense, device_sparse: accepted for Horovod compatibility.
        compression: Compression.none, .fp16 or .bf16.
        sparse_as_dense: reduce IndexedSlices as dense tensors.
        op: Average (default), Sum, Adasum, Min, Max or Product. Adasum combines the ranks'
            gradients as Horovod's tape does (a gradient, not a model delta, per tensor); IndexedSlices
            take Average or Sum only, unless sparse_as_dense.
        gradient_predivide_factor: with Average, divide before the sum by this factor and after
            it by size/factor.
        num_groups: deprecated form of groups=int.
        groups: an int (that many fused groups) or a list of lists of variables (one group each).
        process_set: the ranks taking part.
        scale_local_gradients: scale gradients of registered local sources by 1/size.
    Returns:
        A tape of gradtape's class whose gradient() reduces.
    Raises:
        ValueError: invalid options.
    """
    options = reduction_options(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
                                process_set, "DistributedGradientTape")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    return cls(gradtape, options, scale_local_gradients=scale_local_gradients)


def PartialDistributedGradientTape(gradtape, device_dense="", device_sparse="", compression=Compression.none,
                                   sparse_as_dense=False, op=mpi_ops.Average, gradient_predivide_factor=1.0,
                                   num_groups=0, groups=None, process_set=global_process_set, local_layers=None,
                                   scale_local_gradients=True):
    """A DistributedGradientTape whose local_layers' variables keep local gradients.

    Args:
        local_layers: a Keras layer or a list of them; their trainable weights are not reduced
            (and are scaled by 1/size when scale_local_gradients).
        Other arguments: as for DistributedGradientTape.
    Returns:
        A tape whose gradient() reduces every gradient except those of the local layers.
    Raises:
        ValueError: invalid options or local_layers.
    """
    local_sources = local_layer_variables(local_layers)
    options = reduction_options(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups, groups,
                                process_set, "PartialDistributedGradientTape")
    cls = type(gradtape.__class__.__name__, (_DistributedGradientTape, gradtape.__class__), {})
    return cls(gradtape, options, local_sources=local_sources, scale_local_gradients=scale_local_gradients)
