// HostTopology: how the members of one process set are spread over hosts, seen from one member.
//
// It is computed from the group's member list and the transport's host map (Transport::HostIds),
// both identical on every rank, so every member derives the same hosts in the same order and
// topology-aware algorithms agree on who talks to whom without any extra exchange.
//
// Hosts are numbered in the order of their first member (in set order), and the members of a host
// in set order; a member's position on its host is its local index. The names follow Horovod:
// local index/size (local_rank/local_size), cross index/size (cross_rank/cross_size: among the
// hosts that have a member at this local index, the position of this member's host).
#pragma once

#include <vector>

#include "collectives/collectives.h"

namespace horo {

struct HostTopology {
  std::vector<std::vector<int>> hosts;  // hosts[h]: member indices on host h, in set order
  int host = 0;                         // this member's host
  int local_index = 0;                  // this member's position in hosts[host]

  int num_hosts() const { return static_cast<int>(hosts.size()); }
  int local_size() const { return static_cast<int>(hosts[host].size()); }
  int min_local_size() const;
  int max_local_size() const;
  int cross_index() const;
  int cross_size() const;
};

// Fills *out for member my_index of the group whose global ranks are member_ranks. host_ids is a
// host map as Transport::HostIds returns it; empty means "unknown" and puts every member on a host
// of its own. InvalidArgument if a rank has no entry in host_ids or my_index is out of range.
Status BuildHostTopology(const std::vector<int>& member_ranks, int my_index, const std::vector<int>& host_ids,
                         HostTopology* out);

// InvalidArgument, prefixed with collective, unless topology describes this member of group: as
// many members as the group, and this member where topology says it is.
Status CheckHostTopology(const CommGroup& group, const HostTopology& topology, const char* collective);

// The members of this member's host, as a group of their own.
CommGroup LocalGroup(const CommGroup& group, const HostTopology& topology);

// The members whose local index equals this member's, one per host that has one, ordered by host
// (Horovod's cross communicator). It spans every host when local_index < min_local_size().
CommGroup CrossGroup(const CommGroup& group, const HostTopology& topology);

}  // namespace horo
