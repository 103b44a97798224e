// Ring allgather with a different number of bytes per member.
//
// The output holds N blocks laid end to end in set order, block i being bytes_per_member[i] bytes
// (possibly zero). Each member first places its own input in its block (unless the input already
// is that block), then N-1 steps move the blocks once around the ring: at step s member i sends
// block (i - s) to member i+1 and receives block (i - s - 1) from member i-1 straight into the
// output (see ring_phases.h). Each member sends and receives everything but its own block once,
// which is optimal in bandwidth; blocks are only copied, so all members end bitwise identical.
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/ring_phases.h"

namespace horo {

Status AllgatherRing(const CommGroup& group, const void* input, void* output,
                     const std::vector<int64_t>& bytes_per_member) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allgather"));
  const int members = group.size();
  HORO_RETURN_IF_ERROR(CheckMemberSizes(bytes_per_member, members, "allgather", "size"));

  const RingBlocks blocks = RingBlocksFromCounts(bytes_per_member, 1);
  uint8_t* bytes = static_cast<uint8_t*>(output);
  uint8_t* own_block = bytes + blocks.offset[group.index];
  if (blocks.bytes[group.index] > 0 && input != own_block) {
    std::memmove(own_block, input, static_cast<size_t>(blocks.bytes[group.index]));
  }
  return RingAllgather(group, bytes, blocks, /*start_shift=*/0, "allgather ring");
}

}  // namespace horo
