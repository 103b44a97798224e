// Alltoall by pairwise exchange.
//
// Member i's input holds one block per destination, in set order, block j being send_bytes[j]
// bytes; its output receives one block per source, block j being recv_bytes[j] bytes (either may
// be zero). Member i copies its own block locally, then in step k = 1 .. N-1 sends block (i+k) mod N
// to member (i+k) mod N while receiving from member (i-k) mod N. In every step each member sends
// to exactly one member and receives from exactly one, so the N-1 steps form N-1 permutations of
// the group and no link is ever used twice at the same time.
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"

namespace horo {
namespace {

std::vector<int64_t> Offsets(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> offsets(sizes.size(), 0);
  for (size_t j = 1; j < sizes.size(); ++j) offsets[j] = offsets[j - 1] + sizes[j - 1];
  return offsets;
}

}  // namespace

Status Alltoall(const CommGroup& group, const void* input, const std::vector<int64_t>& send_bytes, void* output,
                const std::vector<int64_t>& recv_bytes) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "alltoall"));
  const int members = group.size();
  const int me = group.index;
  HORO_RETURN_IF_ERROR(CheckMemberSizes(send_bytes, members, "alltoall", "send size"));
  HORO_RETURN_IF_ERROR(CheckMemberSizes(recv_bytes, members, "alltoall", "receive size"));
  if (send_bytes[me] != recv_bytes[me]) {
    return Status::InvalidArgument("alltoall: member " + std::to_string(me) + " sends " +
                                   std::to_string(send_bytes[me]) + " bytes to itself but expects " +
                                   std::to_string(recv_bytes[me]));
  }

  const std::vector<int64_t> send_offset = Offsets(send_bytes);
  const std::vector<int64_t> recv_offset = Offsets(recv_bytes);
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = static_cast<uint8_t*>(output);
  if (send_bytes[me] > 0) {
    std::memmove(out + recv_offset[me], in + send_offset[me], static_cast<size_t>(send_bytes[me]));
  }

  for (int step = 1; step < members; ++step) {
    const int destination = (me + step) % members;
    const int source = (me - step + members) % members;
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, destination, in + send_offset[destination], send_bytes[destination],
                                             source, out + recv_offset[source], recv_bytes[source],
                                             "alltoall pairwise", step));
  }
  return Status::OK();
}

}  // namespace horo
