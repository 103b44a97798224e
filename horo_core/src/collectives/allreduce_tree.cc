// Small-message allreduce by recursive doubling, and the Allreduce entry point that picks between it
// and the ring.
//
// Recursive doubling: with N a power of two, in step k (k = 0 .. log2 N - 1) member i exchanges its
// whole partial result with member i XOR 2^k and both combine the two. After log2 N steps everyone
// holds the full reduction. That is log2 N latencies instead of the ring's 2 (N-1), while sending
// the whole message every step, which is the right trade for small messages. A direct exchange
// (everyone sends to everyone) would need N-1 transport round trips per member, so it loses for N > 2.
//
// When N is not a power of two, let P be the largest power of two below N and E = N - P the extra
// members. First each extra member P + e folds its data into member e and sits out; the first P
// members run recursive doubling; finally member e sends the result back to member P + e. That
// costs two more latencies and nothing else.
//
// Bitwise identical results: floating-point combination is not associative, and for NaN payloads
// and signed zeros Min/Max are not even commutative. So each pair forms "lower op upper", the
// partial result of the lower-indexed side always being the left operand, on both members of the
// pair. By induction every member of a 2^k-aligned group of indices holds the same bytes after step
// k, and the folded-out members receive a copy, so all members end bitwise identical.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/reduce_kernels.h"

namespace horo {

Status AllreduceSmall(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allreduce recursive doubling"));
  HORO_RETURN_IF_ERROR(CheckReduceOp(op, "allreduce recursive doubling"));
  if (count < 0) {
    return Status::InvalidArgument("allreduce recursive doubling: negative count " + std::to_string(count));
  }
  const int members = group.size();
  if (members == 1 || count == 0) return Status::OK();

  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(dtype));
  const int me = group.index;
  int power = 1;
  while (power * 2 <= members) power *= 2;
  const int extras = members - power;

  if (me >= power) {
    // An extra member: hand the data to member me - P, then wait for the result.
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, me - power, buffer, bytes, -1, nullptr, 0,
                                             "allreduce recursive doubling fold", 0));
    return ExchangeWithMembers(group, -1, nullptr, 0, me - power, buffer, bytes,
                               "allreduce recursive doubling unfold", 0);
  }

  std::vector<uint8_t> scratch(static_cast<size_t>(bytes));
  uint8_t* partial = static_cast<uint8_t*>(buffer);  // this member's partial result
  uint8_t* incoming = scratch.data();                 // the partner's partial result
  if (me < extras) {
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, -1, nullptr, 0, me + power, incoming, bytes,
                                             "allreduce recursive doubling fold", 0));
    ReduceInto(partial, incoming, count, dtype, op);  // me < me + P: own data on the left
  }

  int step = 0;
  for (int distance = 1; distance < power; distance *= 2, ++step) {
    const int partner = me ^ distance;
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, partner, partial, bytes, partner, incoming, bytes,
                                             "allreduce recursive doubling", step));
    if (me < partner) {
      ReduceInto(partial, incoming, count, dtype, op);
    } else {
      ReduceInto(incoming, partial, count, dtype, op);
      std::swap(partial, incoming);
    }
  }

  if (partial != buffer) std::memcpy(buffer, partial, static_cast<size_t>(bytes));
  if (me < extras) {
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, me + power, buffer, bytes, -1, nullptr, 0,
                                             "allreduce recursive doubling unfold", 0));
  }
  return Status::OK();
}

namespace {

bool IsSmallMessage(int64_t count, DataType dtype, const AllreduceOptions& options) {
  return count * static_cast<int64_t>(DataTypeSize(dtype)) <= options.small_message_bytes;
}

}  // namespace

Status Allreduce(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op,
                 const AllreduceOptions& options) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allreduce"));
  HORO_RETURN_IF_ERROR(CheckReduceOp(op, "allreduce"));
  if (count < 0) return Status::InvalidArgument("allreduce: negative count " + std::to_string(count));
  if (group.size() == 1 || count == 0) return Status::OK();
  if (IsSmallMessage(count, dtype, options)) return AllreduceSmall(group, buffer, count, dtype, op);
  return AllreduceRing(group, buffer, count, dtype, op, options);
}

const char* AllreduceAlgorithmName(const CommGroup& group, int64_t count, DataType dtype,
                                   const AllreduceOptions& options) {
  if (group.size() <= 1 || count <= 0) return nullptr;
  return IsSmallMessage(count, dtype, options) ? "RECURSIVE_DOUBLING_ALLREDUCE" : "RING_ALLREDUCE";
}

}  // namespace horo
