// The coordinator's checks of what the ranks asked for, and the texts of its errors: the first
// field in which the ranks' requests for one tensor differ (naming every rank that differs),
// grouped calls that disagree, arguments that one rank could check alone but that would leave the
// others waiting (a root outside the process set, bad alltoall splits), and the error response
// every member then receives. Used by coordinator.cc and coordinator_construct.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/request.h"
#include "coordinator/response.h"

namespace horo {
namespace request_checks {

// "[2, 3]"
std::string ShapeText(const std::vector<int64_t>& shape);
std::string MembersText(const std::vector<int32_t>& members);
// "'name'"
std::string Quote(const std::string& name);

// The shortest text that reads back as value ("0.1", "1", "1.0000001"): scale factors that differ
// in any digit are told apart, and common ones print as written.
std::string NumberText(double value);

// An error response for a tensor (or a process-set change, set 0) that every member receives.
Response ErrorResponse(int32_t set_id, const std::string& name, horo_status_t code, const std::string& message);

// "rank 2 has B" or "ranks 1, 2 have B": the ranks that passed one value, at most a few named.
std::string RanksWith(const std::vector<int32_t>& ranks, const std::string& value);

// Compares one field of every request with the first (lowest rank) and, if any differs, describes
// every rank, ranks passing the same value together, in order of their lowest rank: "<what> for
// <op> tensor 'x': rank 0 has A, rank 2 has B" or "ranks 0, 2 have A, ranks 1, 3 have B".
template <typename Get>
bool FindMismatch(const std::map<int32_t, Request>& by_rank, const char* what, Get get, std::string* message) {
  const auto& first = *by_rank.begin();
  const auto agrees = [&](const auto& kv) { return get(kv.second) == get(first.second); };
  if (std::all_of(by_rank.begin(), by_rank.end(), agrees)) return false;
  // The ranks that passed equal values (compared as the check compares them, not as printed),
  // each group with the request of its lowest rank.
  std::vector<std::pair<const Request*, std::vector<int32_t>>> groups;
  for (const auto& kv : by_rank) {
    const auto equal = [&](const auto& group) { return get(*group.first) == get(kv.second); };
    auto same = std::find_if(groups.begin(), groups.end(), equal);
    if (same == groups.end()) {
      groups.push_back({&kv.second, {kv.first}});
    } else {
      same->second.push_back(kv.first);
    }
  }
  std::ostringstream os;
  os << "Mismatched " << what << " for " << OpTypeName(first.second.op_type) << " tensor "
     << Quote(first.second.name) << ": ";
  for (size_t i = 0; i < groups.size(); ++i) {
    std::ostringstream value;
    value << get(*groups[i].first);
    os << (i ? ", " : "") << RanksWith(groups[i].second, value.str());
  }
  *message = os.str();
  return true;
}

// Whether the ranks put the tensor in different grouped calls (checked for every ready tensor, so
// without building any text).
bool GroupsDiffer(const std::map<int32_t, Request>& by_rank);

// The grouped call a request belongs to, described for the error.
std::string GroupOf(const Request& r);

// Why the ranks' agreed reduction is not defined for their tensor (Adasum of integers or of a
// reducescatter, Average or scale factors of bools), with its status code; empty if it is.
std::string UndefinedReduction(const Request& agreed, horo_status_t* code);

// The refusals among the requests (Request::refusal), each with its rank; empty if none refused.
std::string Refusals(const std::map<int32_t, Request>& by_rank);

// The first invalid root rank or alltoall split among the requests, described; empty if none.
std::string InvalidArguments(const std::map<int32_t, Request>& by_rank, const std::vector<int32_t>& members);

}  // namespace request_checks
}  // namespace horo
