// Broadcast along a binomial tree, pipelined in chunks.
//
// Members are renumbered relative to the root (relative = (index - root + N) mod N). In a binomial
// tree the parent of relative member r is r with its lowest set bit cleared, and its children are
// r + 2^j for every 2^j below that bit (the root has every power of two below N), so the data
// reaches all N members in ceil(log2 N) rounds and no member sends more than log2 N copies.
// Children are served farthest first: the child with the largest subtree starts forwarding soonest.
//
// Large buffers travel in chunks of kChunkBytes: a member forwards chunk c to its children as soon
// as it has it and then receives chunk c+1, so the levels of the tree work at the same time and the
// time approaches (size / bandwidth) + depth * (chunk / bandwidth) instead of depth * size / bandwidth.
#include <algorithm>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"

namespace horo {
namespace {

constexpr int64_t kChunkBytes = 1 << 20;

}  // namespace

Status Broadcast(const CommGroup& group, void* buffer, int64_t bytes, int root_index) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "broadcast"));
  const int members = group.size();
  if (root_index < 0 || root_index >= members) {
    return Status::InvalidArgument("broadcast: root index " + std::to_string(root_index) + " is outside a group of " +
                                   std::to_string(members));
  }
  if (bytes < 0) return Status::InvalidArgument("broadcast: negative size " + std::to_string(bytes));
  if (members == 1 || bytes == 0) return Status::OK();

  const int relative = (group.index - root_index + members) % members;
  auto member_of = [&](int relative_index) { return (relative_index + root_index) % members; };
  int lowest_bit = 1;
  while (lowest_bit < members && (relative & lowest_bit) == 0) lowest_bit <<= 1;
  const int parent = relative == 0 ? -1 : member_of(relative - lowest_bit);
  std::vector<int> children;  // farthest first
  for (int distance = lowest_bit >> 1; distance > 0; distance >>= 1) {
    if (relative + distance < members) children.push_back(member_of(relative + distance));
  }

  uint8_t* data = static_cast<uint8_t*>(buffer);
  int64_t chunk_index = 0;
  for (int64_t begin = 0; begin < bytes; begin += kChunkBytes, ++chunk_index) {
    const int64_t length = std::min(kChunkBytes, bytes - begin);
    const int step = static_cast<int>(chunk_index);  // errors name the chunk as the step
    if (parent >= 0) {
      HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, -1, nullptr, 0, parent, data + begin, length,
                                               "broadcast receive from parent", step));
    }
    for (int child : children) {
      HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, child, data + begin, length, -1, nullptr, 0,
                                               "broadcast send to child", step));
    }
  }
  return Status::OK();
}

}  // namespace horo
