// sources: collectives/*.cc transport/loopback/*.cc transport/counting/*.cc common/dtype.cc common/cpu_cache.cc
//
// Host topology and the hierarchical allreduce over the loopback transport, ranks being threads
// whose hub is given a host map, so that one process emulates ranks spread over hosts. Checks:
// topologies of even, interleaved and uneven layouts and of a scattered process set (local and
// cross index/size as Horovod defines them); the algorithm choice; exact results for layouts
// {2+2, interleaved 2+2, 2+1, 1+2, 3+2, 2+2+2, 4+1+3} x counts {0,1,7,1000,65537} x 10 dtypes x
// {Sum,Min,Max,Product} on the small-message and the sharded path; bitwise identical float results
// on every member; the bytes each member sends to other hosts (only the shard owners', and less
// than a flat ring's); a lost member; argument errors. Exits 1 on the first failure.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "collective_checks.h"
#include "collectives/collectives.h"
#include "collectives/host_topology.h"
#include "host_layouts.h"
#include "unit_check.h"

using namespace horo;
using namespace horo_test;

namespace {

const std::vector<Layout> kLayouts = {
    {"2+2", {0, 0, 1, 1}},       {"interleaved 2+2", {0, 1, 0, 1}}, {"2+1", {0, 0, 1}},
    {"1+2", {0, 1, 1}},          {"3+2", {0, 0, 0, 1, 1}},          {"2+2+2", {0, 0, 1, 1, 2, 2}},
    {"4+1+3", {0, 0, 0, 0, 1, 2, 2, 2}},
};

// ---- topology -----------------------------------------------------------------------------------

void ExpectTopology(const std::vector<int>& ranks, const std::vector<int>& host_ids,
                    const std::vector<std::vector<int>>& hosts, const std::vector<int>& local_index,
                    const std::vector<int>& cross_index, const std::vector<int>& cross_size, const std::string& what) {
  for (int m = 0; m < static_cast<int>(ranks.size()); ++m) {
    const HostTopology t = TopologyOrFail(ranks, m, host_ids);
    const std::string label = what + " member " + std::to_string(m);
    ++g_checks;
    Check(t.hosts == hosts, label + ": hosts differ");
    Check(t.hosts[t.host][t.local_index] == m, label + ": host/local index do not point back at the member");
    Check(t.local_index == local_index[m], label + ": local index " + std::to_string(t.local_index) + ", expected " +
                                               std::to_string(local_index[m]));
    Check(t.cross_index() == cross_index[m], label + ": cross index " + std::to_string(t.cross_index()) +
                                                 ", expected " + std::to_string(cross_index[m]));
    Check(t.cross_size() == cross_size[m], label + ": cross size " + std::to_string(t.cross_size()) + ", expected " +
                                               std::to_string(cross_size[m]));
  }
}

void CheckTopologies() {
  ExpectTopology(Iota(4), {7, 7, 3, 3}, {{0, 1}, {2, 3}}, {0, 1, 0, 1}, {0, 0, 1, 1}, {2, 2, 2, 2}, "2+2");
  ExpectTopology(Iota(4), {0, 1, 0, 1}, {{0, 2}, {1, 3}}, {0, 0, 1, 1}, {0, 1, 0, 1}, {2, 2, 2, 2}, "interleaved");
  // Uneven, as Horovod counts it: local rank 1 exists on host 0 only, so its cross size is 1.
  ExpectTopology(Iota(3), {0, 0, 1}, {{0, 1}, {2}}, {0, 1, 0}, {0, 0, 1}, {2, 1, 2}, "2+1");
  ExpectTopology(Iota(5), {5, 9, 9, 5, 9}, {{0, 3}, {1, 2, 4}}, {0, 0, 1, 1, 2}, {0, 1, 1, 0, 0}, {2, 2, 2, 2, 1},
                 "2+3 scattered");
  // A process set {5,2,0,3} of a world whose hosts are {0,1}, {2,3}, {4,5}: members are numbered in
  // set order, hosts in the order of their first member.
  ExpectTopology({5, 2, 0, 3}, {0, 0, 1, 1, 2, 2}, {{0}, {1, 3}, {2}}, {0, 0, 0, 1}, {0, 1, 2, 0}, {3, 3, 3, 1},
                 "process set");
  // No host map: every member alone on its host.
  ExpectTopology(Iota(3), {}, {{0}, {1}, {2}}, {0, 0, 0}, {0, 1, 2}, {3, 3, 3}, "unknown hosts");

  HostTopology t;
  CheckCode(BuildHostTopology({0, 4}, 0, {0, 0, 1}, &t), HORO_ERR_INVALID_ARGUMENT, "host map covers 3 ranks",
            "rank outside the host map");
  CheckCode(BuildHostTopology({0, 1}, 2, {0, 0}, &t), HORO_ERR_INVALID_ARGUMENT, "member index 2",
            "member index outside the group");
  std::printf("ok  host topologies: even, interleaved, uneven, scattered process set, unknown hosts, errors\n");
}

void CheckChoice() {
  const HostTopology spread = TopologyOrFail(Iota(4), 0, {0, 0, 1, 1});
  const HostTopology one_host = TopologyOrFail(Iota(4), 0, {0, 0, 0, 0});
  const HostTopology one_per_host = TopologyOrFail(Iota(3), 0, {0, 1, 2});
  auto choose = [](const HostTopology* topology, Toggle toggle, int64_t bytes) {
    AllreduceOptions options;
    options.topology = topology;
    options.hierarchical = toggle;
    return ChooseAllreduceAlgorithm(bytes, options);
  };
  struct Case {
    const HostTopology* topology;
    Toggle toggle;
    int64_t bytes;
    AllreduceAlgorithm expected;
    const char* what;
  };
  const Case cases[] = {
      {&spread, Toggle::kAuto, 4, AllreduceAlgorithm::kHierarchical, "2+2 auto, small"},
      {&spread, Toggle::kAuto, 1 << 20, AllreduceAlgorithm::kHierarchical, "2+2 auto, large"},
      {&spread, Toggle::kOn, 1 << 20, AllreduceAlgorithm::kHierarchical, "2+2 forced on"},
      {&spread, Toggle::kOff, 4, AllreduceAlgorithm::kRecursiveDoubling, "2+2 forced off, small"},
      {&spread, Toggle::kOff, 1 << 20, AllreduceAlgorithm::kRing, "2+2 forced off, large"},
      {&one_host, Toggle::kOn, 1 << 20, AllreduceAlgorithm::kRing, "one host, forced on"},
      {&one_per_host, Toggle::kOn, 64 << 10, AllreduceAlgorithm::kRecursiveDoubling, "one rank per host, at limit"},
      {&one_per_host, Toggle::kOn, (64 << 10) + 1, AllreduceAlgorithm::kRing, "one rank per host, above limit"},
      {nullptr, Toggle::kOn, 1 << 20, AllreduceAlgorithm::kRing, "no topology"},
  };
  for (const Case& c : cases) {
    ++g_checks;
    const AllreduceAlgorithm got = choose(c.topology, c.toggle, c.bytes);
    Check(got == c.expected, std::string("algorithm choice, ") + c.what + ": got " + AllreduceAlgorithmName(got) +
                                 ", expected " + AllreduceAlgorithmName(c.expected));
  }
  std::printf("ok  algorithm choice: hierarchical only when a group spans hosts with several members on one, "
              "unless forced off; recursive doubling up to the size limit, ring above\n");
}

// ---- values ---------------------------------------------------------------------------------------

// Both paths of the algorithm: small messages as configured, and the sharded path for every size
// (small_message_bytes = 0), with chunks that are no multiple of any element size.
AllreduceOptions PathOptions(bool sharded) {
  AllreduceOptions options;
  if (sharded) {
    options.small_message_bytes = 0;
    options.chunk_bytes = 999;
  }
  return options;
}

void CheckValues(const Layout& layout) {
  const int n = static_cast<int>(layout.host_of_rank.size());
  RunGroup(n, Iota(n), [&](const CommGroup& g) {
    const HostTopology topology = TopologyOrFail(g.ranks, g.index, layout.host_of_rank);
    for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{65537}}) {
      for (DataType dtype : kAllTypes) {
        for (ReduceOp op : kAllOps) {
          const std::vector<uint8_t> expected = ExpectedReduction(n, count, dtype, op);
          for (bool sharded : {false, true}) {
            std::vector<uint8_t> buffer = MemberInput(g.index, count, dtype, op);
            const std::string what = Label(g, std::string(layout.name) + (sharded ? " sharded " : " ") +
                                                  DataTypeName(dtype) + " " + ReduceOpName(op) + " count " +
                                                  std::to_string(count));
            CheckOk(AllreduceHierarchical(g, topology, buffer.data(), count, dtype, op, PathOptions(sharded)), what);
            ExpectBytes(buffer.data(), expected.data(), count, dtype, what);
          }
        }
      }
    }
  }, layout.host_of_rank);
  std::printf("ok  hierarchical allreduce %s: counts {0,1,7,1000,65537} x 10 dtypes x 4 ops, small-message and "
              "sharded paths, exact\n", layout.name);
}

void CheckBitwiseIdentical() {
  const int64_t count = 4099;
  for (const Layout& layout : kLayouts) {
    const int n = static_cast<int>(layout.host_of_rank.size());
    std::vector<std::vector<float>> inputs(n, std::vector<float>(count));
    std::mt19937 rng(99 + n);
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 20);
    for (auto& input : inputs) {
      for (float& v : input) v = std::ldexp(mantissa(rng), exponent(rng));
    }
    for (bool sharded : {false, true}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kProduct}) {
        std::vector<std::vector<float>> results = inputs;
        for (int m = 0; m < n; ++m) {
          for (int64_t j = 0; j < count; ++j) {
            if (op == ReduceOp::kMin) results[m][j] = ((j * 7 + m * 3) % 5) < 2 ? -0.0f : 0.0f;  // signed zeros
            if (op == ReduceOp::kProduct && j % 3 == 0) results[m][j] = FloatFromBits(0x7fc00001u + m);  // NaN payloads
          }
        }
        RunGroup(n, Iota(n), [&](const CommGroup& g) {
          const HostTopology topology = TopologyOrFail(g.ranks, g.index, layout.host_of_rank);
          CheckOk(AllreduceHierarchical(g, topology, results[g.index].data(), count, DataType::kFloat32, op,
                                        PathOptions(sharded)),
                  Label(g, "bitwise hierarchical allreduce"));
        }, layout.host_of_rank);
        for (int m = 1; m < n; ++m) {
          ++g_checks;
          if (std::memcmp(results[m].data(), results[0].data(), count * sizeof(float)) != 0) {
            Fail(std::string("hierarchical allreduce ") + layout.name + (sharded ? " sharded " : " ") +
                 ReduceOpName(op) + ": member " + std::to_string(m) + " is not bitwise identical to member 0");
          }
        }
      }
    }
  }
  std::printf("ok  hierarchical allreduce results bitwise identical on every member, every layout and path "
              "(float32 sums over 41 binades, signed-zero min, NaN payloads)\n");
}

// ---- where the bytes go ---------------------------------------------------------------------------

// Runs one allreduce of count float32 on every member of the layout through counting transports
// and returns the bytes each member sent to other hosts.
std::vector<int64_t> AllreduceBytesToOtherHosts(const Layout& layout, int64_t count, bool hierarchical) {
  const int n = static_cast<int>(layout.host_of_rank.size());
  return BytesToOtherHosts(layout.host_of_rank, [&](const CommGroup& g) {
    const HostTopology topology = TopologyOrFail(g.ranks, g.index, layout.host_of_rank);
    AllreduceOptions options;
    options.topology = &topology;
    options.hierarchical = hierarchical ? Toggle::kAuto : Toggle::kOff;
    std::vector<float> buffer(count, static_cast<float>(g.index + 1));
    CheckOk(Allreduce(g, buffer.data(), count, DataType::kFloat32, ReduceOp::kSum, options), Label(g, "traffic"));
    ++g_checks;
    Check(buffer[count - 1] == static_cast<float>(n * (n + 1) / 2), Label(g, "traffic allreduce value"));
  });
}

void CheckTraffic() {
  // Sizes divisible by every block count involved, so that the expected bytes are exact.
  for (const Layout& layout : {kLayouts[0], kLayouts[1], kLayouts[4], kLayouts[5]}) {
    const int n = static_cast<int>(layout.host_of_rank.size());
    for (int64_t count : {int64_t{7}, int64_t{120000}}) {
      const int64_t bytes = count * 4;
      const bool small = bytes <= AllreduceOptions().small_message_bytes;
      const std::vector<int64_t> hierarchical = AllreduceBytesToOtherHosts(layout, count, true);
      const std::vector<int64_t> flat = AllreduceBytesToOtherHosts(layout, count, false);
      const HostTopology any = TopologyOrFail(Iota(n), 0, layout.host_of_rank);
      const int hosts = any.num_hosts(), shards = any.min_local_size();
      int64_t total_hierarchical = 0, total_flat = 0;
      for (int m = 0; m < n; ++m) {
        const HostTopology t = TopologyOrFail(Iota(n), m, layout.host_of_rank);
        // Only the shard owners talk to other hosts. Large: a ring among the hosts over one shard,
        // 2 (H-1)/H of it. Small (two hosts): one recursive-doubling step with the whole message.
        int64_t expected = 0;
        if (t.local_index < shards) expected = small ? bytes : 2 * (hosts - 1) * (bytes / shards) / hosts;
        if (small && hosts != 2) expected = -1;  // recursive doubling over 3 is uneven; checked by the total below
        ++g_checks;
        if (expected >= 0 && hierarchical[m] != expected) {
          Fail(std::string("traffic ") + layout.name + " count " + std::to_string(count) + ": member " +
               std::to_string(m) + " sent " + std::to_string(hierarchical[m]) + " bytes to other hosts, expected " +
               std::to_string(expected));
        }
        if (t.local_index >= shards) Check(hierarchical[m] == 0, std::string("traffic ") + layout.name + ": member " +
                                                                  std::to_string(m) + " owns no shard but sent across hosts");
        total_hierarchical += hierarchical[m];
        total_flat += flat[m];
      }
      ++g_checks;
      Check(total_hierarchical < total_flat || (small && total_hierarchical <= total_flat),
            std::string("traffic ") + layout.name + " count " + std::to_string(count) + ": hierarchical sent " +
                std::to_string(total_hierarchical) + " bytes across hosts, flat " + std::to_string(total_flat));
      std::printf("ok  %s, %lld bytes: %lld bytes cross hosts hierarchically, %lld flat\n", layout.name,
                  static_cast<long long>(bytes), static_cast<long long>(total_hierarchical),
                  static_cast<long long>(total_flat));
    }
  }
}

// ---- failures and argument errors --------------------------------------------------------------

void CheckPeerLost() {
  for (bool sharded : {false, true}) {
    const std::vector<int> host_ids = {0, 0, 1, 1};
    const std::vector<Status> results = RunWithLostMember(host_ids, 3, [&](const CommGroup& g) {
      const HostTopology topology = TopologyOrFail(g.ranks, g.index, host_ids);
      const int64_t count = sharded ? 100000 : 1000;  // 4 KB: the small-message path
      std::vector<float> buffer(count, 1.0f);
      return AllreduceHierarchical(g, topology, buffer.data(), count, DataType::kFloat32, ReduceOp::kSum,
                                   PathOptions(sharded));
    });
    for (int m = 0; m < 3; ++m) {
      ++g_checks;
      CheckCode(results[m], HORO_ERR_PEER_LOST, "allreduce hierarchical",
                std::string(sharded ? "sharded" : "small") + " hierarchical allreduce, member " + std::to_string(m) +
                    " with member 3 lost");
    }
    std::printf("ok  hierarchical allreduce (%s) with a lost member fails on every member: %s\n",
                sharded ? "sharded" : "small", results[2].message().c_str());
  }
}

void CheckArgumentErrors() {
  RunGroup(2, Iota(2), [](const CommGroup& g) {
    const HostTopology other = TopologyOrFail(g.ranks, 1 - g.index, {0, 1});
    float value = 1.0f;
    CheckCode(AllreduceHierarchical(g, other, &value, 1, DataType::kFloat32, ReduceOp::kSum, AllreduceOptions()),
              HORO_ERR_INVALID_ARGUMENT, "does not describe member", "topology of another member");
    const HostTopology three = TopologyOrFail(Iota(3), g.index, {0, 1, 1});
    CheckCode(AllreduceHierarchical(g, three, &value, 1, DataType::kFloat32, ReduceOp::kSum, AllreduceOptions()),
              HORO_ERR_INVALID_ARGUMENT, "3 members on 2 hosts", "topology of a larger group");
    const HostTopology mine = TopologyOrFail(g.ranks, g.index, {0, 1});
    CheckCode(AllreduceHierarchical(g, mine, &value, 1, DataType::kFloat32, ReduceOp::kAverage, AllreduceOptions()),
              HORO_ERR_INVALID_ARGUMENT, "Average", "Average is the caller's postscale");
    CheckCode(AllreduceHierarchical(g, mine, &value, -1, DataType::kFloat32, ReduceOp::kSum, AllreduceOptions()),
              HORO_ERR_INVALID_ARGUMENT, "negative count", "negative count");
    g_checks += 4;
  }, {0, 1});
  std::printf("ok  argument errors: InvalidArgument naming the problem\n");
}

}  // namespace

int main() {
  CheckTopologies();
  CheckChoice();
  for (const Layout& layout : kLayouts) CheckValues(layout);
  CheckBitwiseIdentical();
  CheckTraffic();
  CheckPeerLost();
  CheckArgumentErrors();
  std::printf("all hierarchical checks passed (%ld value checks)\n", g_checks.load());
  return 0;
}
