// Arithmetic the Executor's steps share (executor.cc, executor_contributions.cc): rows, the parts
// of a reducescatter, and the scale factors around a reduction.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "collectives/reduce_kernels.h"
#include "common/dtype.h"
#include "coordinator/response.h"

namespace horo {

inline int64_t RowElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

// A reducescatter of dim0 rows over n members: member i's part has PartRows rows (the first
// dim0 % n parts one more) and starts at row PartFirstRow.
inline int64_t PartRows(int64_t dim0, int n, int i) { return dim0 / n + (i < dim0 % n ? 1 : 0); }
inline int64_t PartFirstRow(int64_t dim0, int n, int i) { return i * (dim0 / n) + std::min<int64_t>(i, dim0 % n); }

// Average is a sum followed by a division by the number of members, folded into the postscale.
inline ReduceOp CollectiveOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

inline void Scale(void* buffer, int64_t count, DataType dtype, double factor) {
  if (factor != 1.0) ScaleBuffer(buffer, count, dtype, factor);
}

// The factor a floating-point result is multiplied by: the postscale, divided by the number of
// members for Average.
inline double PostscaleFactor(const Response& r, int members) {
  return r.reduce_op == ReduceOp::kAverage ? r.postscale_factor / members : r.postscale_factor;
}

// Applies the postscale factor, and for Average the division by the number of members. An integer
// Average without a postscale divides exactly (truncating, and exact beyond 2^53 for int64); with
// one it scales once by postscale / members, as Horovod does, so that the product is not saturated
// to the type's range before the division (int8 60 * 3 / 2 is 90, not 127 / 2).
inline void Postscale(void* buffer, int64_t count, const Response& r, int members) {
  if (r.reduce_op == ReduceOp::kAverage && !IsFloatingPoint(r.dtype) && r.postscale_factor == 1.0) {
    DivideBuffer(buffer, count, r.dtype, members);
  } else {
    Scale(buffer, count, r.dtype, PostscaleFactor(r, members));
  }
}

}  // namespace horo
