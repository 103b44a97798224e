"""The core's dtype codes and their names, read from the compiled C ABI."""
from horo_core._binding import lib

UINT8 = lib.HORO_UINT8
INT8 = lib.HORO_INT8
INT16 = lib.HORO_INT16
INT32 = lib.HORO_INT32
INT64 = lib.HORO_INT64
FLOAT16 = lib.HORO_FLOAT16
BFLOAT16 = lib.HORO_BFLOAT16
FLOAT32 = lib.HORO_FLOAT32
FLOAT64 = lib.HORO_FLOAT64
BOOL = lib.HORO_BOOL
UINT16 = lib.HORO_UINT16

NAMES = {
    UINT8: "uint8", INT8: "int8", INT16: "int16", UINT16: "uint16", INT32: "int32", INT64: "int64",
    FLOAT16: "float16", BFLOAT16: "bfloat16", FLOAT32: "float32", FLOAT64: "float64", BOOL: "bool",
}
SIZES = {UINT8: 1, INT8: 1, INT16: 2, UINT16: 2, INT32: 4, INT64: 8, FLOAT16: 2, BFLOAT16: 2, FLOAT32: 4, FLOAT64: 8,
         BOOL: 1}

# NumPy has no bfloat16: arrays of it travel as uint16 with the dtype code given explicitly.
NUMPY_NAMES = {"uint8": UINT8, "int8": INT8, "int16": INT16, "uint16": UINT16, "int32": INT32, "int64": INT64,
               "float16": FLOAT16, "float32": FLOAT32, "float64": FLOAT64, "bool": BOOL}
