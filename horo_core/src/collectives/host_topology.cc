#include "collectives/host_topology.h"

#include <algorithm>
#include <map>
#include <string>

namespace horo {

int HostTopology::min_local_size() const {
  int smallest = local_size();
  for (const auto& members : hosts) smallest = std::min(smallest, static_cast<int>(members.size()));
  return smallest;
}

int HostTopology::max_local_size() const {
  int largest = local_size();
  for (const auto& members : hosts) largest = std::max(largest, static_cast<int>(members.size()));
  return largest;
}

int HostTopology::cross_index() const {
  int index = 0;
  for (int h = 0; h < host; ++h) index += static_cast<int>(hosts[h].size()) > local_index;
  return index;
}

int HostTopology::cross_size() const {
  int size = 0;
  for (const auto& members : hosts) size += static_cast<int>(members.size()) > local_index;
  return size;
}

Status BuildHostTopology(const std::vector<int>& member_ranks, int my_index, const std::vector<int>& host_ids,
                         HostTopology* out) {
  const int members = static_cast<int>(member_ranks.size());
  if (my_index < 0 || my_index >= members) {
    return Status::InvalidArgument("host topology: member index " + std::to_string(my_index) +
                                   " is outside a group of " + std::to_string(members));
  }
  HostTopology topology;
  std::map<int, int> host_of_id;  // host id -> index in topology.hosts
  for (int m = 0; m < members; ++m) {
    const int rank = member_ranks[m];
    int host = static_cast<int>(topology.hosts.size());  // unknown hosts: a host of its own
    if (!host_ids.empty()) {
      if (rank < 0 || rank >= static_cast<int>(host_ids.size())) {
        return Status::InvalidArgument("host topology: member " + std::to_string(m) + " is rank " +
                                       std::to_string(rank) + ", but the host map covers " +
                                       std::to_string(host_ids.size()) + " ranks");
      }
      host = host_of_id.emplace(host_ids[rank], host).first->second;
    }
    if (host == static_cast<int>(topology.hosts.size())) topology.hosts.emplace_back();
    if (m == my_index) {
      topology.host = host;
      topology.local_index = static_cast<int>(topology.hosts[host].size());
    }
    topology.hosts[host].push_back(m);
  }
  *out = std::move(topology);
  return Status::OK();
}

Status CheckHostTopology(const CommGroup& group, const HostTopology& topology, const char* collective) {
  int members = 0;
  for (const auto& host : topology.hosts) members += static_cast<int>(host.size());
  const bool valid = members == group.size() && topology.host >= 0 && topology.host < topology.num_hosts() &&
                     topology.local_index >= 0 && topology.local_index < topology.local_size() &&
                     topology.hosts[topology.host][topology.local_index] == group.index;
  if (valid) return Status::OK();
  return Status::InvalidArgument(std::string(collective) + ": the host topology (" + std::to_string(members) +
                                 " members on " + std::to_string(topology.num_hosts()) +
                                 " hosts) does not describe member " + std::to_string(group.index) +
                                 " of a group of " + std::to_string(group.size()));
}

CommGroup LocalGroup(const CommGroup& group, const HostTopology& topology) {
  CommGroup local;
  local.transport = group.transport;
  for (int member : topology.hosts[topology.host]) local.ranks.push_back(group.ranks[member]);
  local.index = topology.local_index;
  return local;
}

CommGroup CrossGroup(const CommGroup& group, const HostTopology& topology) {
  CommGroup cross;
  cross.transport = group.transport;
  for (const auto& members : topology.hosts) {
    if (static_cast<int>(members.size()) > topology.local_index) {
      if (&members == &topology.hosts[topology.host]) cross.index = static_cast<int>(cross.ranks.size());
      cross.ranks.push_back(group.ranks[members[topology.local_index]]);
    }
  }
  return cross;
}

}  // namespace horo
