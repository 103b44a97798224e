"""horo_tf as a module: the queries Horovod's scripts make before init, what is refused by name,
the error of a collective before init, and the buffers large results are made in."""
import numpy as np
import pytest

import horo_runner
from tf_checks import CHILD_ENV


def test_build_queries_of_both_modules():
    """Horovod's scripts ask these before init (tensorflow2_keras_synthetic_benchmark.py picks its
    device with sycl_built()); each answers a bool from horo_tf and horo_tf.keras alike."""
    import horo_tf
    import horo_tf.keras
    for name in ("mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built", "ddl_built",
                 "ccl_built", "cuda_built", "rocm_built", "sycl_built", "tcp_built"):
        assert getattr(horo_tf, name) is getattr(horo_tf.keras, name), name
        assert type(getattr(horo_tf, name)()) is bool, name
    assert horo_tf.sycl_built() is False and horo_tf.rocm_built() is False
    # Horovod's hvd.gpu_available(framework): whether that framework sees a GPU (none here).
    import tensorflow as tf
    assert horo_tf.gpu_available("tensorflow") is bool(tf.config.list_physical_devices("GPU"))
    assert horo_tf.gpu_available("mxnet") is False
    # Horovod's helpers that its TensorFlow module exports, and the basics its mpi_ops module does.
    assert [horo_tf.check_num_rank_power_of_2(k) for k in (0, 1, 2, 3, 4, 6, 8)] == [False, True, True, False, True,
                                                                                     False, True]
    assert horo_tf.handle_average_backwards_compatibility(None, None) == horo_tf.Average
    import horo_tf.mpi_ops
    for name in ("init", "shutdown", "is_initialized", "size", "rank", "local_size", "local_rank", "cross_size",
                 "cross_rank", "start_timeline", "stop_timeline", "nccl_built"):
        assert getattr(horo_tf.mpi_ops, name) is getattr(horo_tf, name), name


def _collective_before_init():
    import tensorflow as tf

    import horo_tf as hvd
    try:
        hvd.allreduce(tf.ones([2]), op=hvd.Sum)
    except Exception as e:  # noqa: BLE001 - the type is what is checked
        return [isinstance(e, t) for t in (tf.errors.FailedPreconditionError, ValueError, hvd.HoroNotInitializedError)]
    return "no error"


def test_collective_before_init_is_a_failed_precondition_as_horovods():
    """Horovod's op fails its CheckInitialized with FailedPreconditionError; Horo's error is that
    too, and still the ValueError and HoroNotInitializedError it was (in a fresh process, where
    nothing has called init)."""
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_collective_before_init) == [True, True, True]


def test_elastic_is_refused_by_name():
    """hvd.elastic of horo_tf and horo_tf.keras (not implemented) names what is missing."""
    import horo_tf
    import horo_tf.keras
    for module in (horo_tf, horo_tf.keras):
        with pytest.raises(AttributeError, match=rf"{module.__name__}\.elastic: elastic training .* not implemented"):
            module.elastic.run
        with pytest.raises(ImportError, match=rf"{module.__name__}\.elastic: elastic training .* not implemented"):
            exec(f"from {module.__name__} import elastic", {})


def test_data_service_is_refused_by_name():
    """Horovod's tf.data service modules (not implemented) name what is missing on import."""
    for statement in ("from horo_tf.compute_service import TfDataServiceConfig", "import horo_tf.data",
                      "from horo_tf.data.compute_service import TfDataServiceConfig"):
        with pytest.raises(ImportError, match=r"horo_tf\.(compute_service|data): Horovod's tf.data service .* not "
                                              r"implemented in Horo"):
            exec(statement, {})


def test_large_results_are_allocated_aligned():
    """Results from 64 KiB on are 64-byte aligned, so that TensorFlow takes their buffers as the
    output tensors' instead of copying them; smaller ones are plain arrays. Shape and dtype kept."""
    from horo_tf._bridge import host_empty
    for shape, dtype in (((4,), np.float32), ((512, 512), np.float32), ((3, 70000), np.int8), ((0, 5), np.float64),
                         ((), np.int64), ((128, 128), np.float16)):
        array = host_empty(shape, dtype)
        assert (array.shape, array.dtype, array.flags["C_CONTIGUOUS"], array.flags["WRITEABLE"]) == \
            (shape, np.dtype(dtype), True, True)
        if array.nbytes >= 1 << 16:
            assert array.ctypes.data % 64 == 0, (shape, dtype, array.ctypes.data % 64)


def _results_kept_while_more_are_made():
    import tensorflow as tf

    import horo_tf as hvd
    hvd.init()
    x = tf.fill([512, 512], 1.0)
    eager = [hvd.allreduce(x * float(i), op=hvd.Sum, name="reuse.eager") for i in range(4)]
    traced = tf.function(lambda v: hvd.allreduce(v, op=hvd.Sum, name="reuse.traced"))
    graph = [traced(x * float(i)) for i in range(4)]
    fetched = [traced(x * float(i)).numpy() for i in range(4)]
    return [[float(result[0, 0]), float(result[-1, -1])] for results in (eager, graph, fetched) for result in results]


def test_large_result_buffers_are_reused_only_once_nothing_refers_to_them():
    """Large results come from kept buffers (fresh ones cost a page fault per page, every step).
    A buffer is handed out again only once no array, view or tensor uses it, and a result kept in
    a tensor (eagerly, from a tf.function, or fetched as an array) keeps its values while later
    results are made. Sizes asked for once are not kept, and room under the limit is made from
    free buffers only."""
    from horo_tf._bridge import _ResultBuffers
    mib = 1 << 20
    pool = _ResultBuffers()
    pool.LIMIT = 3 * mib
    for size in range(1000, 1300):  # sizes asked for once are not kept (allgathers of varying rows)
        pool.take(size * 1024)
    assert pool._kept == 0
    held = pool.take(mib)  # the first time: not kept
    second = pool.take(mib)
    address = second.ctypes.data
    assert pool._kept == mib and address != held.ctypes.data
    del second
    third = pool.take(mib)
    assert third.ctypes.data == address
    view = third[3:5]
    del third
    fourth = pool.take(mib)
    assert fourth.ctypes.data != address and pool._kept == 2 * mib  # the view still uses the first
    del view
    again = pool.take(mib)
    assert again.ctypes.data == address
    pool.take(2 * mib)
    assert pool.take(2 * mib) is not None and pool._kept == 2 * mib  # no room: both 1 MiB ones in use
    del fourth
    kept_2mib = pool.take(2 * mib)  # room made by dropping the free 1 MiB buffer
    assert pool._kept == 3 * mib and kept_2mib.ctypes.data in {b.ctypes.data for b in pool._by_size[2 * mib][0]}
    many = [pool.take(2 * mib) for _ in range(3 * pool.PROBES)]  # all held: each take looks at PROBES at most
    assert len({m.ctypes.data for m in many}) == len(many)

    for values in horo_runner.run(_results_kept_while_more_are_made, num_proc=2, env=CHILD_ENV):
        assert values == [[2.0 * i] * 2 for i in range(4)] * 3, values
