// Ring reducescatter: the scatter-reduce phase of ring allreduce on its own.
//
// The input holds N blocks laid end to end, block i having counts_per_member[i] elements (any of
// them may be zero). N-1 steps around the ring (member i sends to i+1, receives from i-1, see
// ring_phases.h) leave member i with block i reduced over all members, which it copies to output.
// Each member sends and receives (N-1)/N of the input; only one scratch chunk of at most
// options.chunk_bytes is allocated. Every block is reduced by one fixed chain of members, so the
// result does not depend on timing.
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/ring_phases.h"

namespace horo {

Status Reducescatter(const CommGroup& group, void* input, void* output,
                     const std::vector<int64_t>& counts_per_member, DataType dtype, ReduceOp op,
                     const AllreduceOptions& options) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "reducescatter"));
  HORO_RETURN_IF_ERROR(CheckReduceOp(op, "reducescatter"));
  const int members = group.size();
  HORO_RETURN_IF_ERROR(CheckMemberSizes(counts_per_member, members, "reducescatter", "count"));
  if (options.chunk_bytes <= 0) {
    return Status::InvalidArgument("reducescatter: chunk_bytes must be positive, got " +
                                   std::to_string(options.chunk_bytes));
  }

  const RingBlocks blocks = RingBlocksFromCounts(counts_per_member, static_cast<int64_t>(DataTypeSize(dtype)));
  uint8_t* bytes = static_cast<uint8_t*>(input);
  if (members > 1) {
    HORO_RETURN_IF_ERROR(RingScatterReduce(group, bytes, blocks, dtype, op, options.chunk_bytes, /*final_shift=*/0,
                                           "reducescatter ring"));
  }
  const int64_t own_bytes = blocks.bytes[group.index];
  if (own_bytes > 0 && output != bytes + blocks.offset[group.index]) {
    std::memmove(output, bytes + blocks.offset[group.index], static_cast<size_t>(own_bytes));
  }
  return Status::OK();
}

}  // namespace horo
