// Hierarchical allgather for groups that span hosts (Horovod's HOROVOD_HIERARCHICAL_ALLGATHER).
//
// Members of one host reach each other through shared memory, members of different hosts through
// the network. A flat ring sends every block over every ring link but one, and a ring over N
// members spread on H hosts crosses hosts on at least H of its links, so each byte crosses the
// network H-1 or H times when hosts are contiguous in set order, and up to N-1 times when they
// interleave. Every other host needs each byte once: H-1 crossings. This algorithm does exactly
// that, keeping S = min_h L_h members of every host busy on the network (L_h members on host h).
//
// It works in host order: the blocks of host h's members, in set order, form the host's data D_h,
// and D_0 D_1 ... D_{H-1} lie end to end in a work buffer. When the hosts are contiguous in set
// order the work buffer is the output itself; otherwise (interleaved hosts) it is scratch, copied
// into set order at the end. D_h is cut into S shards, as evenly as possible in bytes.
//  1. local gather (ring inside each host): every member of host h ends with D_h.
//  2. cross-host gather, for each local index s < S: the H members with local index s, one per
//     host, gather shard s of every host's data (a ring among the hosts). Members with local index
//     >= S (on hosts larger than the smallest one) sit this phase out.
//  3. local share (ring inside each host, once per other host g): local member s < S contributes
//     shard s of D_g, the others nothing, so every member ends with all of D_g.
// The network carries each host's data once to each other host, split over S members per host.
// Phase 1 costs each member (L-1)/L of its host's data, phase 3 the data of the other hosts, as a
// ring would. The phases take (L-1) + (H-1) + (H-1)(L-1) = N-1 steps on even hosts, as many as the
// flat ring, of which only H-1 cross hosts: no message size favours the flat ring.
//
// Blocks are only copied, so every member ends with bitwise identical bytes.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/host_topology.h"
#include "collectives/ring_phases.h"

namespace horo {
namespace {

// Where every member's block and every host's data lie in the work buffer (host order).
struct HostOrder {
  std::vector<int64_t> member_at;   // member m's block starts member_at[m] bytes in
  std::vector<int64_t> host_begin;  // D_h starts host_begin[h] bytes in
  std::vector<int64_t> host_bytes;  // and is host_bytes[h] long
  bool is_set_order = true;         // every block lies where the output has it
};

HostOrder LayOutByHost(const HostTopology& topology, const std::vector<int64_t>& bytes_per_member) {
  HostOrder order;
  order.member_at.resize(bytes_per_member.size());
  int64_t running = 0, set_order_offset = 0;
  std::vector<int64_t> set_order_at(bytes_per_member.size());
  for (size_t m = 0; m < bytes_per_member.size(); ++m) {
    set_order_at[m] = set_order_offset;
    set_order_offset += bytes_per_member[m];
  }
  for (const std::vector<int>& members : topology.hosts) {
    order.host_begin.push_back(running);
    for (int m : members) {
      order.member_at[m] = running;
      order.is_set_order = order.is_set_order && running == set_order_at[m];
      running += bytes_per_member[m];
    }
    order.host_bytes.push_back(running - order.host_begin.back());
  }
  return order;
}

// Shard s of S of host h's data, as a block of the work buffer.
void ShardOf(const HostOrder& order, int host, int shard, int shards, int64_t* offset, int64_t* bytes) {
  const int64_t total = order.host_bytes[host];
  const int64_t base = total / shards, extra = total % shards;
  *offset = order.host_begin[host] + shard * base + std::min<int64_t>(shard, extra);
  *bytes = base + (shard < extra ? 1 : 0);
}

}  // namespace

Status AllgatherHierarchical(const CommGroup& group, const HostTopology& topology, const void* input, void* output,
                             const std::vector<int64_t>& bytes_per_member) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allgather hierarchical"));
  HORO_RETURN_IF_ERROR(CheckMemberSizes(bytes_per_member, group.size(), "allgather hierarchical", "size"));
  HORO_RETURN_IF_ERROR(CheckHostTopology(group, topology, "allgather hierarchical"));
  int64_t total = 0;
  for (int64_t b : bytes_per_member) total += b;
  if (total == 0) return Status::OK();

  const HostOrder order = LayOutByHost(topology, bytes_per_member);
  std::vector<uint8_t> scratch;
  uint8_t* work = static_cast<uint8_t*>(output);
  if (!order.is_set_order) {
    scratch.resize(static_cast<size_t>(total));
    work = scratch.data();
  }
  uint8_t* own_block = work + order.member_at[group.index];
  if (bytes_per_member[group.index] > 0 && input != own_block) {
    std::memmove(own_block, input, static_cast<size_t>(bytes_per_member[group.index]));
  }

  const CommGroup local = LocalGroup(group, topology);
  const std::vector<int>& host_members = topology.hosts[topology.host];
  // 1. Local gather: the blocks of this host's members.
  RingBlocks local_blocks;
  for (int m : host_members) {
    local_blocks.offset.push_back(order.member_at[m]);
    local_blocks.bytes.push_back(bytes_per_member[m]);
  }
  HORO_RETURN_IF_ERROR(RingAllgather(local, work, local_blocks, /*start_shift=*/0, "allgather hierarchical local gather"));

  // 2. Cross-host gather of shard s of every host's data among the members with local index s.
  const int shards = topology.min_local_size();
  const int shard = topology.local_index;
  if (shard < shards) {
    const CommGroup cross = CrossGroup(group, topology);  // every host, in host order
    RingBlocks cross_blocks;
    for (int h = 0; h < topology.num_hosts(); ++h) {
      int64_t offset = 0, bytes = 0;
      ShardOf(order, h, shard, shards, &offset, &bytes);
      cross_blocks.offset.push_back(offset);
      cross_blocks.bytes.push_back(bytes);
    }
    HORO_RETURN_IF_ERROR(RingAllgather(cross, work, cross_blocks, /*start_shift=*/0, "allgather hierarchical cross-host"));
  }

  // 3. Local share of every other host's data, one ring per host; members >= shards hold nothing.
  for (int g = 0; g < topology.num_hosts() && local.size() > 1; ++g) {
    if (g == topology.host) continue;
    RingBlocks share_blocks;
    for (int l = 0; l < local.size(); ++l) {
      int64_t offset = order.host_begin[g], bytes = 0;
      if (l < shards) ShardOf(order, g, l, shards, &offset, &bytes);
      share_blocks.offset.push_back(offset);
      share_blocks.bytes.push_back(bytes);
    }
    HORO_RETURN_IF_ERROR(RingAllgather(local, work, share_blocks, /*start_shift=*/0, "allgather hierarchical local share"));
  }

  if (!order.is_set_order) {
    uint8_t* out = static_cast<uint8_t*>(output);
    int64_t offset = 0;
    for (int m = 0; m < group.size(); ++m) {
      if (bytes_per_member[m] > 0) std::memcpy(out + offset, work + order.member_at[m], bytes_per_member[m]);
      offset += bytes_per_member[m];
    }
  }
  return Status::OK();
}

}  // namespace horo
