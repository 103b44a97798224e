#include "collectives/ring_phases.h"

#include <algorithm>
#include <numeric>

#include "collectives/group_io.h"

namespace horo {
namespace {

int Wrap(int64_t block, int members) { return static_cast<int>(((block % members) + members) % members); }

}  // namespace

RingBlocks RingBlocksFromCounts(const std::vector<int64_t>& counts, int64_t element_size) {
  RingBlocks blocks;
  int64_t running = 0;
  for (int64_t count : counts) {
    blocks.offset.push_back(running);
    blocks.bytes.push_back(count * element_size);
    running += count * element_size;
  }
  return blocks;
}

Status RingScatterReduce(const CommGroup& group, uint8_t* buffer, const RingBlocks& blocks, DataType dtype,
                         ReduceOp op, int64_t chunk_bytes, int final_shift, const char* phase) {
  const int members = group.size();
  const int me = group.index;
  const int next = (me + 1) % members;
  const int previous = (me - 1 + members) % members;
  const int64_t element_size = static_cast<int64_t>(DataTypeSize(dtype));
  // Chunks hold whole elements and are a multiple of the data plane's message alignment, at least
  // one such unit. Each rank sets its chunk itself (HORO_CHUNK_BYTES), so the neighbour may cut a
  // block otherwise; that is allowed only at multiples of the alignment (transport.h), and the
  // pieces that end elsewhere, the blocks' last, every member cuts alike.
  const int64_t unit = std::lcm<int64_t>(kDataMessageAlignment, element_size);
  const int64_t chunk = std::max<int64_t>(1, chunk_bytes / unit) * unit;
  std::vector<uint8_t> scratch;  // only where the transport cannot reduce on receive

  for (int step = 0; step < members - 1; ++step) {
    const int send_block = Wrap(int64_t{me} + final_shift - 1 - step, members);
    const int recv_block = Wrap(int64_t{me} + final_shift - 2 - step, members);
    const int64_t send_bytes = blocks.bytes[send_block];
    const int64_t recv_bytes = blocks.bytes[recv_block];
    // The neighbour cuts the same two blocks the same way, so the chunk pairs line up.
    const int64_t chunks = (std::max(send_bytes, recv_bytes) + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * chunk;
      const int64_t send_len = std::max<int64_t>(0, std::min(chunk, send_bytes - begin));
      const int64_t recv_len = std::max<int64_t>(0, std::min(chunk, recv_bytes - begin));
      HORO_RETURN_IF_ERROR(ExchangeReduceWithMembers(group, next, buffer + blocks.offset[send_block] + begin,
                                                     send_len, previous, buffer + blocks.offset[recv_block] + begin,
                                                     recv_len, dtype, op, &scratch, phase, step));
    }
  }
  return Status::OK();
}

Status RingAllgather(const CommGroup& group, uint8_t* buffer, const RingBlocks& blocks, int start_shift,
                     const char* phase, bool uncached) {
  const int members = group.size();
  const int me = group.index;
  const int next = (me + 1) % members;
  const int previous = (me - 1 + members) % members;
  for (int step = 0; step < members - 1; ++step) {
    const int send_block = Wrap(int64_t{me} + start_shift - step, members);
    const int recv_block = Wrap(int64_t{me} + start_shift - step - 1, members);
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, next, buffer + blocks.offset[send_block], blocks.bytes[send_block],
                                             previous, buffer + blocks.offset[recv_block], blocks.bytes[recv_block],
                                             phase, step, uncached && step == members - 2));
  }
  return Status::OK();
}

}  // namespace horo
