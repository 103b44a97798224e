"""``SyncBatchNormalization``: Keras batch normalisation whose training statistics cover the
batches of every rank.

Keras's ``BatchNormalization.call`` casts the input to float32 (or keeps float64), asks
``_moments(inputs, mask)`` for the batch mean and variance, updates the moving statistics from them
and normalises. This subclass replaces only ``_moments``; inference, renorm, masks and the
moving-statistics update are Keras's own and see the global statistics.

Each rank computes, per channel, its count n_r (elements, or mask weights), mean m_r and sum of
squared deviations M2_r. Each rank writes its row ``[n_r, m_r, M2_r]`` into row r of an
otherwise zero (size x 3C) matrix; one summed allreduce of that matrix gives every rank every row
(an allgather through an allreduce, which also works while other ranks have joined: they add
zeros, so count for nothing), and Chan's parallel formula combines the rows in float64:

    n = sum(n_r)    mean = sum(n_r * m_r) / n    M2 = sum(M2_r + n_r * (m_r - mean)^2)

and the variance is M2 / n (biased, as Keras uses it). Ranks may have different batch sizes (an
empty batch counts for nothing). Deviations from the local mean keep the precision of the two-pass
formula, where E[x^2] - E[x]^2 would cancel.

The allreduce is a horo_tf op, so gradients flow through it: its gradient is the summed allreduce
of every rank's gradient of the matrix, of which each rank keeps its own row; a rank's gradient is
then the derivative of the sum of every rank's loss with respect to its inputs and weights.

Every rank must run the same SyncBatchNormalization layers in training mode in the same order
(ranks match the collective by the layer's path). Keras 3's own ``synchronized=True`` goes through
``tf.distribute`` and is not used.
"""
import keras
import tensorflow as tf

from horo_core import basics
from horo_tf import mpi_ops


@keras.saving.register_keras_serializable(package="horo_tf")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalisation whose training-mode statistics are those of the global batch (every
    rank's batch together); inference mode uses the moving statistics, as BatchNormalization.

    Args:
        fused: must be False (Horovod's signature; there is no fused kernel).
        **kwargs: keras.layers.BatchNormalization's arguments (axis, momentum, epsilon, center,
            scale, initializers, regularizers, constraints, renorm..., name, dtype).
    Raises:
        ValueError: fused is True or None, or synchronized=True is passed.
    """

    def __init__(self, fused=False, **kwargs):
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization synchronizes its statistics through Horo; synchronized=True "
                             "(tf.distribute's synchronization) does not apply to it")
        super().__init__(**kwargs)
        # Its statistics travel through a tf.numpy_function, which XLA cannot compile: Keras then
        # resolves compile(jit_compile="auto") to False for a model holding it.
        self.supports_jit = False

    def _moments(self, inputs, mask):
        """The mean and variance per channel over every rank's batch (inputs and mask as Keras
        passes them: inputs already in float32 or float64)."""
        if basics.size() == 1:
            return super()._moments(inputs, mask)
        channels = inputs.shape[self.axis]
        axes = self._reduction_axes
        stats_shape = [1] * len(inputs.shape)
        stats_shape[self.axis] = channels
        if mask is None:
            selected = None
            per_channel = tf.size(inputs, out_type=tf.int64) // tf.cast(channels, tf.int64)
            count = tf.fill([channels], tf.cast(per_channel, inputs.dtype))
            total = tf.reduce_sum(inputs, axes)
        else:
            selected = tf.broadcast_to(tf.expand_dims(tf.cast(mask, tf.bool), -1), tf.shape(inputs))
            count = tf.reduce_sum(tf.cast(selected, inputs.dtype), axes)
            total = tf.reduce_sum(tf.where(selected, inputs, tf.zeros_like(inputs)), axes)
        mean = tf.math.divide_no_nan(total, count)
        squares = tf.square(inputs - tf.reshape(mean, stats_shape))
        if selected is not None:
            squares = tf.where(selected, squares, tf.zeros_like(squares))
        m2 = tf.reduce_sum(squares, axes)

        row = tf.cast(tf.concat([tf.stop_gradient(count), mean, m2], 0), tf.float64)
        placed = tf.one_hot(basics.rank(), basics.size(), dtype=tf.float64)[:, tf.newaxis] * row[tf.newaxis]
        rows = mpi_ops.allreduce(placed, op=mpi_ops.Sum, name=f"SyncBatchNormalization.{self.path or self.name}",
                                 ignore_name_scope=True)
        counts, means, m2s = rows[:, :channels], rows[:, channels:2 * channels], rows[:, 2 * channels:]
        n = tf.reduce_sum(counts, 0)
        if mask is not None:
            n += keras.backend.epsilon()  # as BatchNormalization divides a masked batch's sums
        global_mean = tf.reduce_sum(counts * means, 0) / n
        global_m2 = tf.reduce_sum(m2s + counts * tf.square(means - global_mean), 0)
        return tf.cast(global_mean, inputs.dtype), tf.cast(global_m2 / n, inputs.dtype)
