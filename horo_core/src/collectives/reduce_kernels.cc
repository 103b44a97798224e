// Element-wise kernels: reduce, scale and neutral fill for every dtype.
//
// Each hot loop is a plain `for` over arrays whose body is branch-free, so the compiler vectorises
// it. The loops live in a handful of small per-dtype functions marked with GCC's target_clones:
// the compiler emits an AVX-512, an AVX2 and a baseline x86-64 copy of each and an ifunc resolver
// picks the best one for the running CPU at load time. The build therefore needs no -march flag and
// runs on any x86-64; on other architectures the attribute is left out and the baseline is used.
// float16 conversion has its own instructions (F16C), which the compiler cannot derive from the
// portable bit manipulation, so float16 kernels get one extra AVX2 + F16C copy, chosen at run time.
//
// Arithmetic rules, the same on every CPU so that results never depend on which copy ran (the one
// freedom left is which payload survives when both operands of a Sum/Product are NaN):
//  * integers wrap around (computed in unsigned types, where overflow is defined);
//  * Min/Max of floating types propagate NaN from either operand;
//  * float16/bfloat16 are converted to float32 a block at a time, combined there and rounded back to
//    nearest-even, so all three steps are vector loops;
//  * bool is normalised to 0/1: Sum/Max are logical or, Min/Product logical and;
//  * integer scaling happens in double, rounds toward zero and saturates at the type's limits
//    (NaN becomes 0), which keeps every result defined.
#include "collectives/reduce_kernels.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "common/half.h"

// GCC's -O2 vectorises only loops that need no remainder or alias check ("very cheap" cost model);
// the kernels ask for the full cost model so that loops of any length vectorise at -O2 as well.
#if defined(__GNUC__) && !defined(__clang__)
#define HORO_KERNEL_VECTORIZE __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic")))
#else
#define HORO_KERNEL_VECTORIZE
#endif
// ThreadSanitizer instruments the ifunc resolvers, which run before its runtime is initialised and
// crash, so TSan builds use the baseline copy only.
#if defined(__x86_64__) && defined(__linux__) && !defined(__SANITIZE_THREAD__)
#define HORO_KERNEL_X86_DISPATCH 1
#include <immintrin.h>
#define HORO_KERNEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default"))) HORO_KERNEL_VECTORIZE
#define HORO_KERNEL_F16C __attribute__((target("avx2,f16c"))) HORO_KERNEL_VECTORIZE
#else
#define HORO_KERNEL_X86_DISPATCH 0
#define HORO_KERNEL_CLONES HORO_KERNEL_VECTORIZE
#endif
#define HORO_KERNEL_INLINE inline __attribute__((always_inline))

namespace horo {
namespace {

// float16/bfloat16 are processed in blocks of this many elements converted to float32 on the stack.
constexpr int64_t kHalfBlock = 256;

// Unsigned type wide enough that integer promotion cannot turn a wrap-around into signed overflow.
template <typename T>
using WrapType = std::conditional_t<(sizeof(T) < sizeof(uint32_t)), uint32_t, std::make_unsigned_t<T>>;

struct SumOp {
  template <typename T>
  HORO_KERNEL_INLINE static T Integer(T a, T b) {
    return static_cast<T>(static_cast<WrapType<T>>(a) + static_cast<WrapType<T>>(b));
  }
  template <typename T>
  HORO_KERNEL_INLINE static T Floating(T a, T b) { return a + b; }
};

struct ProductOp {
  template <typename T>
  HORO_KERNEL_INLINE static T Integer(T a, T b) {
    return static_cast<T>(static_cast<WrapType<T>>(a) * static_cast<WrapType<T>>(b));
  }
  template <typename T>
  HORO_KERNEL_INLINE static T Floating(T a, T b) { return a * b; }
};

struct MinOp {
  template <typename T>
  HORO_KERNEL_INLINE static T Integer(T a, T b) { return b < a ? b : a; }
  template <typename T>
  HORO_KERNEL_INLINE static T Floating(T a, T b) {
    const T smaller = b < a ? b : a;  // a NaN in a survives this select
    return b != b ? b : smaller;      // a NaN in b wins too
  }
};

struct MaxOp {
  template <typename T>
  HORO_KERNEL_INLINE static T Integer(T a, T b) { return b > a ? b : a; }
  template <typename T>
  HORO_KERNEL_INLINE static T Floating(T a, T b) {
    const T larger = b > a ? b : a;
    return b != b ? b : larger;
  }
};

template <typename Op, typename T>
HORO_KERNEL_INLINE void IntegerLoop(T* dst, const T* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = Op::Integer(dst[i], src[i]);
}

template <typename Op, typename T>
HORO_KERNEL_INLINE void FloatingLoop(T* dst, const T* src, int64_t count) {
  for (int64_t i = 0; i < count; ++i) dst[i] = Op::Floating(dst[i], src[i]);
}

template <typename T>
HORO_KERNEL_INLINE void ReduceIntegers(T* dst, const T* src, int64_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: IntegerLoop<SumOp>(dst, src, count); break;
    case ReduceOp::kMin: IntegerLoop<MinOp>(dst, src, count); break;
    case ReduceOp::kMax: IntegerLoop<MaxOp>(dst, src, count); break;
    case ReduceOp::kProduct: IntegerLoop<ProductOp>(dst, src, count); break;
    default: break;
  }
}

template <typename T>
HORO_KERNEL_INLINE void ReduceFloating(T* dst, const T* src, int64_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: FloatingLoop<SumOp>(dst, src, count); break;
    case ReduceOp::kMin: FloatingLoop<MinOp>(dst, src, count); break;
    case ReduceOp::kMax: FloatingLoop<MaxOp>(dst, src, count); break;
    case ReduceOp::kProduct: FloatingLoop<ProductOp>(dst, src, count); break;
    default: break;
  }
}

// A codec converts a block of 16-bit values to float32 and back (round to nearest-even).
struct Float16Codec {
  HORO_KERNEL_INLINE static void ToFloat(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
  }
  HORO_KERNEL_INLINE static void FromFloat(const float* in, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToHalf(in[i]);
  }
};

struct BFloat16Codec {
  HORO_KERNEL_INLINE static void ToFloat(const uint16_t* in, float* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
  }
  HORO_KERNEL_INLINE static void FromFloat(const float* in, uint16_t* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
  }
};

#if HORO_KERNEL_X86_DISPATCH
// float16 through the F16C conversion instructions, 8 values per instruction; they round to
// nearest-even and treat NaN exactly as FloatToHalf does, so results match the portable codec bit
// for bit. Not always_inline: GCC would first try to inline them into the generic (baseline)
// template instantiation and reject the target mismatch; one call per block costs nothing.
struct Float16F16CCodec {
  HORO_KERNEL_F16C static void ToFloat(const uint16_t* in, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    }
    for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
  }
  HORO_KERNEL_F16C static void FromFloat(const float* in, uint16_t* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
  }
};
#endif

template <typename Codec>
HORO_KERNEL_INLINE void ReduceHalfLike(uint16_t* dst, const uint16_t* src, int64_t count, ReduceOp op) {
  float dst_block[kHalfBlock];
  float src_block[kHalfBlock];
  for (int64_t start = 0; start < count; start += kHalfBlock) {
    const int64_t length = std::min(kHalfBlock, count - start);
    Codec::ToFloat(dst + start, dst_block, length);
    Codec::ToFloat(src + start, src_block, length);
    ReduceFloating(dst_block, src_block, length, op);
    Codec::FromFloat(dst_block, dst + start, length);
  }
}

template <typename Codec>
HORO_KERNEL_INLINE void ScaleHalfLike(uint16_t* buffer, int64_t count, float factor) {
  float block[kHalfBlock];
  for (int64_t start = 0; start < count; start += kHalfBlock) {
    const int64_t length = std::min(kHalfBlock, count - start);
    Codec::ToFloat(buffer + start, block, length);
    for (int64_t i = 0; i < length; ++i) block[i] *= factor;
    Codec::FromFloat(block, buffer + start, length);
  }
}

// Rounds toward zero and saturates; NaN becomes 0. Both limits are exact doubles for every T
// (2^63 for int64), and the conversion only runs on values strictly inside them.
template <typename T>
HORO_KERNEL_INLINE T TruncateSaturate(double value) {
  const double above_max = static_cast<double>(std::numeric_limits<T>::max()) + 1.0;
  const double below_min = static_cast<double>(std::numeric_limits<T>::min()) - 1.0;
  if (value >= above_max) return std::numeric_limits<T>::max();
  if (value <= below_min) return std::numeric_limits<T>::min();
  if (value != value) return 0;
  return static_cast<T>(value);
}

template <typename T>
HORO_KERNEL_INLINE void ScaleIntegers(T* buffer, int64_t count, double factor) {
  for (int64_t i = 0; i < count; ++i) buffer[i] = TruncateSaturate<T>(static_cast<double>(buffer[i]) * factor);
}

// The dispatch targets: one compiled copy per instruction set each.
HORO_KERNEL_CLONES void ReduceUInt8(uint8_t* d, const uint8_t* s, int64_t n, ReduceOp op) {
  ReduceIntegers(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceInt8(int8_t* d, const int8_t* s, int64_t n, ReduceOp op) {
  ReduceIntegers(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceInt16(int16_t* d, const int16_t* s, int64_t n, ReduceOp op) {
  ReduceIntegers(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceUInt16(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op) {
  ReduceIntegers(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceInt32(int32_t* d, const int32_t* s, int64_t n, ReduceOp op) {
  ReduceIntegers(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceInt64(int64_t* d, const int64_t* s, int64_t n, ReduceOp op) {
  ReduceIntegers(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceFloat32(float* d, const float* s, int64_t n, ReduceOp op) {
  ReduceFloating(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceFloat64(double* d, const double* s, int64_t n, ReduceOp op) {
  ReduceFloating(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceFloat16(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op) {
  ReduceHalfLike<Float16Codec>(d, s, n, op);
}
HORO_KERNEL_CLONES void ReduceBFloat16(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op) {
  ReduceHalfLike<BFloat16Codec>(d, s, n, op);
}

HORO_KERNEL_CLONES void ReduceBool(uint8_t* dst, const uint8_t* src, int64_t count, ReduceOp op) {
  const bool logical_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
  if (logical_and) {
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<uint8_t>((dst[i] != 0) & (src[i] != 0));
  } else {
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<uint8_t>((dst[i] != 0) | (src[i] != 0));
  }
}

HORO_KERNEL_CLONES void ScaleFloat32(float* buffer, int64_t count, float factor) {
  for (int64_t i = 0; i < count; ++i) buffer[i] *= factor;
}
HORO_KERNEL_CLONES void ScaleFloat64(double* buffer, int64_t count, double factor) {
  for (int64_t i = 0; i < count; ++i) buffer[i] *= factor;
}
HORO_KERNEL_CLONES void ScaleFloat16(uint16_t* buffer, int64_t count, float factor) {
  ScaleHalfLike<Float16Codec>(buffer, count, factor);
}
HORO_KERNEL_CLONES void ScaleBFloat16(uint16_t* buffer, int64_t count, float factor) {
  ScaleHalfLike<BFloat16Codec>(buffer, count, factor);
}
#if HORO_KERNEL_X86_DISPATCH
HORO_KERNEL_F16C void ReduceFloat16F16C(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op) {
  ReduceHalfLike<Float16F16CCodec>(d, s, n, op);
}
HORO_KERNEL_F16C void ScaleFloat16F16C(uint16_t* buffer, int64_t count, float factor) {
  ScaleHalfLike<Float16F16CCodec>(buffer, count, factor);
}
#endif

// F16C (with AVX2) is on every x86-64 CPU since 2013; float16 uses it when present.
bool UseF16C() {
#if HORO_KERNEL_X86_DISPATCH
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

void ReduceFloat16Best(uint16_t* d, const uint16_t* s, int64_t n, ReduceOp op) {
#if HORO_KERNEL_X86_DISPATCH
  if (UseF16C()) return ReduceFloat16F16C(d, s, n, op);
#endif
  ReduceFloat16(d, s, n, op);
}

void ScaleFloat16Best(uint16_t* buffer, int64_t count, float factor) {
#if HORO_KERNEL_X86_DISPATCH
  if (UseF16C()) return ScaleFloat16F16C(buffer, count, factor);
#endif
  ScaleFloat16(buffer, count, factor);
}

HORO_KERNEL_CLONES void ScaleUInt8(uint8_t* b, int64_t n, double f) { ScaleIntegers(b, n, f); }
HORO_KERNEL_CLONES void ScaleInt8(int8_t* b, int64_t n, double f) { ScaleIntegers(b, n, f); }
HORO_KERNEL_CLONES void ScaleInt16(int16_t* b, int64_t n, double f) { ScaleIntegers(b, n, f); }
HORO_KERNEL_CLONES void ScaleUInt16(uint16_t* b, int64_t n, double f) { ScaleIntegers(b, n, f); }
HORO_KERNEL_CLONES void ScaleInt32(int32_t* b, int64_t n, double f) { ScaleIntegers(b, n, f); }
HORO_KERNEL_CLONES void ScaleInt64(int64_t* b, int64_t n, double f) { ScaleIntegers(b, n, f); }

template <typename T>
void CallTyped(void (*kernel)(T*, const T*, int64_t, ReduceOp), void* dst, const void* src, int64_t count,
               ReduceOp op) {
  kernel(static_cast<T*>(dst), static_cast<const T*>(src), count, op);
}

template <typename T>
void FillValue(void* buffer, int64_t count, T value) {
  std::fill_n(static_cast<T*>(buffer), count, value);
}

// The neutral element of op for a type whose ordering is that of T.
template <typename T>
T NeutralOf(ReduceOp op) {
  using Limits = std::numeric_limits<T>;
  switch (op) {
    case ReduceOp::kProduct: return static_cast<T>(1);
    case ReduceOp::kMin:
      return Limits::has_infinity ? Limits::infinity() : Limits::max();
    case ReduceOp::kMax:
      return Limits::has_infinity ? -Limits::infinity() : Limits::lowest();
    default:
      // -0.0 rather than +0.0 for floating types: it is the exact identity of IEEE addition
      // (-0 + x == x for every x, including x == -0).
      return Limits::is_iec559 ? -static_cast<T>(0) : static_cast<T>(0);
  }
}

}  // namespace

void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op) {
  if (count <= 0) return;
  switch (dtype) {
    case DataType::kUInt8: CallTyped<uint8_t>(ReduceUInt8, dst, src, count, op); break;
    case DataType::kInt8: CallTyped<int8_t>(ReduceInt8, dst, src, count, op); break;
    case DataType::kInt16: CallTyped<int16_t>(ReduceInt16, dst, src, count, op); break;
    case DataType::kUInt16: CallTyped<uint16_t>(ReduceUInt16, dst, src, count, op); break;
    case DataType::kInt32: CallTyped<int32_t>(ReduceInt32, dst, src, count, op); break;
    case DataType::kInt64: CallTyped<int64_t>(ReduceInt64, dst, src, count, op); break;
    case DataType::kFloat16: CallTyped<uint16_t>(ReduceFloat16Best, dst, src, count, op); break;
    case DataType::kBFloat16: CallTyped<uint16_t>(ReduceBFloat16, dst, src, count, op); break;
    case DataType::kFloat32: CallTyped<float>(ReduceFloat32, dst, src, count, op); break;
    case DataType::kFloat64: CallTyped<double>(ReduceFloat64, dst, src, count, op); break;
    case DataType::kBool: CallTyped<uint8_t>(ReduceBool, dst, src, count, op); break;
  }
}

namespace {
template <typename T>
void DivideIntegers(T* buffer, int64_t count, int64_t divisor) {
  for (int64_t i = 0; i < count; ++i) buffer[i] = static_cast<T>(static_cast<int64_t>(buffer[i]) / divisor);
}
}  // namespace

void DivideBuffer(void* buffer, int64_t count, DataType dtype, int64_t divisor) {
  if (count <= 0 || divisor == 1) return;
  switch (dtype) {
    case DataType::kUInt8: DivideIntegers(static_cast<uint8_t*>(buffer), count, divisor); break;
    case DataType::kInt8: DivideIntegers(static_cast<int8_t*>(buffer), count, divisor); break;
    case DataType::kInt16: DivideIntegers(static_cast<int16_t*>(buffer), count, divisor); break;
    case DataType::kUInt16: DivideIntegers(static_cast<uint16_t*>(buffer), count, divisor); break;
    case DataType::kInt32: DivideIntegers(static_cast<int32_t*>(buffer), count, divisor); break;
    case DataType::kInt64: DivideIntegers(static_cast<int64_t*>(buffer), count, divisor); break;
    case DataType::kBool: break;
    default: ScaleBuffer(buffer, count, dtype, 1.0 / static_cast<double>(divisor)); break;
  }
}

void ScaleBuffer(void* buffer, int64_t count, DataType dtype, double factor) {
  if (count <= 0 || factor == 1.0) return;
  const float factor32 = static_cast<float>(factor);
  switch (dtype) {
    case DataType::kUInt8: ScaleUInt8(static_cast<uint8_t*>(buffer), count, factor); break;
    case DataType::kInt8: ScaleInt8(static_cast<int8_t*>(buffer), count, factor); break;
    case DataType::kInt16: ScaleInt16(static_cast<int16_t*>(buffer), count, factor); break;
    case DataType::kUInt16: ScaleUInt16(static_cast<uint16_t*>(buffer), count, factor); break;
    case DataType::kInt32: ScaleInt32(static_cast<int32_t*>(buffer), count, factor); break;
    case DataType::kInt64: ScaleInt64(static_cast<int64_t*>(buffer), count, factor); break;
    case DataType::kFloat16: ScaleFloat16Best(static_cast<uint16_t*>(buffer), count, factor32); break;
    case DataType::kBFloat16: ScaleBFloat16(static_cast<uint16_t*>(buffer), count, factor32); break;
    case DataType::kFloat32: ScaleFloat32(static_cast<float*>(buffer), count, factor32); break;
    case DataType::kFloat64: ScaleFloat64(static_cast<double*>(buffer), count, factor); break;
    case DataType::kBool: break;
  }
}

void FillNeutral(void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  if (count <= 0) return;
  switch (dtype) {
    case DataType::kUInt8: FillValue(buffer, count, NeutralOf<uint8_t>(op)); break;
    case DataType::kInt8: FillValue(buffer, count, NeutralOf<int8_t>(op)); break;
    case DataType::kInt16: FillValue(buffer, count, NeutralOf<int16_t>(op)); break;
    case DataType::kUInt16: FillValue(buffer, count, NeutralOf<uint16_t>(op)); break;
    case DataType::kInt32: FillValue(buffer, count, NeutralOf<int32_t>(op)); break;
    case DataType::kInt64: FillValue(buffer, count, NeutralOf<int64_t>(op)); break;
    case DataType::kFloat16: FillValue(buffer, count, FloatToHalf(NeutralOf<float>(op))); break;
    case DataType::kBFloat16: FillValue(buffer, count, FloatToBFloat16(NeutralOf<float>(op))); break;
    case DataType::kFloat32: FillValue(buffer, count, NeutralOf<float>(op)); break;
    case DataType::kFloat64: FillValue(buffer, count, NeutralOf<double>(op)); break;
    case DataType::kBool: {
      const bool logical_and = op == ReduceOp::kMin || op == ReduceOp::kProduct;
      FillValue(buffer, count, static_cast<uint8_t>(logical_and ? 1 : 0));
      break;
    }
  }
}

const char* KernelCpuFeatures() {
#if HORO_KERNEL_X86_DISPATCH
  __builtin_cpu_init();
  const bool avx512f = __builtin_cpu_supports("avx512f");
  const bool avx2 = __builtin_cpu_supports("avx2");
  const bool f16c = UseF16C();
  if (avx512f && f16c) return "avx512f avx2 f16c";
  if (avx512f && avx2) return "avx512f avx2";
  if (avx512f) return "avx512f";
  if (f16c) return "avx2 f16c";
  if (avx2) return "avx2";
#endif
  return "baseline";
}

}  // namespace horo
