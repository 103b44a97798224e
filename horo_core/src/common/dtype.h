// DataType and ReduceOp: the core's names for the C ABI enums, plus element sizes and names.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "horo/horo.h"

namespace horo {

enum class DataType : int32_t {
  kUInt8 = HORO_UINT8,
  kInt8 = HORO_INT8,
  kInt16 = HORO_INT16,
  kInt32 = HORO_INT32,
  kInt64 = HORO_INT64,
  kFloat16 = HORO_FLOAT16,
  kBFloat16 = HORO_BFLOAT16,
  kFloat32 = HORO_FLOAT32,
  kFloat64 = HORO_FLOAT64,
  kBool = HORO_BOOL,
  kUInt16 = HORO_UINT16,
};

enum class ReduceOp : int32_t {
  kAverage = HORO_OP_AVERAGE,
  kSum = HORO_OP_SUM,
  kAdasum = HORO_OP_ADASUM,
  kMin = HORO_OP_MIN,
  kMax = HORO_OP_MAX,
  kProduct = HORO_OP_PRODUCT,
};

enum class OpType : int32_t {
  kAllreduce = HORO_ALLREDUCE,
  kAllgather = HORO_ALLGATHER,
  kBroadcast = HORO_BROADCAST,
  kAlltoall = HORO_ALLTOALL,
  kReducescatter = HORO_REDUCESCATTER,
  kBarrier = HORO_BARRIER,
  kJoin = HORO_JOIN,
};

bool IsValidDataType(int32_t value);
bool IsValidReduceOp(int32_t value);
bool IsValidOpType(int32_t value);
bool IsFloatingPoint(DataType dtype);

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
const char* ReduceOpName(ReduceOp op);
const char* OpTypeName(OpType op);

}  // namespace horo
