"""Horovod's TensorFlow API on Horo: ``import horo_tf as hvd``.

Tensors reach Horo's core through NumPy (a view of the host buffer where TensorFlow allows it) and,
inside ``tf.function``, one ``tf.numpy_function`` per collective; nothing here is compiled against
TensorFlow, so one install works with every TensorFlow 2.x. XLA-compiled functions
(``jit_compile=True``) cannot contain these collectives and are rejected with a clear error.
"""
from horo_core import __version__
from horo_core.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                              init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
                              mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
                              start_timeline, stop_timeline, tcp_built)
from horo_core.errors import (HoroError, HoroInternalError, HoroInvalidArgument, HoroMismatchError,
                              HoroNotInitializedError, HoroPeerLostError, HoroShutdownError, HoroTimeoutError,
                              HoroUnsupportedError, HorovodInternalError, HostsUpdatedInterrupt)
from horo_core.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horo_tf.compression import Compression
from horo_tf.functions import allgather_object, broadcast_object, broadcast_object_fn, broadcast_variables
from horo_tf.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from horo_tf.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allreduce, alltoall, broadcast,
                             broadcast_, grouped_allgather, grouped_allreduce, grouped_reducescatter, join,
                             local_rank_op, local_size_op, process_set_included_op, rank_op, reducescatter,
                             size_op)
from horo_tf.sync_batch_norm import SyncBatchNormalization
