// Shared by the C++ tests of the collective algorithms: exact value patterns (every member
// contributes small integers whose folds are exactly representable in every dtype, and the expected
// result is the same fold computed in double), byte-exact comparison, and a harness that runs one
// thread per member over the loopback transport.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "common/half.h"
#include "transport/loopback/transport.h"
#include "unit_check.h"

namespace horo_test {

using namespace horo;

inline const DataType kAllTypes[] = {DataType::kUInt8,   DataType::kInt8,    DataType::kInt16,    DataType::kInt32,
                              DataType::kInt64,   DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                              DataType::kFloat64, DataType::kBool,     DataType::kUInt16};
inline const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};
// Every value pattern repeats with this period (lcm of the moduli used by Contribution).
inline constexpr int64_t kPeriod = 660;

// Value checks made so far, printed at the end of each test program.
inline std::atomic<long> g_checks{0};

// ---- exact value patterns --------------------------------------------------------------------

inline bool IsUnsigned(DataType dtype) { return dtype == DataType::kUInt8 || dtype == DataType::kUInt16; }

// What member m contributes at element j: small integers whose folds stay exact and in range.
inline double Contribution(int m, int64_t j, ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) {
    if (op == ReduceOp::kProduct || op == ReduceOp::kMin) return (m + j) % 5 != 0;  // and: mostly true
    return (m + j) % 3 == 0;                                                      // or: mostly false
  }
  switch (op) {
    case ReduceOp::kSum: return (m + 1) + (j % 3);  // at most 36 + 16 = 52 for 8 members
    case ReduceOp::kProduct: {
      double value = (m + j) % 4 == 0 ? 2 : 1;      // at most two factors 2 among 8 members
      if (!IsUnsigned(dtype) && (3 * m + j) % 5 == 1) value = -value;
      return value;
    }
    default: return static_cast<double>((7 * m + 3 * j) % 11) - (IsUnsigned(dtype) ? 0 : 5);
  }
}

inline double Combine(double a, double b, ReduceOp op, DataType dtype) {
  if (dtype == DataType::kBool) return (op == ReduceOp::kProduct || op == ReduceOp::kMin) ? (a && b) : (a || b);
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return std::min(a, b);
    default: return std::max(a, b);
  }
}

inline void Encode(double value, DataType dtype, uint8_t* at) {
  switch (dtype) {
    case DataType::kUInt8: { uint8_t v = static_cast<uint8_t>(value); std::memcpy(at, &v, 1); break; }
    case DataType::kInt8: { int8_t v = static_cast<int8_t>(value); std::memcpy(at, &v, 1); break; }
    case DataType::kInt16: { int16_t v = static_cast<int16_t>(value); std::memcpy(at, &v, 2); break; }
    case DataType::kUInt16: { uint16_t v = static_cast<uint16_t>(value); std::memcpy(at, &v, 2); break; }
    case DataType::kInt32: { int32_t v = static_cast<int32_t>(value); std::memcpy(at, &v, 4); break; }
    case DataType::kInt64: { int64_t v = static_cast<int64_t>(value); std::memcpy(at, &v, 8); break; }
    case DataType::kFloat16: { uint16_t v = FloatToHalf(static_cast<float>(value)); std::memcpy(at, &v, 2); break; }
    case DataType::kBFloat16: { uint16_t v = FloatToBFloat16(static_cast<float>(value)); std::memcpy(at, &v, 2); break; }
    case DataType::kFloat32: { float v = static_cast<float>(value); std::memcpy(at, &v, 4); break; }
    case DataType::kFloat64: std::memcpy(at, &value, 8); break;
    case DataType::kBool: *at = value != 0; break;
  }
}

inline double Decode(const uint8_t* at, DataType dtype) {
  uint16_t h;
  switch (dtype) {
    case DataType::kUInt8: return *at;
    case DataType::kInt8: return static_cast<int8_t>(*at);
    case DataType::kInt16: { int16_t v; std::memcpy(&v, at, 2); return v; }
    case DataType::kUInt16: { uint16_t v; std::memcpy(&v, at, 2); return v; }
    case DataType::kInt32: { int32_t v; std::memcpy(&v, at, 4); return v; }
    case DataType::kInt64: { int64_t v; std::memcpy(&v, at, 8); return static_cast<double>(v); }
    case DataType::kFloat16: std::memcpy(&h, at, 2); return HalfToFloat(h);
    case DataType::kBFloat16: std::memcpy(&h, at, 2); return BFloat16ToFloat(h);
    case DataType::kFloat32: { float v; std::memcpy(&v, at, 4); return v; }
    case DataType::kFloat64: { double v; std::memcpy(&v, at, 8); return v; }
    case DataType::kBool: return *at;
  }
  return 0;
}

// count elements of dtype whose element j is value(j % kPeriod), built by tiling one period.
inline std::vector<uint8_t> Tiled(int64_t count, DataType dtype, const std::function<double(int64_t)>& value) {
  const size_t size = DataTypeSize(dtype);
  const int64_t period = std::min(count, kPeriod);
  std::vector<uint8_t> bytes(count * size);
  for (int64_t j = 0; j < period; ++j) Encode(value(j), dtype, bytes.data() + j * size);
  for (int64_t j = period; j < count; j += period) {
    std::memcpy(bytes.data() + j * size, bytes.data(), std::min(period, count - j) * size);
  }
  return bytes;
}

inline std::vector<uint8_t> MemberInput(int m, int64_t count, DataType dtype, ReduceOp op) {
  return Tiled(count, dtype, [&](int64_t j) { return Contribution(m, j, op, dtype); });
}

inline std::vector<uint8_t> ExpectedReduction(int members, int64_t count, DataType dtype, ReduceOp op) {
  return Tiled(count, dtype, [&](int64_t j) {
    double acc = Contribution(0, j, op, dtype);
    for (int m = 1; m < members; ++m) acc = Combine(acc, Contribution(m, j, op, dtype), op, dtype);
    return acc;
  });
}

inline void ExpectBytes(const uint8_t* got, const uint8_t* want, int64_t count, DataType dtype, const std::string& what) {
  ++g_checks;
  const size_t size = DataTypeSize(dtype);
  if (count == 0 || std::memcmp(got, want, count * size) == 0) return;
  int64_t j = 0;
  while (std::memcmp(got + j * size, want + j * size, size) == 0) ++j;
  Fail(what + ": element " + std::to_string(j) + " is " + std::to_string(Decode(got + j * size, dtype)) +
       ", expected " + std::to_string(Decode(want + j * size, dtype)));
}

inline std::string Label(const CommGroup& g, const std::string& rest) {
  return "[members " + std::to_string(g.size()) + ", member " + std::to_string(g.index) + "] " + rest;
}

// ---- harness -----------------------------------------------------------------------------------

// Runs body(group) on one thread per member of `ranks` (global ranks, in set order) of a world of
// world_size loopback transports, spread over hosts by host_ids (default: all on one host).
inline void RunGroup(int world_size, const std::vector<int>& ranks, const std::function<void(const CommGroup&)>& body,
                     const std::vector<int>& host_ids = {}) {
  auto hub = std::make_shared<LoopbackHub>(world_size, host_ids);
  std::vector<std::unique_ptr<LoopbackTransport>> transports;
  for (int r = 0; r < world_size; ++r) transports.push_back(std::make_unique<LoopbackTransport>(hub, r, 60.0));
  std::vector<std::thread> threads;
  for (int m = 0; m < static_cast<int>(ranks.size()); ++m) {
    threads.emplace_back([&, m] {
      CommGroup group;
      group.transport = transports[ranks[m]].get();
      group.ranks = ranks;
      group.index = m;
      body(group);
    });
  }
  for (auto& t : threads) t.join();
}

inline void RunWorld(int size, const std::function<void(const CommGroup&)>& body) {
  std::vector<int> ranks(size);
  std::iota(ranks.begin(), ranks.end(), 0);
  RunGroup(size, ranks, body);
}

}  // namespace horo_test
