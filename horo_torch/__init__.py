"""Horovod's PyTorch API on Horo: ``import horo_torch as hvd``.

Tensors are handed to Horo's core as (pointer, dtype, shape); nothing here is compiled against
PyTorch, so one install works with every PyTorch from 2.3 on.
"""
from horo_core import require_framework as _require_framework

# First: a missing framework is named with what installs it.
_require_framework("torch", "horo_torch", "PyTorch", "'torch>=2.3'")
from horo_core import __version__
from horo_core.basics import (ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
                              gpu_available, init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                              mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
                              start_timeline, stop_timeline, sycl_built, tcp_built)
from horo_core.errors import (HoroError, HoroInternalError, HoroInvalidArgument, HoroMismatchError,
                              HoroNotInitializedError, HoroPeerLostError, HoroShutdownError, HoroTimeoutError,
                              HorovodInternalError, HostsUpdatedInterrupt)
from horo_core.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from horo_torch.compression import Compression
from horo_torch.mpi_ops import (Adasum, Average, Max, Min, Product, Sum, allgather, allgather_async, allreduce,
                                allreduce_, allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier,
                                broadcast, broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                                grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                                grouped_allreduce_async, grouped_allreduce_async_, grouped_reducescatter,
                                grouped_reducescatter_async, join, poll, reducescatter, reducescatter_async,
                                synchronize)
from horo_torch.functions import (allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters,
                                  sparse_allreduce_async)
from horo_torch.optimizer import DistributedOptimizer
from horo_torch.ddp import DistributedDataParallel
from horo_torch.sync_batch_norm import SyncBatchNorm


def __getattr__(name):
    from horo_core.errors import missing_attribute
    raise missing_attribute(__name__, name)
