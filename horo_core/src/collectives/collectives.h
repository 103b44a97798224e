// Collective algorithms over a Transport, for the members of one process set.
//
// Every function is called by every member of the group, in the same order, from the background
// thread; sizes are known on every member beforehand (negotiation told them). Results must be
// bitwise identical on all members (reductions happen in a member-independent order, or are
// computed once and then copied), so that replicas of a model never drift apart.
#pragma once

#include <cstdint>
#include <vector>

#include "common/cpu_cache.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"
#include "transport/transport.h"

namespace horo {

struct HostTopology;  // host_topology.h

// The members of a process set as the collectives see them.
struct CommGroup {
  Transport* transport = nullptr;
  std::vector<int> ranks;  // global ranks of the members, in set order
  int index = 0;           // this rank's position in ranks
  int size() const { return static_cast<int>(ranks.size()); }
  int peer(int member_index) const { return ranks[member_index]; }
};

struct AllreduceOptions {
  // Messages of at most this many bytes use the latency-optimal algorithm, larger ones the ring.
  int64_t small_message_bytes = 64 * 1024;
  // Ring steps move chunks of at most this many bytes.
  int64_t chunk_bytes = 1 << 20;
  // A ring allreduce whose members all share one host (per topology) runs both of its phases on
  // one slice of this many bytes of every block before the next (allreduce_ring.cc); 0: never.
  int64_t slice_bytes = 256 << 10;
  // Where the members run. Null: as if each member were alone on its host (always flat).
  const HostTopology* topology = nullptr;
  // kAuto and kOn reduce hierarchically whenever the group spans hosts and some host has several
  // members (otherwise hierarchical and flat are the same thing); kOff never does.
  Toggle hierarchical = Toggle::kAuto;
  // AllreduceRing only, floating-point types only: multiplies the result by this factor, each member
  // scaling the block it reduced while that block is still in its cache (a separate pass over the
  // result afterwards reads and writes every byte once more). Other algorithms ignore it.
  double ring_postscale = 1.0;
  // AllreduceRing only: a message of at least this many bytes receives the allgather's last block
  // past the caches where the transport can (Transport::SendRecvUncached). A result that large leaves
  // the caches before anyone reads it anyway, and written around them it costs memory one pass
  // instead of two (a cached store first reads the line it overwrites). The default is this CPU's
  // last-level cache, at least 16 MiB (cpu_cache.h). Members may differ.
  int64_t uncached_result_bytes = DefaultUncachedResultBytes();
};

enum class AllreduceAlgorithm { kRecursiveDoubling = 0, kRing = 1, kHierarchical = 2 };
constexpr int kAllreduceAlgorithmCount = 3;
const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm);

// The algorithm Allreduce runs for a message of `bytes` bytes (allreduce.cc): a pure function of
// arguments that every member has alike, so that all members choose the same one.
AllreduceAlgorithm ChooseAllreduceAlgorithm(int64_t bytes, const AllreduceOptions& options);

// In-place allreduce of count elements. op is Sum, Min, Max or Product (Average is a Sum plus a
// postscale applied by the caller). Bool: Sum/Max = logical or, Min/Product = logical and.
Status Allreduce(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op,
                 const AllreduceOptions& options);
// The algorithms Allreduce chooses from, exposed for tests and benchmarks.
Status AllreduceRing(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op,
                     const AllreduceOptions& options);
Status AllreduceSmall(const CommGroup& group, void* buffer, int64_t count, DataType dtype, ReduceOp op);
// Reduces inside each host, then across hosts, then shares inside each host (allreduce_hierarchical.cc).
// Ignores options.topology and options.hierarchical; topology must describe this group.
Status AllreduceHierarchical(const CommGroup& group, const HostTopology& topology, void* buffer, int64_t count,
                             DataType dtype, ReduceOp op, const AllreduceOptions& options);

// An allreduce algorithm as the timeline names it ("RING_ALLREDUCE", "RECURSIVE_DOUBLING_ALLREDUCE",
// "HIERARCHICAL_ALLREDUCE").
const char* AllreduceAlgorithmTimelineName(AllreduceAlgorithm algorithm);

// The algorithms of the other collectives, as the timeline names them.
constexpr char kBroadcastAlgorithmName[] = "BINOMIAL_TREE_BROADCAST";
constexpr char kAlltoallAlgorithmName[] = "PAIRWISE_ALLTOALL";
constexpr char kReducescatterAlgorithmName[] = "RING_REDUCESCATTER";

struct AllgatherOptions {
  // Where the members run. Null: as if each member were alone on its host (always the ring).
  const HostTopology* topology = nullptr;
  // kAuto and kOn gather hierarchically whenever the group spans hosts and some host has several
  // members (otherwise hierarchical and ring are the same thing); kOff never does.
  Toggle hierarchical = Toggle::kAuto;
};

enum class AllgatherAlgorithm { kRing = 0, kHierarchical = 1 };
constexpr int kAllgatherAlgorithmCount = 2;
const char* AllgatherAlgorithmName(AllgatherAlgorithm algorithm);
// As the timeline names it: "RING_ALLGATHER", "HIERARCHICAL_ALLGATHER".
const char* AllgatherAlgorithmTimelineName(AllgatherAlgorithm algorithm);

// The algorithm Allgather runs (allgather.cc): a pure function of what every member has alike.
AllgatherAlgorithm ChooseAllgatherAlgorithm(const AllgatherOptions& options);

// Gathers each member's bytes into output, concatenated in set order. bytes_per_member[i] is the
// number of bytes member i contributes (may be 0). input may alias output + offset of this member.
Status Allgather(const CommGroup& group, const void* input, void* output,
                 const std::vector<int64_t>& bytes_per_member, const AllgatherOptions& options = AllgatherOptions());
// The algorithms Allgather chooses from, exposed for tests and benchmarks: the ring over all
// members (allgather_ring.cc), and inside hosts, across hosts, inside hosts again
// (allgather_hierarchical.cc), whose topology must describe this group.
Status AllgatherRing(const CommGroup& group, const void* input, void* output,
                     const std::vector<int64_t>& bytes_per_member);
Status AllgatherHierarchical(const CommGroup& group, const HostTopology& topology, const void* input, void* output,
                             const std::vector<int64_t>& bytes_per_member);

// Copies bytes from the member at root_index to every member.
Status Broadcast(const CommGroup& group, void* buffer, int64_t bytes, int root_index);

// Member i sends send_bytes[j] bytes (at the running offset of input) to member j and receives
// recv_bytes[j] bytes from member j into output (at the running offset), in set order.
Status Alltoall(const CommGroup& group, const void* input, const std::vector<int64_t>& send_bytes,
                void* output, const std::vector<int64_t>& recv_bytes);

// Reduces the full input buffer (sum of counts_per_member elements) element-wise across members
// and leaves member i's block (counts_per_member[i] elements, in order) in output. input is used as
// scratch and may be overwritten.
Status Reducescatter(const CommGroup& group, void* input, void* output,
                     const std::vector<int64_t>& counts_per_member, DataType dtype, ReduceOp op,
                     const AllreduceOptions& options);

}  // namespace horo
