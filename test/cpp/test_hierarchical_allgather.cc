// sources: collectives/*.cc transport/loopback/*.cc transport/counting/*.cc common/dtype.cc common/cpu_cache.cc
//
// The hierarchical allgather over the loopback transport, ranks being threads whose hub is given a
// host map, so that one process emulates ranks spread over hosts. Checks: the algorithm choice;
// exact bytes for layouts {2+2, interleaved 2+2, 3+1, 2+1, 1+2, interleaved 3+2, 2+2+2, 4+1+3} x
// member sizes {equal, different, some zero, all zero, large and odd} x {separate input, in place},
// through Allgather and for scattered process sets; the bytes each member sends to other hosts
// (exactly each host's data once to every other host, less than the ring); a lost member;
// argument errors. Exits 1 on the first failure.
#include <cstdio>
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
    {"2+2", {0, 0, 1, 1}},          {"interleaved 2+2", {0, 1, 0, 1}}, {"3+1", {0, 0, 0, 1}},
    {"2+1", {0, 0, 1}},             {"1+2", {0, 1, 1}},                {"interleaved 3+2", {0, 1, 0, 1, 0}},
    {"2+2+2", {0, 0, 1, 1, 2, 2}},  {"4+1+3", {0, 0, 0, 0, 1, 2, 2, 2}},
};

uint8_t PatternByte(int member, int64_t k) { return static_cast<uint8_t>(member * 37 + k * 11 + (k >> 8) + 1); }

// Bytes member i contributes in size variant v of a group of n.
int64_t VariantSize(int variant, int i, int n) {
  switch (variant) {
    case 0: return 24;                               // equal
    case 1: return (i * 7 + 3) % 5 * 13 + i;         // different
    case 2: return i % 2 == 0 ? 0 : 1000 + i;        // some members contribute nothing
    case 3: return 0;                                // nothing at all
    default: return 100003 + 1000 * (n - i);         // large, odd, no multiple of any shard count
  }
}
constexpr int kVariants = 5;

// Runs AllgatherHierarchical (through Allgather with the topology) on every member of ranks and
// checks every output byte.
void CheckGather(int world, const std::vector<int>& ranks, const std::vector<int>& host_ids, const std::string& name) {
  RunGroup(world, ranks, [&](const CommGroup& g) {
    const HostTopology topology = TopologyOrFail(g.ranks, g.index, host_ids);
    AllgatherOptions options;
    options.topology = &topology;
    const int n = g.size();
    for (int variant = 0; variant < kVariants; ++variant) {
      for (bool in_place : {false, true}) {
        std::vector<int64_t> sizes(n);
        int64_t total = 0, offset = 0;
        for (int i = 0; i < n; ++i) {
          sizes[i] = VariantSize(variant, i, n);
          if (i == g.index) offset = total;
          total += sizes[i];
        }
        std::vector<uint8_t> input(sizes[g.index]);
        for (int64_t k = 0; k < sizes[g.index]; ++k) input[k] = PatternByte(g.index, k);
        std::vector<uint8_t> output(total, 0xee);
        if (in_place && !input.empty()) std::memcpy(output.data() + offset, input.data(), input.size());
        const std::string what = Label(g, name + " variant " + std::to_string(variant) + (in_place ? " in place" : ""));
        CheckOk(Allgather(g, in_place ? output.data() + offset : input.data(), output.data(), sizes, options), what);
        std::vector<uint8_t> expected;
        for (int i = 0; i < n; ++i) {
          for (int64_t k = 0; k < sizes[i]; ++k) expected.push_back(PatternByte(i, k));
        }
        ExpectBytes(output.data(), expected.data(), total, DataType::kUInt8, what);
      }
    }
  }, host_ids);
}

void CheckChoice() {
  const HostTopology spread = TopologyOrFail(Iota(4), 0, {0, 0, 1, 1});
  const HostTopology uneven = TopologyOrFail(Iota(4), 3, {0, 0, 0, 1});
  const HostTopology one_host = TopologyOrFail(Iota(4), 0, {0, 0, 0, 0});
  const HostTopology one_per_host = TopologyOrFail(Iota(3), 0, {0, 1, 2});
  struct Case {
    const HostTopology* topology;
    Toggle toggle;
    AllgatherAlgorithm expected;
    const char* what;
  };
  const Case cases[] = {
      {&spread, Toggle::kAuto, AllgatherAlgorithm::kHierarchical, "2+2 auto"},
      {&spread, Toggle::kOn, AllgatherAlgorithm::kHierarchical, "2+2 forced on"},
      {&uneven, Toggle::kAuto, AllgatherAlgorithm::kHierarchical, "3+1 auto, member alone on its host"},
      {&spread, Toggle::kOff, AllgatherAlgorithm::kRing, "2+2 forced off"},
      {&one_host, Toggle::kOn, AllgatherAlgorithm::kRing, "one host, forced on"},
      {&one_per_host, Toggle::kOn, AllgatherAlgorithm::kRing, "one rank per host, forced on"},
      {nullptr, Toggle::kOn, AllgatherAlgorithm::kRing, "no topology"},
  };
  for (const Case& c : cases) {
    AllgatherOptions options;
    options.topology = c.topology;
    options.hierarchical = c.toggle;
    const AllgatherAlgorithm got = ChooseAllgatherAlgorithm(options);
    ++g_checks;
    Check(got == c.expected, std::string("allgather choice, ") + c.what + ": got " + AllgatherAlgorithmName(got) +
                                 ", expected " + AllgatherAlgorithmName(c.expected));
  }
  Check(std::string(AllgatherAlgorithmTimelineName(AllgatherAlgorithm::kHierarchical)) == "HIERARCHICAL_ALLGATHER" &&
            std::string(AllgatherAlgorithmTimelineName(AllgatherAlgorithm::kRing)) == "RING_ALLGATHER",
        "timeline names");
  std::printf("ok  allgather choice: hierarchical only when a group spans hosts with several members on one, "
              "unless forced off\n");
}

// ---- where the bytes go ---------------------------------------------------------------------------

// One allgather of sizes[m] bytes per member on every member of the layout through counting
// transports; returns the bytes each member sent to other hosts.
std::vector<int64_t> AllgatherBytesToOtherHosts(const Layout& layout, const std::vector<int64_t>& sizes,
                                                Toggle hierarchical) {
  const int n = static_cast<int>(layout.host_of_rank.size());
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  return BytesToOtherHosts(layout.host_of_rank, [&](const CommGroup& g) {
    const HostTopology topology = TopologyOrFail(g.ranks, g.index, layout.host_of_rank);
    AllgatherOptions options;
    options.topology = &topology;
    options.hierarchical = hierarchical;
    std::vector<uint8_t> input(sizes[g.index], static_cast<uint8_t>(g.index + 1)), output(total);
    CheckOk(Allgather(g, input.data(), output.data(), sizes, options), Label(g, "traffic"));
    int64_t offset = 0;
    for (int i = 0; i < n; ++i) {
      ++g_checks;
      Check(sizes[i] == 0 || (output[offset] == i + 1 && output[offset + sizes[i] - 1] == i + 1),
            Label(g, "traffic allgather value"));
      offset += sizes[i];
    }
  });
}

void CheckTraffic() {
  for (const Layout& layout : kLayouts) {
    const int n = static_cast<int>(layout.host_of_rank.size());
    const HostTopology any = TopologyOrFail(Iota(n), 0, layout.host_of_rank);
    const int hosts = any.num_hosts(), shards = any.min_local_size();
    for (bool equal : {true, false}) {
      std::vector<int64_t> sizes(n);
      int64_t total = 0;
      for (int m = 0; m < n; ++m) total += sizes[m] = equal ? 60000 : 10007 * (m + 1) + 3;
      std::vector<int64_t> host_bytes(hosts, 0);
      for (int h = 0; h < hosts; ++h) {
        for (int m : any.hosts[h]) host_bytes[h] += sizes[m];
      }
      const std::vector<int64_t> hierarchical = AllgatherBytesToOtherHosts(layout, sizes, Toggle::kAuto);
      const std::vector<int64_t> flat = AllgatherBytesToOtherHosts(layout, sizes, Toggle::kOff);
      int64_t total_hierarchical = 0, total_flat = 0;
      for (int m = 0; m < n; ++m) {
        const HostTopology t = TopologyOrFail(Iota(n), m, layout.host_of_rank);
        // Shard owner s of host h sends, in a ring over the hosts, shard s of every host's data
        // but that of the next host (which it would receive last).
        int64_t expected = 0;
        const int s = t.local_index;
        if (s < shards) {
          for (int g = 0; g < hosts; ++g) {
            if (g == (t.host + 1) % hosts) continue;
            expected += host_bytes[g] / shards + (s < host_bytes[g] % shards ? 1 : 0);
          }
        }
        ++g_checks;
        Check(hierarchical[m] == expected, std::string("traffic ") + layout.name + ": member " + std::to_string(m) +
                                               " sent " + std::to_string(hierarchical[m]) +
                                               " bytes to other hosts, expected " + std::to_string(expected));
        total_hierarchical += hierarchical[m];
        total_flat += flat[m];
      }
      g_checks += 2;
      Check(total_hierarchical == (hosts - 1) * total,
            std::string("traffic ") + layout.name + ": every byte crosses to each other host once");
      Check(total_hierarchical < total_flat, std::string("traffic ") + layout.name + ": hierarchical sent " +
                                                 std::to_string(total_hierarchical) + " bytes across hosts, ring " +
                                                 std::to_string(total_flat));
      std::printf("ok  %s, %s sizes, %lld bytes gathered: %lld bytes cross hosts hierarchically, %lld in the ring\n",
                  layout.name, equal ? "equal" : "different", static_cast<long long>(total),
                  static_cast<long long>(total_hierarchical), static_cast<long long>(total_flat));
    }
  }
}

// ---- failures and argument errors --------------------------------------------------------------

void CheckPeerLost() {
  const std::vector<int> host_ids = {0, 0, 1, 1};
  const std::vector<Status> results = RunWithLostMember(host_ids, 3, [&](const CommGroup& g) {
    const HostTopology topology = TopologyOrFail(g.ranks, g.index, host_ids);
    const std::vector<int64_t> sizes(4, 4000);
    std::vector<uint8_t> input(4000, 1), output(16000);
    return AllgatherHierarchical(g, topology, input.data(), output.data(), sizes);
  });
  for (int m = 0; m < 3; ++m) {
    ++g_checks;
    CheckCode(results[m], HORO_ERR_PEER_LOST, "allgather hierarchical",
              "hierarchical allgather, member " + std::to_string(m) + " with member 3 lost");
  }
  std::printf("ok  hierarchical allgather with a lost member fails on every member: %s\n",
              results[2].message().c_str());
}

void CheckArgumentErrors() {
  RunGroup(2, Iota(2), [](const CommGroup& g) {
    uint8_t in = 1, out[2] = {};
    const std::vector<int64_t> sizes = {1, 1};
    const HostTopology other = TopologyOrFail(g.ranks, 1 - g.index, {0, 1});
    CheckCode(AllgatherHierarchical(g, other, &in, out, sizes), HORO_ERR_INVALID_ARGUMENT, "does not describe member",
              "topology of another member");
    const HostTopology three = TopologyOrFail(Iota(3), g.index, {0, 1, 1});
    CheckCode(AllgatherHierarchical(g, three, &in, out, sizes), HORO_ERR_INVALID_ARGUMENT, "3 members on 2 hosts",
              "topology of a larger group");
    const HostTopology mine = TopologyOrFail(g.ranks, g.index, {0, 1});
    CheckCode(AllgatherHierarchical(g, mine, &in, out, {1, -1}), HORO_ERR_INVALID_ARGUMENT, "negative size",
              "negative size");
    CheckCode(AllgatherHierarchical(g, mine, &in, out, {1}), HORO_ERR_INVALID_ARGUMENT, "1 entries of size",
              "sizes of a smaller group");
    g_checks += 4;
  }, {0, 1});
  std::printf("ok  argument errors: InvalidArgument naming the problem\n");
}

}  // namespace

int main() {
  CheckChoice();
  for (const Layout& layout : kLayouts) {
    const int n = static_cast<int>(layout.host_of_rank.size());
    CheckGather(n, Iota(n), layout.host_of_rank, layout.name);
    std::printf("ok  hierarchical allgather %s: 5 size patterns x {input, in place}, every byte exact\n", layout.name);
  }
  // Process sets: members numbered in set order, hosts in the order of their first member.
  const std::vector<int> world_hosts = {0, 0, 1, 1, 2, 2};
  CheckGather(6, {5, 2, 0, 3}, world_hosts, "process set {5,2,0,3}");
  CheckGather(6, {4, 1, 0, 5, 3}, world_hosts, "process set {4,1,0,5,3}");
  std::printf("ok  hierarchical allgather of scattered process sets, every byte exact\n");
  CheckTraffic();
  CheckPeerLost();
  CheckArgumentErrors();
  std::printf("all hierarchical allgather checks passed (%ld value checks)\n", g_checks.load());
  return 0;
}
