// How the coordinator turns the requests of every member for one tensor into the response every
// rank executes (Coordinator::Construct), or into the error every member receives when they
// disagree or an argument is invalid; and the same for a process-set change (ConstructSetChange).
// The checks themselves are request_checks.h.
#include <sstream>

#include "coordinator/coordinator.h"
#include "coordinator/request_checks.h"

namespace horo {

using request_checks::ErrorResponse;
using request_checks::FindMismatch;
using request_checks::InvalidArguments;
using request_checks::NumberText;
using request_checks::Quote;
using request_checks::ShapeText;

Response Coordinator::Construct(int32_t set_id, const std::string& name, const Pending& pending,
                                const std::vector<int32_t>& members, const std::vector<int32_t>& joined) {
  const Request& first = pending.by_rank.begin()->second;
  std::string message;
  if (members.empty()) {
    return ErrorResponse(set_id, name, HORO_ERR_INVALID_ARGUMENT,
                         "process set " + std::to_string(set_id) + " does not exist (removed while tensor " +
                             Quote(name) + " was in flight)");
  }
  // A rank that could not take part fails the tensor everywhere, whatever the others passed.
  message = request_checks::Refusals(pending.by_rank);
  if (!message.empty()) return ErrorResponse(set_id, name, HORO_ERR_INVALID_ARGUMENT, message);
  if (FindMismatch(pending.by_rank, "operations", [](const Request& r) { return std::string(OpTypeName(r.op_type)); },
                   &message) ||
      FindMismatch(pending.by_rank, "data types", [](const Request& r) { return std::string(DataTypeName(r.dtype)); },
                   &message) ||
      FindMismatch(pending.by_rank, "CPU/GPU device selection",
                   [](const Request& r) { return std::string(r.device == 0 ? "CPU" : "GPU"); }, &message)) {
    return ErrorResponse(set_id, name, HORO_ERR_MISMATCH, message);
  }
  const OpType op = first.op_type;
  if (!joined.empty() && first.device != 0) {
    return ErrorResponse(set_id, name, HORO_ERR_UNSUPPORTED,
                         "allreduce of CUDA tensor " + Quote(name) + " is not supported while ranks have joined process set " +
                             std::to_string(set_id) + "; pass host tensors (or let horo_torch stage them) with join");
  }
  if (!joined.empty() && op != OpType::kAllreduce && op != OpType::kBarrier) {
    std::ostringstream os;
    os << OpTypeName(op) << " of tensor " << Quote(name) << " is not supported while ranks have joined (rank";
    for (int32_t r : joined) os << " " << r;
    os << " joined process set " << set_id << "); only allreduce works with join";
    return ErrorResponse(set_id, name, HORO_ERR_MISMATCH, os.str());
  }
  if (op == OpType::kAllgather || op == OpType::kAlltoall || op == OpType::kReducescatter) {
    // Checked here rather than where the tensor is submitted, so that every rank gets the error
    // (a scalar on one rank only would otherwise leave the others waiting).
    std::ostringstream scalars;
    int scalar_ranks = 0;
    for (const auto& kv : pending.by_rank) {
      if (kv.second.shape.empty()) scalars << (scalar_ranks++ ? ", " : "") << kv.first;
    }
    if (scalar_ranks > 0) {
      return ErrorResponse(set_id, name, HORO_ERR_INVALID_ARGUMENT,
                           std::string(OpTypeName(op)) + " tensor " + Quote(name) + " needs tensors of rank >= 1; " +
                               (scalar_ranks > 1 ? "ranks " : "rank ") + scalars.str() +
                               (scalar_ranks > 1 ? " passed scalars" : " passed a scalar"));
    }
  }
  bool mismatch = false;
  auto shape_of = [](const Request& r) { return ShapeText(r.shape); };
  auto trailing_shape_of = [](const Request& r) {
    std::vector<int64_t> rest(r.shape.begin() + (r.shape.empty() ? 0 : 1), r.shape.end());
    return "rank " + std::to_string(r.shape.size()) + " tensor with trailing dimensions " + ShapeText(rest);
  };
  auto reduce_op_of = [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); };
  auto scales_of = [](const Request& r) {
    return "prescale " + NumberText(r.prescale_factor) + " / postscale " + NumberText(r.postscale_factor);
  };
  switch (op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      mismatch = FindMismatch(pending.by_rank, "reduction operations", reduce_op_of, &message) ||
                 FindMismatch(pending.by_rank, "scale factors", scales_of, &message) ||
                 FindMismatch(pending.by_rank, "shapes", shape_of, &message);
      break;
    case OpType::kBroadcast:
      mismatch = FindMismatch(pending.by_rank, "root ranks", [](const Request& r) { return r.root_rank; }, &message) ||
                 FindMismatch(pending.by_rank, "shapes", shape_of, &message);
      break;
    case OpType::kAllgather:
    case OpType::kAlltoall:
      mismatch = FindMismatch(pending.by_rank, "shapes", trailing_shape_of, &message);
      break;
    default:
      break;
  }
  if (mismatch) return ErrorResponse(set_id, name, HORO_ERR_MISMATCH, message);
  // Arguments that one rank alone could check but that would leave the others waiting: checked
  // here so that every rank gets the error.
  message = InvalidArguments(pending.by_rank, members);
  if (!message.empty()) return ErrorResponse(set_id, name, HORO_ERR_INVALID_ARGUMENT, message);
  horo_status_t code = HORO_OK;
  message = request_checks::UndefinedReduction(first, &code);
  if (!message.empty()) return ErrorResponse(set_id, name, code, message);

  Response r;
  r.kind = ResponseKind::kOp;
  r.op_type = op;
  r.process_set_id = set_id;
  r.name = name;
  r.dtype = first.dtype;
  r.reduce_op = first.reduce_op;
  r.prescale_factor = first.prescale_factor;
  r.postscale_factor = first.postscale_factor;
  r.root_rank = first.root_rank;
  r.shape = first.shape;
  r.joined_ranks = joined;
  r.on_device = first.device != 0;
  r.hierarchical_allreduce = config_.hierarchical_allreduce;
  r.small_message_bytes = config_.small_message_bytes;
  // Slices pay off over shared memory only; with it switched off, rings on one host run over TCP.
  r.slice_bytes = config_.shm_disable ? 0 : config_.ring_slice_bytes;
  r.hierarchical_allgather = config_.hierarchical_allgather;
  r.fusion_threshold_bytes = fusion_threshold_bytes_;
  if (op == OpType::kAllgather) {
    for (int32_t m : members) r.member_dims.push_back(pending.by_rank.at(m).shape[0]);
  } else if (op == OpType::kAlltoall) {
    const int64_t n = static_cast<int64_t>(members.size());
    for (int32_t m : members) {
      const Request& req = pending.by_rank.at(m);
      for (int64_t j = 0; j < n; ++j) {
        r.member_dims.push_back(req.splits.empty() ? req.shape[0] / n : req.splits[j]);
      }
    }
  }
  return r;
}

Response Coordinator::ConstructSetChange(const std::string& name, const Pending& pending) {
  const Request& first = pending.by_rank.begin()->second;
  std::string message;
  if (FindMismatch(pending.by_rank, "process set change",
                   [](const Request& r) { return r.kind == RequestKind::kProcessSetAdd ? "add" : "remove"; },
                   &message) ||
      FindMismatch(pending.by_rank, "process set ranks",
                   [](const Request& r) {
                     std::vector<int64_t> v(r.ranks.begin(), r.ranks.end());
                     return ShapeText(v);
                   },
                   &message)) {
    return ErrorResponse(0, name, HORO_ERR_MISMATCH, message);
  }
  Response r;
  r.name = name;
  if (first.kind == RequestKind::kProcessSetAdd) {
    int32_t existing = 0;
    if (sets_->Find(first.ranks, &existing)) {
      std::vector<int64_t> v(first.ranks.begin(), first.ranks.end());
      return ErrorResponse(0, name, HORO_ERR_INVALID_ARGUMENT,
                           "a process set with ranks " + ShapeText(v) + " already exists (id " +
                               std::to_string(existing) + ")");
    }
    r.kind = ResponseKind::kProcessSetAdd;
    r.ranks = first.ranks;
  } else {
    const int32_t id = first.ranks.empty() ? -1 : first.ranks[0];
    std::vector<int32_t> members;
    if (id == 0 || !sets_->Members(id, &members)) {
      return ErrorResponse(0, name, HORO_ERR_INVALID_ARGUMENT,
                           "cannot remove process set " + std::to_string(id) + ": it does not exist or is the global set");
    }
    r.kind = ResponseKind::kProcessSetRemove;
    r.process_set_id = id;
  }
  return r;
}

}  // namespace horo
