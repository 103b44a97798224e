// Ring allreduce (Patarasuk & Yuan; popularised for deep learning by Baidu).
//
// The count elements are cut into N blocks, one per member, as evenly as possible: the first
// count % N blocks get one element more than the rest, and blocks may be empty when count < N. The
// algorithm then runs two phases of N-1 steps each around the ring (member i sends to i+1 and
// receives from i-1, see ring_phases.h):
//  1. scatter-reduce: after N-1 steps member i holds block (i+1) fully reduced over all members;
//  2. allgather: the reduced blocks travel once around the ring, so every member ends with all N.
// Each member sends and receives 2 (N-1)/N of the buffer in total, which is optimal in bandwidth,
// at the price of 2 (N-1) latencies; small messages therefore use AllreduceSmall instead. Reduced
// blocks are computed once and then copied, so the result is bitwise identical on every member.
//
// The scatter-reduce moves each block in chunks of options.chunk_bytes, and receives through one
// scratch buffer of at most one chunk where the transport cannot reduce on receive.
//
// When every member is on this host (options.topology), both phases run slice by slice instead:
// slice k is the k-th options.slice_bytes of every block, and it goes through the scatter-reduce
// and then the allgather before slice k+1 starts. A reduced slice is sent on while it is still in
// this core's cache, and a received reduced slice lands on bytes that were sent moments before;
// run phase after phase, the allgather would read and write the whole buffer again from memory
// once it outgrows the cache (docs/benchmarks.md, "Ring slices": 15-42 % faster from 64 MB up).
// The price is 2 (N-1) steps per slice, cheap over shared memory but a round trip each over a
// network, so rings that cross hosts (or whose hosts are unknown) keep the phases whole, and so
// do rings on one host when slice_bytes is 0 (rank 0 stamps that when shared memory is off). The
// topology and the slice size are the same on every member, so all cut the same slices.
//
// options.ring_postscale is applied by each member to the block (or slice) it has just finished
// reducing, before the allgather copies it on: every member still ends with the same bits.
//
// A message of options.uncached_result_bytes or more receives the last block of its allgather past
// the caches (non-temporal stores over shared memory): that block is result that no step of this
// algorithm reads again, and too large to stay cached until the caller reads it. Every other block
// stays in the cache, since the allgather sends it on (with 2 members the one received block is
// the last).
#include <algorithm>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/host_topology.h"
#include "collectives/reduce_kernels.h"
#include "collectives/ring_phases.h"

namespace horo {

Status AllreduceRing(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op,
                     const AllreduceOptions& options) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allreduce ring"));
  HORO_RETURN_IF_ERROR(CheckReduceOp(op, "allreduce ring"));
  if (count < 0) return Status::InvalidArgument("allreduce ring: negative count " + std::to_string(count));
  if (options.chunk_bytes <= 0 || options.slice_bytes < 0) {
    return Status::InvalidArgument("allreduce ring: chunk_bytes must be positive and slice_bytes not negative, got " +
                                   std::to_string(options.chunk_bytes) + " and " + std::to_string(options.slice_bytes));
  }
  if (options.ring_postscale != 1.0 && !IsFloatingPoint(dtype)) {
    return Status::InvalidArgument(std::string("allreduce ring: a postscale needs a floating-point type, got ") +
                                   DataTypeName(dtype));
  }
  const int members = group.size();
  if (members == 1 || count == 0) {
    ScaleBuffer(buffer, count, dtype, options.ring_postscale);
    return Status::OK();
  }

  std::vector<int64_t> block_counts(members, count / members);
  for (int64_t b = 0; b < count % members; ++b) ++block_counts[b];
  const RingBlocks blocks = RingBlocksFromCounts(block_counts, static_cast<int64_t>(DataTypeSize(dtype)));

  uint8_t* bytes = static_cast<uint8_t*>(buffer);
  const int64_t element_size = static_cast<int64_t>(DataTypeSize(dtype));
  // After the scatter-reduce this member holds block index + 1 (final_shift) fully reduced.
  const int reduced = (group.index + 1) % members;
  auto scale_reduced = [&](const RingBlocks& part) {
    ScaleBuffer(bytes + part.offset[reduced], part.bytes[reduced] / element_size, dtype, options.ring_postscale);
  };
  const bool one_host = options.topology != nullptr && options.topology->num_hosts() == 1;
  const bool uncached = count * element_size >= options.uncached_result_bytes;
  if (!one_host || options.slice_bytes == 0) {
    HORO_RETURN_IF_ERROR(RingScatterReduce(group, bytes, blocks, dtype, op, options.chunk_bytes, /*final_shift=*/1,
                                           "allreduce ring scatter-reduce"));
    scale_reduced(blocks);
    return RingAllgather(group, bytes, blocks, /*start_shift=*/1, "allreduce ring allgather", uncached);
  }
  const int64_t slice_bytes = std::max<int64_t>(1, options.slice_bytes / element_size) * element_size;
  const int64_t longest = *std::max_element(blocks.bytes.begin(), blocks.bytes.end());
  RingBlocks slice = blocks;
  for (int64_t begin = 0; begin < longest; begin += slice_bytes) {
    for (int b = 0; b < members; ++b) {
      const int64_t start = std::min(begin, blocks.bytes[b]);
      slice.offset[b] = blocks.offset[b] + start;
      slice.bytes[b] = std::min(slice_bytes, blocks.bytes[b] - start);
    }
    HORO_RETURN_IF_ERROR(RingScatterReduce(group, bytes, slice, dtype, op, slice_bytes, /*final_shift=*/1,
                                           "allreduce ring scatter-reduce"));
    scale_reduced(slice);
    HORO_RETURN_IF_ERROR(RingAllgather(group, bytes, slice, /*start_shift=*/1, "allreduce ring allgather", uncached));
  }
  return Status::OK();
}

}  // namespace horo
