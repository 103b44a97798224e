#include "collectives/adasum.h"

#include <cmath>
#include <limits>

#include "common/half.h"

namespace horo {
namespace {

// A coefficient divides by its vector's squared norm; below this (zero, or so small that the
// division would overflow) it stays 1. Horovod's threshold. A fixed 1e-8 summed every small
// gradient parallel to its peer instead (two equal vectors of norm 1e-5 came out doubled).
const double kTinyNormSquared = std::sqrt(std::numeric_limits<double>::min());

// Element access in double for each floating type.
struct Float16Io {
  using T = uint16_t;
  static double Load(T v) { return HalfToFloat(v); }
  static T Store(double v) { return FloatToHalf(static_cast<float>(v)); }
};
struct BFloat16Io {
  using T = uint16_t;
  static double Load(T v) { return BFloat16ToFloat(v); }
  static T Store(double v) { return FloatToBFloat16(static_cast<float>(v)); }
};
struct Float32Io {
  using T = float;
  static double Load(T v) { return v; }
  static T Store(double v) { return static_cast<float>(v); }
};
struct Float64Io {
  using T = double;
  static double Load(T v) { return v; }
  static T Store(double v) { return v; }
};

template <typename Io>
void CombinePair(void* a_ptr, const void* b_ptr, int64_t count) {
  using T = typename Io::T;
  T* a = static_cast<T*>(a_ptr);
  const T* b = static_cast<const T*>(b_ptr);
  double dot = 0, a_norm = 0, b_norm = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = Io::Load(a[i]);
    const double y = Io::Load(b[i]);
    dot += x * y;
    a_norm += x * x;
    b_norm += y * y;
  }
  const double a_coeff = a_norm >= kTinyNormSquared ? 1.0 - dot / a_norm * 0.5 : 1.0;
  const double b_coeff = b_norm >= kTinyNormSquared ? 1.0 - dot / b_norm * 0.5 : 1.0;
  for (int64_t i = 0; i < count; ++i) a[i] = Io::Store(a_coeff * Io::Load(a[i]) + b_coeff * Io::Load(b[i]));
}

template <typename Io>
void CombineAll(const std::vector<void*>& vectors, int64_t count) {
  const size_t n = vectors.size();
  for (size_t stride = 1; stride < n; stride *= 2) {
    for (size_t i = 0; i + stride < n; i += 2 * stride) CombinePair<Io>(vectors[i], vectors[i + stride], count);
  }
}

}  // namespace

bool AdasumSupports(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 || dtype == DataType::kFloat32 ||
         dtype == DataType::kFloat64;
}

void AdasumCombine(const std::vector<void*>& vectors, int64_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16: CombineAll<Float16Io>(vectors, count); break;
    case DataType::kBFloat16: CombineAll<BFloat16Io>(vectors, count); break;
    case DataType::kFloat32: CombineAll<Float32Io>(vectors, count); break;
    case DataType::kFloat64: CombineAll<Float64Io>(vectors, count); break;
    default: break;  // AdasumSupports() is checked where the tensor is submitted
  }
}

}  // namespace horo
