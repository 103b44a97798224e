// The two phases of ring algorithms, shared by ring allreduce, reducescatter and allgather.
//
// The buffer is cut into one block per member (sizes may differ, and may be zero). Member i always
// sends to member i+1 and receives from member i-1 (mod N), so every link of the ring carries data
// in every step and each member sends and receives (N-1)/N of the buffer per phase.
//  * Scatter-reduce: N-1 steps. At step s member i sends block (i + final_shift - 1 - s) and
//    receives block (i + final_shift - 2 - s), which it reduces into its own copy. The received
//    block moves in chunks of at most chunk_bytes (rounded down to a multiple of 64 bytes, at least 64). Over shared memory each chunk is reduced
//    straight out of the ring (Transport::SendRecvReduce), which saves copying it into a scratch
//    buffer and reading it back; other transports receive it into one scratch buffer of chunk
//    size, so memory stays bounded whatever the message size. After the last step member i holds
//    the fully reduced block (i + final_shift): each block was reduced by exactly one chain of
//    members.
//  * Allgather: N-1 steps. Member i starts with block (i + start_shift) complete; at step s it
//    sends block (i + start_shift - s) and receives block (i + start_shift - s - 1) straight into
//    the buffer. Blocks are only copied, so every member ends with bitwise identical bytes. The
//    block received at step s is the one sent at step s+1, except at the last step: with uncached,
//    that last block may be written past the caches (Transport::SendRecvUncached).
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/collectives.h"

namespace horo {

// Block b of the buffer is bytes[b] bytes long and starts offset[b] bytes in.
struct RingBlocks {
  std::vector<int64_t> offset;
  std::vector<int64_t> bytes;
};

// Lays blocks of counts[b] elements of element_size bytes end to end.
RingBlocks RingBlocksFromCounts(const std::vector<int64_t>& counts, int64_t element_size);

// phase names the phase in error messages, e.g. "allreduce ring scatter-reduce".
Status RingScatterReduce(const CommGroup& group, uint8_t* buffer, const RingBlocks& blocks, DataType dtype,
                         ReduceOp op, int64_t chunk_bytes, int final_shift, const char* phase);

Status RingAllgather(const CommGroup& group, uint8_t* buffer, const RingBlocks& blocks, int start_shift,
                     const char* phase, bool uncached = false);

}  // namespace horo
