// The coordinator's checks of what the ranks asked for, and the texts of its errors: the first
// field in which two ranks' requests for one tensor differ, grouped calls that disagree, arguments
// that one rank could check alone but that would leave the others waiting (a root outside the
// process set, bad alltoall splits), and the error response every member then receives. Used by
// coordinator.cc and coordinator_construct.cc.
#pragma once

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
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

// An error response for a tensor (or a process-set change, set 0) that every member receives.
Response ErrorResponse(int32_t set_id, const std::string& name, horo_status_t code, const std::string& message);

// Compares one field of every request with the first (lowest rank) and describes the first
// difference: "<what> for <op> tensor 'x': rank 0 has A, rank 2 has B".
template <typename Get>
bool FindMismatch(const std::map<int32_t, Request>& by_rank, const char* what, Get get, std::string* message) {
  const auto& first = *by_rank.begin();
  for (const auto& kv : by_rank) {
    if (get(kv.second) != get(first.second)) {
      std::ostringstream os;
      os << "Mismatched " << what << " for " << OpTypeName(first.second.op_type) << " tensor "
         << Quote(first.second.name) << ": rank " << first.first << " has " << get(first.second) << ", rank "
         << kv.first << " has " << get(kv.second);
      *message = os.str();
      return true;
    }
  }
  return false;
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
