"""Exact test values per dtype: build arrays from float64 values and read results back, with
bfloat16 carried as its uint16 bit pattern (NumPy has no bfloat16)."""
import numpy as np

from horo_core import dtypes
from horo_core._binding import lib

ALL = [dtypes.UINT8, dtypes.INT8, dtypes.INT16, dtypes.UINT16, dtypes.INT32, dtypes.INT64, dtypes.FLOAT16,
       dtypes.BFLOAT16, dtypes.FLOAT32, dtypes.FLOAT64, dtypes.BOOL]
# Every reduce op the core takes for allreduce, by name.
REDUCE_OPS = {"sum": lib.HORO_OP_SUM, "average": lib.HORO_OP_AVERAGE, "min": lib.HORO_OP_MIN,
              "max": lib.HORO_OP_MAX, "product": lib.HORO_OP_PRODUCT}


def reduce_cases():
    """(dtype, op name, op) for every dtype and allreduce op (Average is not defined for bool)."""
    for dtype in ALL:
        for op_name, op in REDUCE_OPS.items():
            if not (dtype == dtypes.BOOL and op_name == "average"):
                yield dtype, op_name, op


INTEGER = {dtypes.UINT8, dtypes.INT8, dtypes.INT16, dtypes.UINT16, dtypes.INT32, dtypes.INT64}
NUMPY = {dtypes.UINT8: np.uint8, dtypes.INT8: np.int8, dtypes.INT16: np.int16, dtypes.UINT16: np.uint16,
         dtypes.INT32: np.int32, dtypes.INT64: np.int64, dtypes.FLOAT16: np.float16, dtypes.BFLOAT16: np.uint16,
         dtypes.FLOAT32: np.float32, dtypes.FLOAT64: np.float64, dtypes.BOOL: np.bool_}


def make(dtype, values):
    values = np.asarray(values, dtype=np.float64)
    if dtype == dtypes.BFLOAT16:
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    if dtype == dtypes.BOOL:
        return values != 0
    return values.astype(NUMPY[dtype])


def read(dtype, array):
    if dtype == dtypes.BFLOAT16:
        return (array.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return array.astype(np.float64)


def name(dtype):
    return dtypes.NAMES[dtype]


# Allreduce contributions and their exact results ------------------------------------------------

def contribution(op, rank, count):
    i = np.arange(count)
    if op == "product":
        return 1.0 + ((rank + i) % 2)
    return (rank + 1.0) * (1 + i % 3)


def expected_allreduce(op, dtype, size, count):
    stack = np.stack([contribution(op, r, count) for r in range(size)]) if count else np.zeros((size, 0))
    if dtype == dtypes.BOOL:
        bits = stack != 0
        return (bits.all(0) if op in ("min", "product") else bits.any(0)).astype(np.float64)
    if op in ("sum", "average"):
        total = stack.sum(0)
        if op == "sum":
            return total
        return np.trunc(total / size) if dtype in INTEGER else total / size
    return {"min": stack.min(0), "max": stack.max(0), "product": stack.prod(0)}[op]
