// Element-wise kernels used by the collectives and the runtime. The hot loops are compiled for
// several instruction sets (AVX-512, AVX2, baseline) and the best one is chosen at run time.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace horo {

// dst[i] = dst[i] op src[i]. op is Sum, Min, Max or Product (not Average/Adasum).
// float16/bfloat16 are computed in float32 and rounded to nearest-even.
void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);

// buffer[i] *= factor. Floating types scale in their own precision (float16/bfloat16 via float32);
// integer types scale in double and round toward zero. Bool is left unchanged.
void ScaleBuffer(void* buffer, int64_t count, DataType dtype, double factor);

// Integer types: buffer[i] /= divisor, truncating toward zero (exact, unlike a scale by
// 1/divisor). Floating types: buffer[i] *= 1/divisor. Bool is left unchanged.
void DivideBuffer(void* buffer, int64_t count, DataType dtype, int64_t divisor);

// Fills buffer with the neutral element of op: 0 for Sum, 1 for Product, the largest value for
// Min, the lowest for Max (bool: false for Sum/Max, true for Min/Product).
void FillNeutral(void* buffer, int64_t count, DataType dtype, ReduceOp op);

// Names of the instruction sets the kernels dispatch to on this CPU, e.g. "avx512f avx2".
const char* KernelCpuFeatures();

}  // namespace horo
