// The Allreduce entry point: picks the algorithm for one message.
//
//  * Flat groups (one host, or one member per host, or hierarchical forced off): recursive doubling
//    up to options.small_message_bytes, where the log2 N latencies matter more than sending the
//    whole message every step, and the ring above, which sends only 2 (N-1)/N of it per member.
//  * Groups that span hosts with several members on some host: the hierarchical algorithm, which
//    sends across hosts only what the hosts must exchange, split over several members of each
//    host, and makes its own size-based choice for every phase (allreduce_hierarchical.cc).
// There is one channel: splitting large messages over two rings on separate meshes and threads
// was measured slower on shared memory (docs/benchmarks.md; examples/benchmarks/allreduce_variants.cc).
//
// The choice depends only on the message size, the options and the topology, which the executor
// takes from the coordinator's response and from the transport's host map: every member chooses
// the same algorithm, which is what keeps their byte streams in step.
#include <string>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/host_topology.h"

namespace horo {

const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling: return "recursive doubling";
    case AllreduceAlgorithm::kRing: return "ring";
    case AllreduceAlgorithm::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

const char* AllreduceAlgorithmTimelineName(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kRecursiveDoubling: return "RECURSIVE_DOUBLING_ALLREDUCE";
    case AllreduceAlgorithm::kRing: return "RING_ALLREDUCE";
    case AllreduceAlgorithm::kHierarchical: return "HIERARCHICAL_ALLREDUCE";
  }
  return "ALLREDUCE";
}

AllreduceAlgorithm ChooseAllreduceAlgorithm(int64_t bytes, const AllreduceOptions& options) {
  const HostTopology* topology = options.topology;
  if (topology != nullptr && options.hierarchical != Toggle::kOff && topology->num_hosts() > 1 &&
      topology->max_local_size() > 1) {
    return AllreduceAlgorithm::kHierarchical;
  }
  return bytes <= options.small_message_bytes ? AllreduceAlgorithm::kRecursiveDoubling : AllreduceAlgorithm::kRing;
}

Status Allreduce(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op,
                 const AllreduceOptions& options) {
  HORO_RETURN_IF_ERROR(CheckGroup(group, "allreduce"));
  HORO_RETURN_IF_ERROR(CheckReduceOp(op, "allreduce"));
  if (count < 0) return Status::InvalidArgument("allreduce: negative count " + std::to_string(count));
  if (group.size() == 1 || count == 0) return Status::OK();
  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(dtype));
  switch (ChooseAllreduceAlgorithm(bytes, options)) {
    case AllreduceAlgorithm::kHierarchical:
      return AllreduceHierarchical(group, *options.topology, buffer, count, dtype, op, options);
    case AllreduceAlgorithm::kRecursiveDoubling:
      return AllreduceSmall(group, buffer, count, dtype, op);
    case AllreduceAlgorithm::kRing:
      break;
  }
  return AllreduceRing(group, buffer, count, dtype, op, options);
}

}  // namespace horo
