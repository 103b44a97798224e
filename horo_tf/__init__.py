"""Horovod's TensorFlow API on Horo: ``import horo_tf as hvd``.

Tensors reach Horo's core through NumPy (a view of the host buffer where TensorFlow allows it) and,
inside ``tf.function``, one ``tf.numpy_function`` per collective; nothing here is compiled against
TensorFlow, so one install works with every TensorFlow 2.x. XLA-compiled functions
(``jit_compile=True``) cannot contain these collectives and are rejected with a clear error; Keras's
``compile(jit_compile="auto")``, which picks XLA where a GPU is visible, resolves to False for a
model whose compiled steps may run a collective (horo_tf/_xla_auto.py).
"""
from horo_core import require_framework as _require_framework

# First: a missing framework is named with what installs it.
_require_framework("tensorflow", "horo_tf", "TensorFlow", "'tensorflow>=2.16' 'keras>=3'")
from horo_core import __version__
from horo_core.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                              gpu_available, init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                              mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
                              start_timeline, stop_timeline, sycl_built, tcp_built)
from horo_core.errors import (HoroError, HoroInternalError, HoroInvalidArgument, HoroMismatchError,
                              HoroNotInitializedError, HoroPeerLostError, HoroShutdownError, HoroTimeoutError,
                              HoroUnsupportedError, HorovodInternalError, HostsUpdatedInterrupt)
from horo_core.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horo_tf.compression import Compression
from horo_tf.functions import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables
from horo_tf.gradient_aggregation import LocalGradientAggregationHelper, LocalGradientAggregationHelperEager
from horo_tf.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from horo_tf.legacy_optimizer import BroadcastGlobalVariablesHook
from horo_tf.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, broadcast,
                             broadcast_, check_num_rank_power_of_2, grouped_allgather, grouped_allreduce,
                             grouped_reducescatter, handle_average_backwards_compatibility, join, local_rank_op,
                             local_size_op, process_set_included_op, rank_op, reducescatter, size_op)
from horo_tf.sync_batch_norm import SyncBatchNormalization
from horo_tf._xla_auto import resolve_auto_xla_off_for_horo as _resolve_auto_xla_off_for_horo

_resolve_auto_xla_off_for_horo()


def DistributedOptimizer(optimizer, name=None, use_locking=False, device_dense="", device_sparse="",
                         compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False,
                         num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True):
    """Horovod's ``horovod.tensorflow.DistributedOptimizer``: for a TF1 optimizer
    (``tf.compat.v1.train.Optimizer``), a TF1 optimizer whose ``compute_gradients`` reduces across
    the ranks (``op=Adasum``: Horovod's delta optimizer; see ``horo_tf.legacy_optimizer``); for a
    Keras optimizer, the same as ``horo_tf.keras.DistributedOptimizer`` (as in Horovod, which
    delegates there).

    Args:
        optimizer: a ``tf.compat.v1.train.Optimizer`` or a Keras 3 optimizer.
        name: the TF1 optimizer's name (default ``Distributed<class>``, ``DistributedDelta<class>``
            with Adasum) or the Keras optimizer's.
        use_locking: the TF1 optimizer's use_locking (unused for Keras).
        backward_passes_per_step: sum this many passes' gradients locally, then reduce and apply.
        Other arguments: as for ``horo_tf.keras.DistributedOptimizer``.
    Returns:
        The distributed optimizer.
    Raises:
        ValueError: optimizer is neither a TF1 nor a Keras optimizer, or invalid options.
    """
    import keras
    import tensorflow as tf

    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        from horo_tf.gradient_reduction import reduction_options
        from horo_tf.legacy_optimizer import distributed_optimizer
        options = reduction_options(compression, sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                    groups, process_set, name or "DistributedOptimizer")
        return distributed_optimizer(optimizer, name, use_locking, options, backward_passes_per_step,
                                     average_aggregated_gradients, scale_local_gradients)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(f"Provided optimizer doesn't inherit from either legacy TensorFlow or Keras optimizer: "
                         f"{optimizer!r}")
    from horo_tf.keras.optimizer import DistributedOptimizer as keras_distributed_optimizer
    return keras_distributed_optimizer(optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
                                       compression=compression, sparse_as_dense=sparse_as_dense,
                                       gradient_predivide_factor=gradient_predivide_factor, op=op,
                                       backward_passes_per_step=backward_passes_per_step,
                                       average_aggregated_gradients=average_aggregated_gradients,
                                       num_groups=num_groups, groups=groups, process_set=process_set,
                                       scale_local_gradients=scale_local_gradients)


def broadcast_global_variables(root_rank):
    """The op that overwrites every TF1 global variable (``tf.compat.v1.global_variables()``) with
    root_rank's value, for ``session.run`` in a TF1 graph.

    Returns:
        A ``tf.group`` of the assignments.
    Raises:
        RuntimeError: when executing eagerly, as in Horovod (TF2 variables are not global variables:
            use ``broadcast_variables(model.variables, root_rank)``).
    """
    import tensorflow as tf

    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. Please use "
                           "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def __getattr__(name):
    from horo_core.errors import missing_attribute
    raise missing_attribute(__name__, name)
