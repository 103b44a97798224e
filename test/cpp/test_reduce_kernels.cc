// sources: collectives/reduce_kernels.cc common/dtype.cc
//
// Unit checks of the element-wise kernels and of the float16/bfloat16 conversions: conversions
// against a double-precision reference, ReduceInto against a scalar reference for every dtype, op
// and tail length, neutral elements, and scaling. Exits 1 on the first failure.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "common/dtype.h"
#include "common/half.h"
#include "unit_check.h"

using namespace horo;
using horo_test::Check;
using horo_test::Fail;

namespace {

std::string Hex(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%x", value);
  return text;
}

const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,   DataType::kInt32,
                              DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                              DataType::kFloat64, DataType::kBool,    DataType::kUInt16};
const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

// Reference float -> binary16 with round-to-nearest-even, computed in double.
uint16_t ReferenceHalf(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000 : 0;
  if (std::isnan(value)) return static_cast<uint16_t>(sign | 0x7e00 | ((FloatBits(value) >> 13) & 0x3ff));
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude >= 65520.0) return sign | 0x7c00;  // 65520 is halfway between 65504 and 2^16
  if (magnitude < std::ldexp(1.0, -14)) {
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(magnitude / std::ldexp(1.0, -24))));
  }
  int exponent;
  const double fraction = std::frexp(magnitude, &exponent);  // magnitude = fraction * 2^exponent
  double mantissa = std::nearbyint((fraction * 2.0 - 1.0) * 1024.0);
  int biased = exponent - 1 + 15;
  if (mantissa == 1024.0) {
    mantissa = 0;
    ++biased;
  }
  if (biased >= 31) return sign | 0x7c00;
  return static_cast<uint16_t>(sign | (biased << 10) | static_cast<int>(mantissa));
}

// Reference float -> bfloat16 with round-to-nearest-even, computed in double.
uint16_t ReferenceBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude < std::ldexp(1.0, -126)) {
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(magnitude / std::ldexp(1.0, -133))));
  }
  int exponent;
  const double fraction = std::frexp(magnitude, &exponent);
  double mantissa = std::nearbyint((fraction * 2.0 - 1.0) * 128.0);
  int biased = exponent - 1 + 127;
  if (mantissa == 128.0) {
    mantissa = 0;
    ++biased;
  }
  if (biased >= 255) return sign | 0x7f80;
  return static_cast<uint16_t>(sign | (biased << 7) | static_cast<int>(mantissa));
}

void CheckHalfConversions() {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float value = HalfToFloat(half);
    const bool is_nan = (half & 0x7c00) == 0x7c00 && (half & 0x3ff) != 0;
    if (is_nan) {
      Check(std::isnan(value), "float16 NaN " + Hex(half) + " must convert to NaN");
      Check(FloatToHalf(value) == (half | 0x200), "float16 NaN " + Hex(half) + " must round-trip quieted");
    } else {
      Check(FloatToHalf(value) == half, "float16 round trip of " + Hex(half) + " gave " + Hex(FloatToHalf(value)));
    }
    const float bvalue = BFloat16ToFloat(half);
    const bool b_nan = (half & 0x7f80) == 0x7f80 && (half & 0x7f) != 0;
    Check(b_nan ? std::isnan(bvalue) : FloatToBFloat16(bvalue) == half, "bfloat16 round trip of " + Hex(half));
  }
  // Every 1031st float bit pattern (all exponents, many mantissas) plus a band of exact ties.
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 1031) {
    const float value = FloatFromBits(static_cast<uint32_t>(bits));
    Check(FloatToHalf(value) == ReferenceHalf(value), "float16 of float bits " + Hex(static_cast<uint32_t>(bits)) +
                                                          ": got " + Hex(FloatToHalf(value)) + " want " +
                                                          Hex(ReferenceHalf(value)));
    Check(FloatToBFloat16(value) == ReferenceBFloat16(value),
          "bfloat16 of float bits " + Hex(static_cast<uint32_t>(bits)) + ": got " + Hex(FloatToBFloat16(value)) +
              " want " + Hex(ReferenceBFloat16(value)));
  }
  // Named cases: ties to even, overflow, subnormals, signed zero, infinity.
  struct Case { float input; uint16_t half; };
  const Case cases[] = {{1.0f + std::ldexp(1.0f, -11), 0x3c00}, {1.0f + 3 * std::ldexp(1.0f, -11), 0x3c02},
                        {65504.0f, 0x7bff},  {65519.0f, 0x7bff},  {65520.0f, 0x7c00},
                        {std::ldexp(1.0f, -25), 0x0000}, {3 * std::ldexp(1.0f, -25), 0x0002},
                        {std::ldexp(1.0f, -24), 0x0001}, {-0.0f, 0x8000},
                        {std::numeric_limits<float>::infinity(), 0x7c00}, {-1e10f, 0xfc00}};
  for (const Case& c : cases) {
    Check(FloatToHalf(c.input) == c.half, "float16 of " + std::to_string(c.input) + ": got " +
                                              Hex(FloatToHalf(c.input)) + " want " + Hex(c.half));
  }
  Check(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80, "bfloat16 tie rounds down to even");
  Check(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82, "bfloat16 tie rounds up to even");
  Check(FloatToBFloat16(std::numeric_limits<float>::max()) == 0x7f80, "bfloat16 overflow becomes infinity");
  std::printf("ok  float16/bfloat16 conversions: round trips, 4.2M reference comparisons, ties, overflow\n");
}

// Scalar reference of ReduceInto for one element.
template <typename T>
T ReferenceInteger(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
    case ReduceOp::kProduct: return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
    case ReduceOp::kMin: return a < b ? a : b;
    default: return a > b ? a : b;
  }
}

template <typename T>
T ReferenceFloating(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return std::isnan(b) ? b : std::isnan(a) ? a : (b < a ? b : a);
    default: return std::isnan(b) ? b : std::isnan(a) ? a : (b > a ? b : a);
  }
}

template <typename T>
void ReferenceReduce(void* dst, const void* src, int64_t count, ReduceOp op, DataType dtype) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point<T>::value) {
      d[i] = ReferenceFloating(d[i], s[i], op);
    } else if (dtype == DataType::kBool) {
      const bool both = op == ReduceOp::kMin || op == ReduceOp::kProduct;
      d[i] = both ? (d[i] != 0 && s[i] != 0) : (d[i] != 0 || s[i] != 0);
    } else if (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) {
      const bool half = dtype == DataType::kFloat16;
      const float a = half ? HalfToFloat(d[i]) : BFloat16ToFloat(d[i]);
      const float b = half ? HalfToFloat(s[i]) : BFloat16ToFloat(s[i]);
      const float r = ReferenceFloating(a, b, op);
      d[i] = half ? FloatToHalf(r) : FloatToBFloat16(r);
    } else {
      d[i] = ReferenceInteger(d[i], s[i], op);
    }
  }
}

void ReferenceReduceAny(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: case DataType::kBool: ReferenceReduce<uint8_t>(dst, src, count, op, dtype); break;
    case DataType::kInt8: ReferenceReduce<int8_t>(dst, src, count, op, dtype); break;
    case DataType::kInt16: ReferenceReduce<int16_t>(dst, src, count, op, dtype); break;
    case DataType::kUInt16: ReferenceReduce<uint16_t>(dst, src, count, op, dtype); break;
    case DataType::kFloat16: case DataType::kBFloat16: ReferenceReduce<uint16_t>(dst, src, count, op, dtype); break;
    case DataType::kInt32: ReferenceReduce<int32_t>(dst, src, count, op, dtype); break;
    case DataType::kInt64: ReferenceReduce<int64_t>(dst, src, count, op, dtype); break;
    case DataType::kFloat32: ReferenceReduce<float>(dst, src, count, op, dtype); break;
    case DataType::kFloat64: ReferenceReduce<double>(dst, src, count, op, dtype); break;
  }
}

// Random bytes that are valid, mostly moderate values of dtype, with some NaN, infinities and
// signed zeros for floating types.
void RandomFill(std::vector<uint8_t>* bytes, int64_t count, DataType dtype, std::mt19937_64* rng) {
  const size_t size = DataTypeSize(dtype);
  bytes->assign(count * size, 0);
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t r = (*rng)();
    uint8_t* at = bytes->data() + i * size;
    const double special[] = {std::nan(""), std::numeric_limits<double>::infinity(),
                              -std::numeric_limits<double>::infinity(), 0.0, -0.0};
    const double value = (r % 16 == 0) ? special[(r >> 8) % 5] : (static_cast<double>((r >> 8) % 2001) - 1000.0) / 8.0;
    switch (dtype) {
      case DataType::kFloat16: { uint16_t h = FloatToHalf(static_cast<float>(value)); std::memcpy(at, &h, 2); break; }
      case DataType::kBFloat16: { uint16_t h = FloatToBFloat16(static_cast<float>(value)); std::memcpy(at, &h, 2); break; }
      case DataType::kFloat32: { float f = static_cast<float>(value); std::memcpy(at, &f, 4); break; }
      case DataType::kFloat64: std::memcpy(at, &value, 8); break;
      default: std::memcpy(at, &r, size); break;  // integers and bool: any bit pattern
    }
  }
}

// True when the element at `at` is a NaN of dtype.
bool IsNanAt(const uint8_t* at, DataType dtype) {
  uint16_t h;
  float f;
  double d;
  switch (dtype) {
    case DataType::kFloat16: std::memcpy(&h, at, 2); return std::isnan(HalfToFloat(h));
    case DataType::kBFloat16: std::memcpy(&h, at, 2); return std::isnan(BFloat16ToFloat(h));
    case DataType::kFloat32: std::memcpy(&f, at, 4); return std::isnan(f);
    case DataType::kFloat64: std::memcpy(&d, at, 8); return std::isnan(d);
    default: return false;
  }
}

// Index of the first element where got and want differ other than both being NaN (NaN payloads
// depend on operand order, which the compiler may pick), or -1.
int64_t FirstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, DataType dtype) {
  const size_t size = DataTypeSize(dtype);
  for (size_t i = 0; i * size < got.size(); ++i) {
    const uint8_t* a = got.data() + i * size;
    const uint8_t* b = want.data() + i * size;
    if (std::memcmp(a, b, size) != 0 && !(IsNanAt(a, dtype) && IsNanAt(b, dtype))) return static_cast<int64_t>(i);
  }
  return -1;
}

void CheckReduceInto() {
  std::mt19937_64 rng(42);
  std::vector<int64_t> counts;
  for (int64_t n = 0; n <= 70; ++n) counts.push_back(n);
  counts.push_back(1000);
  counts.push_back(4099);
  int cases = 0;
  for (DataType dtype : kAllTypes) {
    const size_t size = DataTypeSize(dtype);
    for (ReduceOp op : kAllOps) {
      for (int64_t count : counts) {
        for (int misalign = 0; misalign < 2; ++misalign) {
          std::vector<uint8_t> dst, src;
          RandomFill(&dst, count + misalign, dtype, &rng);
          RandomFill(&src, count + misalign, dtype, &rng);
          std::vector<uint8_t> want = dst;
          ReferenceReduceAny(want.data() + misalign * size, src.data() + misalign * size, count, dtype, op);
          ReduceInto(dst.data() + misalign * size, src.data() + misalign * size, count, dtype, op);
          const int64_t bad = FirstDifference(dst, want, dtype);
          if (bad >= 0) {
            Fail(std::string("ReduceInto ") + DataTypeName(dtype) + " " + ReduceOpName(op) + " count " +
                 std::to_string(count) + " misalign " + std::to_string(misalign) + ": element " +
                 std::to_string(bad) + " differs from the scalar reference");
          }
          ++cases;
        }
      }
    }
  }
  // NaN wins from either side for Min/Max.
  float a[2] = {std::nanf(""), 1.0f}, b[2] = {1.0f, std::nanf("")};
  ReduceInto(a, b, 2, DataType::kFloat32, ReduceOp::kMin);
  Check(std::isnan(a[0]) && std::isnan(a[1]), "float32 Min must propagate NaN from either operand");
  uint8_t bool_dst[3] = {2, 0, 255}, bool_src[3] = {4, 7, 0};
  ReduceInto(bool_dst, bool_src, 3, DataType::kBool, ReduceOp::kProduct);
  Check(bool_dst[0] == 1 && bool_dst[1] == 0 && bool_dst[2] == 0, "bool Product is a normalised logical and");
  std::printf("ok  ReduceInto: %d cases (10 dtypes x 4 ops x 73 lengths x 2 alignments) match the scalar reference\n", cases);
}

void CheckFillNeutral() {
  std::mt19937_64 rng(7);
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      const int64_t count = 257;
      std::vector<uint8_t> values, neutral(count * DataTypeSize(dtype));
      RandomFill(&values, count, dtype, &rng);
      if (dtype == DataType::kBool) {
        for (uint8_t& v : values) v &= 1;  // the identity holds for normalised bools
      }
      FillNeutral(neutral.data(), count, dtype, op);
      std::vector<uint8_t> left = neutral, right = values;
      ReduceInto(left.data(), values.data(), count, dtype, op);
      ReduceInto(right.data(), neutral.data(), count, dtype, op);
      const int64_t bad_left = FirstDifference(left, values, dtype);
      const int64_t bad_right = FirstDifference(right, values, dtype);
      if (bad_left >= 0 || bad_right >= 0) {
        Fail(std::string("FillNeutral ") + DataTypeName(dtype) + " " + ReduceOpName(op) + ": element " +
             std::to_string(bad_left >= 0 ? bad_left : bad_right) + " is not an identity");
      }
    }
  }
  int8_t i8[1];
  FillNeutral(i8, 1, DataType::kInt8, ReduceOp::kMin);
  Check(i8[0] == 127, "int8 Min neutral is 127");
  FillNeutral(i8, 1, DataType::kInt8, ReduceOp::kMax);
  Check(i8[0] == -128, "int8 Max neutral is -128");
  uint16_t h[1];
  FillNeutral(h, 1, DataType::kFloat16, ReduceOp::kMax);
  Check(h[0] == 0xfc00, "float16 Max neutral is -inf");
  uint8_t flag[1];
  FillNeutral(flag, 1, DataType::kBool, ReduceOp::kMin);
  Check(flag[0] == 1, "bool Min neutral is true");
  FillNeutral(flag, 1, DataType::kBool, ReduceOp::kSum);
  Check(flag[0] == 0, "bool Sum neutral is false");
  std::printf("ok  FillNeutral: identity of every op for every dtype, named values\n");
}

// The float16 kernels may convert with the F16C instructions; they must agree bit for bit with the
// portable conversion, NaN payloads included, so results never depend on the CPU.
void CheckFloat16KernelsMatchPortable() {
  std::vector<uint16_t> all(65536), lowest(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  std::vector<uint16_t> reduced = all;
  FillNeutral(lowest.data(), 65536, DataType::kFloat16, ReduceOp::kMax);
  ReduceInto(reduced.data(), lowest.data(), 65536, DataType::kFloat16, ReduceOp::kMax);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t want = FloatToHalf(HalfToFloat(all[h]));
    Check(reduced[h] == want, "float16 Max with -inf of " + Hex(h) + ": got " + Hex(reduced[h]) + " want " + Hex(want));
  }
  for (float factor : {0.7f, 1.0001f, 3e-5f, 1e4f, -1.3f}) {
    std::vector<uint16_t> scaled = all;
    ScaleBuffer(scaled.data(), 65536, DataType::kFloat16, factor);
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint16_t want = FloatToHalf(HalfToFloat(all[h]) * factor);
      Check(scaled[h] == want, "float16 scale of " + Hex(h) + " by " + std::to_string(factor) + ": got " +
                                   Hex(scaled[h]) + " want " + Hex(want));
    }
  }
  std::printf("ok  float16 kernels (%s) match the portable conversion bit for bit on all 65536 values\n",
              KernelCpuFeatures());
}

void CheckScaleBuffer() {
  float f32[3] = {1.0f, 3.0f, -5.0f};
  ScaleBuffer(f32, 3, DataType::kFloat32, 0.5);
  Check(f32[0] == 0.5f && f32[1] == 1.5f && f32[2] == -2.5f, "float32 scale by 0.5");
  double f64[2] = {1.0 / 3.0, 10.0};
  ScaleBuffer(f64, 2, DataType::kFloat64, 3.0);
  Check(f64[0] == (1.0 / 3.0) * 3.0 && f64[1] == 30.0, "float64 scales in double precision");
  uint16_t f16[2] = {FloatToHalf(1.0f), FloatToHalf(3.0f)};
  ScaleBuffer(f16, 2, DataType::kFloat16, 0.25);
  Check(f16[0] == FloatToHalf(0.25f) && f16[1] == FloatToHalf(0.75f), "float16 scale by 0.25");
  uint16_t bf16[1] = {FloatToBFloat16(6.0f)};
  ScaleBuffer(bf16, 1, DataType::kBFloat16, 0.5);
  Check(bf16[0] == FloatToBFloat16(3.0f), "bfloat16 scale by 0.5");
  int32_t i32[4] = {7, -7, 5, 1};
  ScaleBuffer(i32, 4, DataType::kInt32, 0.5);
  Check(i32[0] == 3 && i32[1] == -3 && i32[2] == 2 && i32[3] == 0, "int32 scale rounds toward zero");
  int8_t i8[3] = {100, -100, 3};
  ScaleBuffer(i8, 3, DataType::kInt8, 2.0);
  Check(i8[0] == 127 && i8[1] == -128 && i8[2] == 6, "int8 scale saturates");
  uint8_t u8[2] = {10, 255};
  ScaleBuffer(u8, 2, DataType::kUInt8, -1.0);
  Check(u8[0] == 0 && u8[1] == 0, "uint8 scale by -1 saturates at 0");
  int64_t i64[3] = {int64_t{1} << 62, (int64_t{1} << 62) + 1, -(int64_t{1} << 62)};
  int64_t exact[3] = {i64[0], i64[1], i64[2]};
  ScaleBuffer(i64, 3, DataType::kInt64, 1.0);
  Check(std::memcmp(i64, exact, sizeof(i64)) == 0, "int64 scale by 1 leaves values exact");
  ScaleBuffer(i64, 3, DataType::kInt64, 4.0);
  Check(i64[0] == std::numeric_limits<int64_t>::max() && i64[2] == std::numeric_limits<int64_t>::min(),
        "int64 scale saturates");
  int16_t i16[1] = {5};
  ScaleBuffer(i16, 1, DataType::kInt16, std::nan(""));
  Check(i16[0] == 0, "integer scale by NaN gives 0");
  uint8_t flags[2] = {1, 0};
  ScaleBuffer(flags, 2, DataType::kBool, 0.0);
  Check(flags[0] == 1 && flags[1] == 0, "bool is not scaled");
  std::vector<float> big(1003, 2.0f);
  ScaleBuffer(big.data(), 1003, DataType::kFloat32, 1.5);
  for (float v : big) Check(v == 3.0f, "float32 scale over a vector-length buffer");
  std::printf("ok  ScaleBuffer: floating precision, integer truncation and saturation, bool untouched\n");
}

}  // namespace

int main() {
  const char* features = KernelCpuFeatures();
  Check(features != nullptr && features[0] != '\0', "KernelCpuFeatures must name something");
  std::printf("ok  kernel dispatch: %s\n", features);
  CheckHalfConversions();
  CheckReduceInto();
  CheckFillNeutral();
  CheckScaleBuffer();
  CheckFloat16KernelsMatchPortable();
  std::printf("all reduce-kernel checks passed\n");
  return 0;
}
