"""Collectives on NumPy arrays over a ``Runtime``: the framework-free way to drive the core, used by
the loopback tests and by adapters that hold host memory.

bfloat16 has no NumPy dtype: pass its bits as a uint16 array together with ``dtype=BFLOAT16``.
"""
import numpy as np

from horo_core import dtypes
from horo_core._binding import lib
from horo_core.runtime import TensorSpec


def dtype_code(array, dtype=None):
    if dtype is not None:
        return dtype
    try:
        return dtypes.NUMPY_NAMES[array.dtype.name]
    except KeyError:
        raise ValueError(f"dtype {array.dtype} is not supported by Horo") from None


def _spec(name, array, out, dtype):
    if not array.flags.c_contiguous:
        raise ValueError(f"tensor '{name}' must be C-contiguous")
    return TensorSpec(name, array.ctypes.data, 0 if out is None else out.ctypes.data, dtype_code(array, dtype),
                      tuple(array.shape))


def _run(rt, op, specs, read=None, **options):
    """Enqueues, waits, and returns read(rt, results) (or the results), reading core-owned
    result memory before the handles are released."""
    handles = rt.enqueue(op, specs, **options)
    try:
        results = []
        for h in handles:
            rt.wait(h)
            results.append(rt.result(h))
        return read(rt, results) if read is not None else results
    finally:
        for h in handles:
            rt.release(h)


def _read_array(like):
    def read(rt, results):
        out = np.empty(results[0].shape, dtype=like.dtype)
        rt.copy_result(results[0], out.ctypes.data)
        return out
    return read


def allreduce(rt, array, name, op=lib.HORO_OP_SUM, prescale_factor=1.0, postscale_factor=1.0,
              process_set_id=0, out=None, dtype=None):
    out = np.empty_like(array) if out is None else out
    spec = _spec(name, array, out, dtype)
    # One call into the core that waits too (horo_run): a small repeated tensor then runs on this
    # thread alone (runtime/runtime_express.cc).
    rt.run(lib.HORO_ALLREDUCE, name, spec.input_ptr, spec.output_ptr, spec.dtype, spec.shape,
           process_set_id=process_set_id, reduce_op=op, prescale_factor=prescale_factor,
           postscale_factor=postscale_factor)
    return out


def grouped_allreduce(rt, arrays, names, op=lib.HORO_OP_SUM, process_set_id=0, dtype=None):
    outs = [np.empty_like(a) for a in arrays]
    _run(rt, lib.HORO_ALLREDUCE, [_spec(n, a, o, dtype) for n, a, o in zip(names, arrays, outs)], reduce_op=op,
         process_set_id=process_set_id)
    return outs


def allgather(rt, array, name, process_set_id=0, dtype=None):
    return _run(rt, lib.HORO_ALLGATHER, [_spec(name, array, None, dtype)], read=_read_array(array),
                process_set_id=process_set_id)


def broadcast(rt, array, root_rank, name, process_set_id=0, out=None, dtype=None):
    out = np.empty_like(array) if out is None else out
    _run(rt, lib.HORO_BROADCAST, [_spec(name, array, out, dtype)], root_rank=root_rank,
         process_set_id=process_set_id)
    return out


def alltoall(rt, array, name, splits=None, process_set_id=0, dtype=None):
    def read(rt, results):
        return _read_array(array)(rt, results), results[0].received_splits

    return _run(rt, lib.HORO_ALLTOALL, [_spec(name, array, None, dtype)], read=read, splits=splits,
                process_set_id=process_set_id)


def reducescatter(rt, array, name, op=lib.HORO_OP_SUM, prescale_factor=1.0, postscale_factor=1.0,
                  process_set_id=0, dtype=None):
    return _run(rt, lib.HORO_REDUCESCATTER, [_spec(name, array, None, dtype)], read=_read_array(array), reduce_op=op,
                prescale_factor=prescale_factor, postscale_factor=postscale_factor, process_set_id=process_set_id)


def barrier(rt, process_set_id=0):
    _run(rt, lib.HORO_BARRIER, [], process_set_id=process_set_id)


def join(rt, process_set_id=0):
    (res,) = _run(rt, lib.HORO_JOIN, [], process_set_id=process_set_id)
    return res.value
