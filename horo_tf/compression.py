"""Gradient compression for communication: ``Compression.none``, ``.fp16`` and ``.bf16``.

A compressor turns a tensor into the tensor that travels and a context that undoes it. Only
floating-point tensors are compressed; others pass through unchanged. ``tf.IndexedSlices`` have
their values compressed.
"""
import tensorflow as tf

from horo_core.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


def _cast(tensor, dtype):
    if isinstance(tensor, tf.IndexedSlices):
        return tf.IndexedSlices(tf.cast(tensor.values, dtype), tensor.indices, tensor.dense_shape)
    return tf.cast(tensor, dtype)


class _CastCompressor(Compressor):
    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        if tensor.dtype.is_floating and tensor.dtype != cls.wire_dtype:
            return _cast(tensor, cls.wire_dtype), tensor.dtype
        return tensor, None

    @classmethod
    def decompress(cls, tensor, ctx):
        return tensor if ctx is None else _cast(tensor, ctx)


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as float16 (half the bytes; range limited to +-65504)."""
    wire_dtype = tf.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as bfloat16 (half the bytes, float32's range, 8 mantissa bits)."""
    wire_dtype = tf.bfloat16


class Compression:
    """The available compressors, as in Horovod (plus bf16)."""
    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
