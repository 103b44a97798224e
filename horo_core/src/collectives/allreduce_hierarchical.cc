// Hierarchical allreduce for groups that span hosts (Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE; the
// two-step "node reducer" of the Horovod re-implementation report).
//
// Members of one host reach each other through shared memory, members of different hosts through
// the network, which is much slower. So the network should carry only what hosts must exchange,
// spread over several members of each host. With H hosts, L_h members on host h and
// S = min_h L_h, the message is cut into S shards (as evenly as possible) and:
//  1. local reduce-scatter (ring inside each host): local member s < S of every host ends with
//     shard s reduced over its host. Members with local index >= S (on hosts larger than the
//     smallest one) own an empty block: they contribute and forward, and keep nothing.
//  2. cross allreduce of shard s among the H members with local index s, one per host (recursive
//     doubling or ring, chosen by the shard's size): shard s reduced over every host.
//  3. local allgather (ring inside each host): every member ends with every shard.
// Each host sends and receives 2 (H-1)/H of the message over the network, the least any allreduce
// needs, split over S of its members; a flat ring instead sends 2 (N-1)/N of the whole message over
// every link that crosses hosts.
//
// Why not the textbook variant (reduce to one leader per host, ring among leaders, broadcast from
// the leader): the leader receives and reduces L-1 whole messages and sends L-1 copies of the
// result, L times the copying and reducing of a member here, and one process carries all of the
// host's network traffic. Phases 1 and 3 cost each member only (L-1)/L of the message.
//
// Small messages (at most small_message_bytes) are latency-bound, and phases 1 and 3 take L-1 ring
// steps each. They run instead:
//  1. local allreduce by recursive doubling (log2 L steps): every member holds its host's partial;
//  2. cross allreduce by recursive doubling among the members with local index s < S (log2 H
//     steps); the S cross groups compute the same result side by side;
//  3. on hosts with more than S members, local member l >= S receives it from local member l mod S.
//
// Every member ends with the same bytes: each shard (small messages: the result) comes out of one
// cross allreduce, whose members end bitwise identical, computed from host partials that are a
// fixed function of the inputs; everything else is copying. For small messages the S cross groups
// run the same deterministic algorithm on the same host partials in the same host order, so they
// produce the same bytes too.
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/host_topology.h"
#include "collectives/ring_phases.h"

namespace horo {
namespace {

// A failure inside the flat allreduce between hosts keeps its code and says which phase it was.
Status InCrossPhase(Status status) {
  if (status.ok()) return status;
  return Status(status.code(), "allreduce hierarchical cross-host " + status.message());
}

Status HierarchicalLarge(const CommGroup& local, const CommGroup* cross, int shards, uint8_t* buffer, int64_t count,
                         DataType dtype, ReduceOp op, const AllreduceOptions& flat) {
  std::vector<int64_t> block_counts(local.size(), 0);  // local members >= shards own nothing
  for (int s = 0; s < shards; ++s) block_counts[s] = count / shards + (s < count % shards ? 1 : 0);
  const RingBlocks blocks = RingBlocksFromCounts(block_counts, static_cast<int64_t>(DataTypeSize(dtype)));
  if (local.size() > 1) {
    HORO_RETURN_IF_ERROR(RingScatterReduce(local, buffer, blocks, dtype, op, flat.chunk_bytes, /*final_shift=*/0,
                                           "allreduce hierarchical local reduce-scatter"));
  }
  if (cross != nullptr) {
    HORO_RETURN_IF_ERROR(InCrossPhase(
        Allreduce(*cross, buffer + blocks.offset[local.index], block_counts[local.index], dtype, op, flat)));
  }
  if (local.size() == 1) return Status::OK();
  return RingAllgather(local, buffer, blocks, /*start_shift=*/0, "allreduce hierarchical local allgather");
}

Status HierarchicalSmall(const CommGroup& local, const CommGroup* cross, int shards, uint8_t* buffer, int64_t count,
                         DataType dtype, ReduceOp op) {
  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(dtype));
  Status status = AllreduceSmall(local, buffer, count, dtype, op);
  if (!status.ok()) return Status(status.code(), "allreduce hierarchical local " + status.message());
  if (cross != nullptr) HORO_RETURN_IF_ERROR(InCrossPhase(AllreduceSmall(*cross, buffer, count, dtype, op)));
  if (local.index >= shards) {
    return ExchangeWithMembers(local, -1, nullptr, 0, local.index % shards, buffer, bytes,
                               "allreduce hierarchical local copy", 0);
  }
  for (int receiver = local.index + shards; receiver < local.size(); receiver += shards) {
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(local, receiver, buffer, bytes, -1, nullptr, 0,
                                             "allreduce hierarchical local copy", 0));
  }
  return Status::OK();
}

}  // namespace

Status AllreduceHierarchical(const CommGroup& group, const HostTopology& topology, void* buffer, int64_t count,
                             DataType dtype, ReduceOp op, const AllreduceOptions& options) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allreduce hierarchical"));
  HORO_RETURN_IF_ERROR(CheckReduceOp(op, "allreduce hierarchical"));
  HORO_RETURN_IF_ERROR(CheckHostTopology(group, topology, "allreduce hierarchical"));
  if (count < 0) return Status::InvalidArgument("allreduce hierarchical: negative count " + std::to_string(count));
  if (options.chunk_bytes <= 0) {
    return Status::InvalidArgument("allreduce hierarchical: chunk_bytes must be positive, got " +
                                   std::to_string(options.chunk_bytes));
  }
  if (group.size() == 1 || count == 0) return Status::OK();

  const int shards = topology.min_local_size();
  const CommGroup local = LocalGroup(group, topology);
  CommGroup cross;
  if (topology.local_index < shards) cross = CrossGroup(group, topology);  // spans every host
  const CommGroup* cross_or_null = topology.local_index < shards && cross.size() > 1 ? &cross : nullptr;

  AllreduceOptions flat = options;  // the phases inside and between hosts are flat
  flat.topology = nullptr;
  flat.ring_postscale = 1.0;  // ignored here (collectives.h); the caller scales the result
  uint8_t* bytes = static_cast<uint8_t*>(buffer);
  if (count * static_cast<int64_t>(DataTypeSize(dtype)) <= options.small_message_bytes) {
    return HierarchicalSmall(local, cross_or_null, shards, bytes, count, dtype, op);
  }
  return HierarchicalLarge(local, cross_or_null, shards, bytes, count, dtype, op, flat);
}

}  // namespace horo
