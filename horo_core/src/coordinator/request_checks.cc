#include "coordinator/request_checks.h"

#include <algorithm>
#include <charconv>

#include "collectives/adasum.h"

namespace horo {
namespace request_checks {

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

std::string Quote(const std::string& name) { return "'" + name + "'"; }

std::string NumberText(double value) {
  char text[32];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
}

std::string RanksWith(const std::vector<int32_t>& ranks, const std::string& value) {
  constexpr size_t kNamed = 8;
  std::ostringstream os;
  os << (ranks.size() > 1 ? "ranks " : "rank ");
  for (size_t i = 0; i < ranks.size() && i < kNamed; ++i) os << (i ? ", " : "") << ranks[i];
  if (ranks.size() > kNamed) os << " and " << ranks.size() - kNamed << " more";
  os << (ranks.size() > 1 ? " have " : " has ") << value;
  return os.str();
}

Response ErrorResponse(int32_t set_id, const std::string& name, horo_status_t code, const std::string& message) {
  Response r;
  r.kind = ResponseKind::kError;
  r.process_set_id = set_id;
  r.name = name;
  r.error_code = code;
  r.error_message = message;
  return r;
}

bool GroupsDiffer(const std::map<int32_t, Request>& by_rank) {
  const Request& first = by_rank.begin()->second;
  for (const auto& kv : by_rank) {
    const Request& r = kv.second;
    if (r.group_size != first.group_size || (r.group_size > 1 && r.group_leader != first.group_leader)) return true;
  }
  return false;
}

std::string GroupOf(const Request& r) {
  if (r.group_size <= 1) return "it as a single tensor";  // a plain call, or a grouped call of one
  return "it in a group of " + std::to_string(r.group_size) + " tensors led by " + Quote(r.group_leader);
}

std::string MembersText(const std::vector<int32_t>& members) {
  std::vector<int64_t> v(members.begin(), members.end());
  return ShapeText(v);
}

std::string UndefinedReduction(const Request& agreed, horo_status_t* code) {
  if (agreed.op_type != OpType::kAllreduce && agreed.op_type != OpType::kReducescatter) return std::string();
  const std::string label = std::string(OpTypeName(agreed.op_type)) + " tensor " + Quote(agreed.name);
  *code = HORO_ERR_INVALID_ARGUMENT;
  if (agreed.reduce_op == ReduceOp::kAdasum) {
    if (agreed.op_type != OpType::kAllreduce) {
      *code = HORO_ERR_UNSUPPORTED;
      return label + ": Adasum applies to allreduce only";
    }
    if (!AdasumSupports(agreed.dtype)) {
      return label + ": Adasum is defined for float16, bfloat16, float32 and float64 tensors, got " +
             DataTypeName(agreed.dtype);
    }
  }
  if (agreed.dtype == DataType::kBool && agreed.reduce_op == ReduceOp::kAverage) {
    return label + ": Average is not defined for bool tensors; use Sum, Min or Max";
  }
  if (agreed.dtype == DataType::kBool && (agreed.prescale_factor != 1.0 || agreed.postscale_factor != 1.0)) {
    return label + ": scale factors are not defined for bool tensors";
  }
  return std::string();
}

std::string Refusals(const std::map<int32_t, Request>& by_rank) {
  // Ranks with the same reason (every rank passing the same unsupported dtype, say) share one entry.
  std::vector<std::pair<std::string, std::vector<int32_t>>> reasons;
  for (const auto& kv : by_rank) {
    const std::string& reason = kv.second.refusal;
    if (reason.empty()) continue;
    auto same = std::find_if(reasons.begin(), reasons.end(), [&](const auto& e) { return e.first == reason; });
    if (same == reasons.end()) {
      reasons.push_back({reason, {kv.first}});
    } else {
      same->second.push_back(kv.first);
    }
  }
  if (reasons.empty()) return std::string();
  const Request& first = by_rank.begin()->second;
  std::ostringstream os;
  os << OpTypeName(first.op_type) << " tensor " << Quote(first.name) << ": ";
  for (size_t i = 0; i < reasons.size(); ++i) {
    const std::vector<int32_t>& ranks = reasons[i].second;
    os << (i ? "; " : "") << (ranks.size() > 1 ? "ranks " : "rank ");
    for (size_t j = 0; j < ranks.size(); ++j) os << (j ? ", " : "") << ranks[j];
    os << " " << reasons[i].first;
  }
  return os.str();
}

std::string InvalidArguments(const std::map<int32_t, Request>& by_rank, const std::vector<int32_t>& members) {
  const int64_t n = static_cast<int64_t>(members.size());
  for (const auto& kv : by_rank) {
    const Request& r = kv.second;
    const std::string label = std::string(OpTypeName(r.op_type)) + " tensor " + Quote(r.name) + ": rank " +
                              std::to_string(kv.first);
    if (r.op_type == OpType::kBroadcast &&
        std::find(members.begin(), members.end(), r.root_rank) == members.end()) {
      return label + " asked for root rank " + std::to_string(r.root_rank) + ", which is not a member of the process set " +
             MembersText(members);
    }
    if (r.op_type != OpType::kAlltoall) continue;
    const int64_t rows = r.shape.empty() ? 0 : r.shape[0];
    if (r.splits.empty()) {
      if (rows % n != 0) {
        return label + " passed no splits, but its first dimension " + std::to_string(rows) +
               " is not divisible by the " + std::to_string(n) + " ranks of the process set";
      }
      continue;
    }
    if (static_cast<int64_t>(r.splits.size()) != n) {
      return label + " passed " + std::to_string(r.splits.size()) + " splits, expected one per rank of the process set (" +
             std::to_string(n) + ")";
    }
    int64_t sum = 0;
    for (int64_t v : r.splits) {
      if (v < 0) return label + " passed a negative split " + std::to_string(v);
      sum += v;
    }
    if (sum != rows) {
      return label + " passed splits that sum to " + std::to_string(sum) + ", expected its first dimension " +
             std::to_string(rows);
    }
  }
  return std::string();
}

}  // namespace request_checks
}  // namespace horo
