// Helpers shared by the collective algorithms: checking a CommGroup and exchanging bytes with
// members addressed by their index in the group rather than by global rank.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/collectives.h"

namespace horo {

// InvalidArgument unless the group has a transport, at least one member and a valid own index,
// and its size agrees with what the transport can reach.
Status CheckGroup(const CommGroup& group, const char* collective);

// InvalidArgument unless sizes has one non-negative entry per member. what names the entries in
// messages, e.g. "send size".
Status CheckMemberSizes(const std::vector<int64_t>& sizes, int members, const char* collective, const char* what);

// InvalidArgument unless op is Sum, Min, Max or Product.
Status CheckReduceOp(ReduceOp op, const char* collective);

// One step of an algorithm: sends send_bytes to member send_index while receiving recv_bytes from
// member recv_index. An index of -1 or a length of 0 skips that direction (both sides of a step
// always agree on the lengths, so they skip together). A failure keeps its code and gains the
// prefix "<phase> step <step>: ". uncached: the received bytes may be written past the caches
// (Transport::SendRecvUncached), for a destination nobody reads again soon.
Status ExchangeWithMembers(const CommGroup& group, int send_index, const void* send_data, int64_t send_bytes,
                           int recv_index, void* recv_data, int64_t recv_bytes, const char* phase, int step,
                           bool uncached = false);

// ExchangeWithMembers whose received elements are reduced into recv_data (recv_data[i] =
// recv_data[i] op received[i], the order ReduceInto uses) instead of overwriting it: straight from
// the transport where it can (Transport::SendRecvReduce: shared memory), else through *scratch,
// grown to recv_bytes only then. recv_bytes is a whole number of elements. Same results either way.
Status ExchangeReduceWithMembers(const CommGroup& group, int send_index, const void* send_data, int64_t send_bytes,
                                 int recv_index, void* recv_data, int64_t recv_bytes, DataType dtype, ReduceOp op,
                                 std::vector<uint8_t>* scratch, const char* phase, int step);

}  // namespace horo
