// The Allgather entry point: picks the algorithm for one gather.
//
//  * Flat groups (one host, or one member per host, or hierarchical forced off): the ring, in which
//    each member sends and receives everything but its own block once.
//  * Groups that span hosts with several members on some host: the hierarchical algorithm, which
//    moves every byte across the network once per receiving host instead of once per ring link
//    that crosses hosts (allgather_hierarchical.cc). It takes as many steps as the ring (N-1 in
//    all), so it is chosen whatever the size.
//
// The choice depends only on the options and the topology, which the executor takes from the
// coordinator's response and from the transport's host map: every member chooses alike.
#include "collectives/collectives.h"
#include "collectives/host_topology.h"

namespace horo {

const char* AllgatherAlgorithmName(AllgatherAlgorithm algorithm) {
  switch (algorithm) {
    case AllgatherAlgorithm::kRing: return "ring";
    case AllgatherAlgorithm::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

const char* AllgatherAlgorithmTimelineName(AllgatherAlgorithm algorithm) {
  switch (algorithm) {
    case AllgatherAlgorithm::kRing: return "RING_ALLGATHER";
    case AllgatherAlgorithm::kHierarchical: return "HIERARCHICAL_ALLGATHER";
  }
  return "ALLGATHER";
}

AllgatherAlgorithm ChooseAllgatherAlgorithm(const AllgatherOptions& options) {
  const HostTopology* topology = options.topology;
  if (topology != nullptr && options.hierarchical != Toggle::kOff && topology->num_hosts() > 1 &&
      topology->max_local_size() > 1) {
    return AllgatherAlgorithm::kHierarchical;
  }
  return AllgatherAlgorithm::kRing;
}

Status Allgather(const CommGroup& group, const void* input, void* output,
                 const std::vector<int64_t>& bytes_per_member, const AllgatherOptions& options) {
  if (ChooseAllgatherAlgorithm(options) == AllgatherAlgorithm::kHierarchical) {
    return AllgatherHierarchical(group, *options.topology, input, output, bytes_per_member);
  }
  return AllgatherRing(group, input, output, bytes_per_member);
}

}  // namespace horo
