// Adasum, Horovod's adaptive summation of gradients (Maleki et al., "Scaling Distributed Training
// with Adaptive Summation", MLSys 2021): two vectors combine as
//
//   a (+) b = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
//
// (a coefficient stays 1 when its vector's squared norm is below sqrt(DBL_MIN), about 1.5e-154,
// as in Horovod), which sums orthogonal gradients and averages parallel ones. Ranks combine pairwise, level by level, as Horovod's
// recursive halving does for a power-of-two number of ranks: ((v0 (+) v1) (+) (v2 (+) v3)) ...;
// an unpaired vector at a level moves up unchanged. Dot products and norms accumulate in double.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace horo {

// Whether Adasum is defined for dtype (the floating-point types).
bool AdasumSupports(DataType dtype);

// Combines vectors[0..n) (one per member, in member order, count elements of dtype each) into
// vectors[0]; the other vectors are overwritten. Every member that combines the same vectors gets
// the same bits.
void AdasumCombine(const std::vector<void*>& vectors, int64_t count, DataType dtype);

}  // namespace horo
