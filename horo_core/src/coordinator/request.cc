#include "coordinator/request.h"

#include "coordinator/wire.h"

namespace horo {

int64_t Request::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

void WriteRequest(WireWriter& w, const Request& r) {
  w.I32(static_cast<int32_t>(r.kind));
  w.I32(r.rank);
  w.I32(r.process_set_id);
  w.I32(static_cast<int32_t>(r.op_type));
  w.Str(r.name);
  w.I32(static_cast<int32_t>(r.dtype));
  w.I64Vec(r.shape);
  w.I32(static_cast<int32_t>(r.reduce_op));
  w.F64(r.prescale_factor);
  w.F64(r.postscale_factor);
  w.I32(r.root_rank);
  w.I64Vec(r.splits);
  w.Str(r.group_leader);
  w.I32(r.group_size);
  w.I32Vec(r.ranks);
  w.I32(r.device);
  w.Str(r.refusal);
}

std::string SerializeRequestList(const RequestList& list) {
  WireWriter w;
  w.U8(list.shutdown ? 1 : 0);
  w.Str(list.failure);
  w.I64(static_cast<int64_t>(list.requests.size()));
  for (const Request& r : list.requests) WriteRequest(w, r);
  // Only while the timeline is on: a list without events is byte for byte what it always was.
  if (!list.timeline.empty()) w.Str(list.timeline);
  return w.Take();
}

Status ParseRequestList(const std::string& bytes, RequestList* out) {
  WireReader rd(bytes);
  RequestList list;
  list.shutdown = rd.U8() != 0;
  list.failure = rd.Str();
  int64_t n = rd.I64();
  if (!rd.ok() || n < 0 || n > static_cast<int64_t>(bytes.size())) {
    return Status::Internal("malformed request list header");
  }
  list.requests.resize(n);
  for (Request& r : list.requests) {
    r.kind = static_cast<RequestKind>(rd.I32());
    r.rank = rd.I32();
    r.process_set_id = rd.I32();
    int32_t op = rd.I32();
    r.name = rd.Str();
    int32_t dtype = rd.I32();
    r.shape = rd.I64Vec();
    int32_t reduce_op = rd.I32();
    r.prescale_factor = rd.F64();
    r.postscale_factor = rd.F64();
    r.root_rank = rd.I32();
    r.splits = rd.I64Vec();
    r.group_leader = rd.Str();
    r.group_size = rd.I32();
    r.ranks = rd.I32Vec();
    r.device = rd.I32();
    r.refusal = rd.Str();
    if (!rd.ok() || !IsValidOpType(op) || !IsValidDataType(dtype) || !IsValidReduceOp(reduce_op)) {
      return Status::Internal("malformed request in request list");
    }
    r.op_type = static_cast<OpType>(op);
    r.dtype = static_cast<DataType>(dtype);
    r.reduce_op = static_cast<ReduceOp>(reduce_op);
  }
  if (!rd.AtEnd()) list.timeline = rd.Str();
  if (!rd.ok() || !rd.AtEnd()) return Status::Internal("malformed timeline events or trailing bytes after request list");
  *out = std::move(list);
  return Status::OK();
}

}  // namespace horo
