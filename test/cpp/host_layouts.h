// Shared by the tests of the hierarchical collectives (test_hierarchical.cc,
// test_hierarchical_allgather.cc): ranks as threads over loopback transports whose hub is given a
// host map, so that one process emulates ranks spread over hosts; host topologies; a world whose
// members' traffic to other hosts is counted; a world with one member lost before the collective.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "collectives/host_topology.h"
#include "transport/counting/transport.h"
#include "unit_check.h"

namespace horo_test {

struct Layout {
  const char* name;
  std::vector<int> host_of_rank;  // one entry per rank of the world; the group is the whole world
};

inline std::vector<int> Iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

inline horo::HostTopology TopologyOrFail(const std::vector<int>& ranks, int index, const std::vector<int>& host_ids) {
  horo::HostTopology topology;
  CheckOk(horo::BuildHostTopology(ranks, index, host_ids, &topology), "BuildHostTopology");
  return topology;
}

// Runs body on every member of a world spread over hosts by host_ids, each through a counting
// transport, and returns the bytes each member sent to other hosts.
inline std::vector<int64_t> BytesToOtherHosts(const std::vector<int>& host_ids,
                                              const std::function<void(const horo::CommGroup&)>& body) {
  const int n = static_cast<int>(host_ids.size());
  auto hub = std::make_shared<horo::LoopbackHub>(n, host_ids);
  std::vector<std::unique_ptr<horo::LoopbackTransport>> loopbacks;
  std::vector<std::unique_ptr<horo::CountingTransport>> counters;
  for (int r = 0; r < n; ++r) {
    loopbacks.push_back(std::make_unique<horo::LoopbackTransport>(hub, r, 60.0));
    counters.push_back(std::make_unique<horo::CountingTransport>(loopbacks.back().get()));
  }
  std::vector<std::thread> threads;
  for (int m = 0; m < n; ++m) {
    threads.emplace_back([&, m] {
      horo::CommGroup g;
      g.transport = counters[m].get();
      g.ranks = Iota(n);
      g.index = m;
      body(g);
    });
  }
  for (auto& t : threads) t.join();
  std::vector<int64_t> sent(n);
  for (int m = 0; m < n; ++m) sent[m] = counters[m]->sent().other_hosts;
  return sent;
}

// Closes the transport of member `lost` of a world spread over hosts by host_ids, then runs body
// on every other member (closing its transport afterwards, as the runtime does after a failure)
// and returns their statuses, indexed by member (the lost member's entry stays OK).
inline std::vector<horo::Status> RunWithLostMember(const std::vector<int>& host_ids, int lost,
                                                   const std::function<horo::Status(const horo::CommGroup&)>& body) {
  const int n = static_cast<int>(host_ids.size());
  auto hub = std::make_shared<horo::LoopbackHub>(n, host_ids);
  std::vector<std::unique_ptr<horo::LoopbackTransport>> transports;
  for (int r = 0; r < n; ++r) transports.push_back(std::make_unique<horo::LoopbackTransport>(hub, r, 60.0));
  transports[lost]->Close();  // gone before the collective starts
  std::vector<horo::Status> results(n);
  std::vector<std::thread> threads;
  for (int m = 0; m < n; ++m) {
    if (m == lost) continue;
    threads.emplace_back([&, m] {
      horo::CommGroup g;
      g.transport = transports[m].get();
      g.ranks = Iota(n);
      g.index = m;
      results[m] = body(g);
      transports[m]->Close();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace horo_test
