#include "coordinator/response.h"

#include "coordinator/wire.h"

namespace horo {

int64_t Response::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

bool IsValidToggle(int32_t value) { return value >= 0 && value <= static_cast<int32_t>(Toggle::kOff); }

void WriteResponse(WireWriter& w, const Response& r) {
  w.I32(static_cast<int32_t>(r.kind));
  w.I32(static_cast<int32_t>(r.op_type));
  w.I32(r.process_set_id);
  w.Str(r.name);
  w.I32(static_cast<int32_t>(r.dtype));
  w.I32(static_cast<int32_t>(r.reduce_op));
  w.F64(r.prescale_factor);
  w.F64(r.postscale_factor);
  w.I32(r.root_rank);
  w.I64Vec(r.shape);
  w.I64Vec(r.member_dims);
  w.I32(r.error_code);
  w.Str(r.error_message);
  w.I32(r.last_joined_rank);
  w.I32Vec(r.ranks);
  w.I32Vec(r.joined_ranks);
  w.U8(r.on_device ? 1 : 0);
  w.I32(static_cast<int32_t>(r.hierarchical_allreduce));
  w.I64(r.small_message_bytes);
  w.I32(static_cast<int32_t>(r.hierarchical_allgather));
  w.I64(r.fusion_threshold_bytes);
  w.I64(r.slice_bytes);
}

bool ReadResponse(WireReader& rd, Response* r) {
  int32_t kind = rd.I32();
  int32_t op = rd.I32();
  r->process_set_id = rd.I32();
  r->name = rd.Str();
  int32_t dtype = rd.I32();
  int32_t reduce_op = rd.I32();
  r->prescale_factor = rd.F64();
  r->postscale_factor = rd.F64();
  r->root_rank = rd.I32();
  r->shape = rd.I64Vec();
  r->member_dims = rd.I64Vec();
  r->error_code = rd.I32();
  r->error_message = rd.Str();
  r->last_joined_rank = rd.I32();
  r->ranks = rd.I32Vec();
  r->joined_ranks = rd.I32Vec();
  r->on_device = rd.U8() != 0;
  int32_t hierarchical = rd.I32();
  r->small_message_bytes = rd.I64();
  int32_t hierarchical_allgather = rd.I32();
  r->fusion_threshold_bytes = rd.I64();
  r->slice_bytes = rd.I64();
  if (!rd.ok() || kind < 0 || kind > static_cast<int32_t>(ResponseKind::kShutdown) || !IsValidOpType(op) ||
      !IsValidDataType(dtype) || !IsValidReduceOp(reduce_op) || !IsValidToggle(hierarchical) ||
      !IsValidToggle(hierarchical_allgather) || r->slice_bytes < 0) {
    return false;
  }
  r->hierarchical_allreduce = static_cast<Toggle>(hierarchical);
  r->hierarchical_allgather = static_cast<Toggle>(hierarchical_allgather);
  r->kind = static_cast<ResponseKind>(kind);
  r->op_type = static_cast<OpType>(op);
  r->dtype = static_cast<DataType>(dtype);
  r->reduce_op = static_cast<ReduceOp>(reduce_op);
  return true;
}

}  // namespace

bool Fusable(const Response& head, const Response& r) {
  auto allreduce = [](const Response& x) { return x.kind == ResponseKind::kOp && x.op_type == OpType::kAllreduce; };
  return allreduce(head) && allreduce(r) && r.process_set_id == head.process_set_id && r.dtype == head.dtype &&
         r.reduce_op == head.reduce_op && r.prescale_factor == head.prescale_factor &&
         r.postscale_factor == head.postscale_factor && r.joined_ranks == head.joined_ranks &&
         r.on_device == head.on_device && r.hierarchical_allreduce == head.hierarchical_allreduce &&
         r.small_message_bytes == head.small_message_bytes && r.slice_bytes == head.slice_bytes;
}

std::string SerializeResponseList(const ResponseList& list) {
  WireWriter w;
  w.U8(list.has_parameters ? 1 : 0);
  if (list.has_parameters) {
    w.I64(list.parameters.fusion_threshold_bytes);
    w.F64(list.parameters.cycle_time_ms);
    w.I64(list.parameters.small_message_bytes);
  }
  w.I64Vec(list.evicted_ids);
  w.I64(static_cast<int64_t>(list.fused.size()));
  for (const auto& parts : list.fused) {
    w.I64(static_cast<int64_t>(parts.size()));
    for (const ResponsePart& p : parts) {
      w.I64(p.cache_id);
      if (p.cache_id >= 0) continue;
      w.I64(p.assign_id);
      WriteResponse(w, p.response);
    }
  }
  w.I64(list.after_round);
  return w.Take();
}

Status ParseResponseList(const std::string& bytes, ResponseList* out) {
  WireReader rd(bytes);
  ResponseList list;
  const uint8_t has_parameters = rd.U8();
  if (has_parameters > 1) return Status::Internal("malformed response list: parameter flag " + std::to_string(has_parameters));
  list.has_parameters = has_parameters == 1;
  if (list.has_parameters) {
    TunedParameters& p = list.parameters;
    p.fusion_threshold_bytes = rd.I64();
    p.cycle_time_ms = rd.F64();
    p.small_message_bytes = rd.I64();
    if (rd.ok() && (p.fusion_threshold_bytes < 0 || !(p.cycle_time_ms >= 0 && p.cycle_time_ms <= 1e6) ||
                    p.small_message_bytes < 0)) {
      return Status::Internal("malformed response list: invalid tuned parameters");
    }
  }
  list.evicted_ids = rd.I64Vec();
  int64_t groups = rd.I64();
  if (!rd.ok() || groups < 0 || groups > static_cast<int64_t>(bytes.size())) {
    return Status::Internal("malformed response list header");
  }
  list.fused.resize(groups);
  for (auto& parts : list.fused) {
    int64_t n = rd.I64();
    if (!rd.ok() || n < 0 || n > static_cast<int64_t>(bytes.size())) {
      return Status::Internal("malformed fused response");
    }
    parts.resize(n);
    for (ResponsePart& p : parts) {
      p.cache_id = rd.I64();
      if (p.cache_id >= 0) continue;
      p.assign_id = rd.I64();
      if (!ReadResponse(rd, &p.response)) return Status::Internal("malformed response");
    }
  }
  list.after_round = rd.I64();
  if (!rd.ok() || !rd.AtEnd()) return Status::Internal("malformed response list");
  *out = std::move(list);
  return Status::OK();
}

bool ShutdownIn(const ResponseList& list, Status* reason) {
  for (const auto& parts : list.fused) {
    const ResponsePart& first = parts.front();
    if (first.cache_id < 0 && first.response.kind == ResponseKind::kShutdown) {
      *reason = Status(first.response.error_code, first.response.error_message);
      return true;
    }
  }
  return false;
}

}  // namespace horo
