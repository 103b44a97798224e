// The Executor's steps agreed between the peers whose data came with the announcements
// (coordinator/peer_agreement.h): small allreduces, reducescatters, allgathers, alltoalls and
// broadcasts that every member computes from every member's contribution (a broadcast: the root's),
// with no data-plane step.
#include "runtime/executor.h"

#include <algorithm>
#include <cstring>

#include "collectives/adasum.h"
#include "collectives/reduce_kernels.h"
#include "coordinator/peer_agreement.h"
#include "runtime/executor_arithmetic.h"

namespace horo {

Status Executor::RunFromContributions(const Response& r, const std::vector<std::string>& contributions) {
  const std::vector<int32_t>* members = members_view_.Get(r.process_set_id);
  if (members == nullptr || !std::binary_search(members->begin(), members->end(), rank_)) {
    return Status::OK();  // not a member: nothing to do
  }
  const int group_size = static_cast<int>(members->size());
  // Only an error needs it, so it is not built (and allocated) on every call.
  auto what = [&r] { return std::string(OpTypeName(r.op_type)) + " of tensor '" + r.name + "'"; };
  if (static_cast<int>(contributions.size()) != group_size) {
    return Status::Internal(what() + " has " + std::to_string(contributions.size()) + " contributions for " +
                            std::to_string(group_size) + " members");
  }
  for (size_t m = 0; m < contributions.size(); ++m) {
    const int64_t want = PeerAgreement::EagerBytes(r, *members, m);
    if (static_cast<int64_t>(contributions[m].size()) != want) {
      return Status::Internal(what() + ": a contribution of " + std::to_string(contributions[m].size()) +
                              " bytes from member " + std::to_string(m) + ", expected " + std::to_string(want));
    }
  }
  if (r.op_type == OpType::kAllgather) return GatherContributions(r, contributions);
  if (r.op_type == OpType::kBroadcast) return BroadcastContributions(r, contributions, *members);
  const int index = static_cast<int>(std::lower_bound(members->begin(), members->end(), rank_) - members->begin());
  if (r.op_type == OpType::kReducescatter) return ScatterContributions(r, contributions, group_size, index);
  if (r.op_type == OpType::kAlltoall) {
    if (r.member_dims.size() != static_cast<size_t>(group_size) * static_cast<size_t>(group_size)) {
      return Status::Internal(what() + " has " + std::to_string(r.member_dims.size()) + " splits for " +
                              std::to_string(group_size) + " members");
    }
    return ExchangeContributions(r, contributions, group_size, index);
  }
  return ReduceContributions(r, contributions, group_size);
}

Status Executor::GatherContributions(const Response& r, const std::vector<std::string>& contributions) {
  Slot slot;
  HORO_RETURN_IF_ERROR(TakeSlot(r, &slot));
  trace_.Open(r);
  trace_.Activity("ALLGATHER_FROM_ANNOUNCEMENTS");
  int64_t rows = 0;
  int64_t bytes = 0;
  for (size_t m = 0; m < contributions.size(); ++m) {
    rows += r.member_dims[m];
    bytes += static_cast<int64_t>(contributions[m].size());
  }
  HandleResult result;
  uint8_t* out = ResultBuffer(slot, bytes, &result);
  for (const std::string& c : contributions) {
    if (!c.empty()) std::memcpy(out, c.data(), c.size());
    out += c.size();
  }
  result.shape = r.shape;
  result.shape[0] = rows;
  allgather_from_announcements_.fetch_add(1, std::memory_order_relaxed);
  Finish(slot, Status::OK(), &result);
  trace_.Close();
  return Status::OK();
}

Status Executor::ExchangeContributions(const Response& r, const std::vector<std::string>& contributions,
                                       int group_size, int member_index) {
  const size_t n = static_cast<size_t>(group_size);
  const size_t me = static_cast<size_t>(member_index);
  const int64_t row_bytes = RowElements(r.shape) * static_cast<int64_t>(DataTypeSize(r.dtype));
  Slot slot;
  HORO_RETURN_IF_ERROR(TakeSlot(r, &slot));
  trace_.Open(r);
  trace_.Activity("ALLTOALL_FROM_ANNOUNCEMENTS");
  HandleResult result;
  int64_t rows = 0;
  for (size_t m = 0; m < n; ++m) {
    result.received_splits.push_back(r.member_dims[m * n + me]);
    rows += r.member_dims[m * n + me];
  }
  uint8_t* out = ResultBuffer(slot, rows * row_bytes, &result);
  for (size_t m = 0; m < n; ++m) {
    int64_t before = 0;  // the rows member m sends the members ahead of this one
    for (size_t j = 0; j < me; ++j) before += r.member_dims[m * n + j];
    const size_t bytes = static_cast<size_t>(r.member_dims[m * n + me] * row_bytes);
    if (bytes > 0) std::memcpy(out, contributions[m].data() + before * row_bytes, bytes);
    out += bytes;
  }
  result.shape = slot.entry.request.shape;
  result.shape[0] = rows;
  alltoall_from_announcements_.fetch_add(1, std::memory_order_relaxed);
  Finish(slot, Status::OK(), &result);
  trace_.Close();
  return Status::OK();
}

Status Executor::ReduceContributions(const Response& r, const std::vector<std::string>& contributions,
                                     int group_size) {
  Slot slot;
  HORO_RETURN_IF_ERROR(TakeSlot(r, &slot));
  trace_.Open(r);
  trace_.Activity("ALLREDUCE_FROM_ANNOUNCEMENTS");
  ReduceAll(r, BytesOf(contributions), group_size, slot.entry.output);
  Finish(slot, Status::OK());
  trace_.Close();
  return Status::OK();
}

Status Executor::BroadcastContributions(const Response& r, const std::vector<std::string>& contributions,
                                        const std::vector<int32_t>& members) {
  Slot slot;
  HORO_RETURN_IF_ERROR(TakeSlot(r, &slot));
  trace_.Open(r);
  trace_.Activity("BROADCAST_FROM_ANNOUNCEMENTS");
  CopyRoot(r, BytesOf(contributions), members, slot.entry.output);
  Finish(slot, Status::OK());
  trace_.Close();
  return Status::OK();
}

void Executor::RunAnnounced(const Response& r, const std::vector<const char*>& contributions, void* out) {
  if (r.op_type == OpType::kBroadcast) {
    CopyRoot(r, contributions, *members_view_.Get(r.process_set_id), out);  // the caller's set (CompleteAlone)
  } else {
    ReduceAll(r, contributions, static_cast<int>(contributions.size()), out);
  }
}

void Executor::CopyRoot(const Response& r, const std::vector<const char*>& contributions,
                        const std::vector<int32_t>& members, void* out) {
  const size_t root = static_cast<size_t>(std::lower_bound(members.begin(), members.end(), r.root_rank) -
                                          members.begin());  // a member: the coordinator checked it
  const size_t bytes = static_cast<size_t>(r.NumElements()) * DataTypeSize(r.dtype);
  if (bytes > 0) std::memcpy(out, contributions[root], bytes);
  broadcast_from_announcements_.fetch_add(1, std::memory_order_relaxed);
}

const std::vector<const char*>& Executor::BytesOf(const std::vector<std::string>& contributions) {
  contribution_bytes_.clear();
  for (const std::string& c : contributions) contribution_bytes_.push_back(c.data());
  return contribution_bytes_;
}

void Executor::ReduceAll(const Response& r, const std::vector<const char*>& contributions, int group_size,
                         void* out) {
  const int64_t count = r.NumElements();
  if (r.reduce_op == ReduceOp::kAdasum) {
    const size_t bytes = static_cast<size_t>(count) * DataTypeSize(r.dtype);
    adasum_vectors_.resize(bytes * contributions.size());
    std::vector<void*> vectors;
    for (size_t m = 0; m < contributions.size(); ++m) {
      vectors.push_back(adasum_vectors_.data() + m * bytes);
      std::memcpy(vectors.back(), contributions[m], bytes);
      Scale(vectors.back(), count, r.dtype, r.prescale_factor);
    }
    AdasumCombine(vectors, count, r.dtype);
    std::memcpy(out, vectors.front(), bytes);
    Scale(out, count, r.dtype, r.postscale_factor);
  } else {
    ReduceFrom(contributions, 0, count, r, out);
    Postscale(out, count, r, group_size);
  }
  allreduce_from_announcements_.fetch_add(1, std::memory_order_relaxed);
}

Status Executor::ScatterContributions(const Response& r, const std::vector<std::string>& contributions,
                                      int group_size, int member_index) {
  const int64_t row_elems = RowElements(r.shape);
  const int64_t rows = PartRows(r.shape[0], group_size, member_index);
  const int64_t count = rows * row_elems;
  const size_t first = static_cast<size_t>(PartFirstRow(r.shape[0], group_size, member_index) * row_elems);
  Slot slot;
  HORO_RETURN_IF_ERROR(TakeSlot(r, &slot));
  trace_.Open(r);
  trace_.Activity("REDUCESCATTER_FROM_ANNOUNCEMENTS");
  HandleResult result;
  uint8_t* out = ResultBuffer(slot, count * static_cast<int64_t>(DataTypeSize(r.dtype)), &result);
  result.shape = r.shape;
  result.shape[0] = rows;
  if (count > 0) {
    ReduceFrom(BytesOf(contributions), first, count, r, out);
    Postscale(out, count, r, group_size);
  }
  reducescatter_from_announcements_.fetch_add(1, std::memory_order_relaxed);
  Finish(slot, Status::OK(), &result);
  trace_.Close();
  return Status::OK();
}

void Executor::ReduceFrom(const std::vector<const char*>& contributions, size_t first, int64_t count,
                          const Response& r, void* out) {
  const size_t esize = DataTypeSize(r.dtype);
  const size_t bytes = static_cast<size_t>(count) * esize;
  std::memcpy(out, contributions[0] + first * esize, bytes);
  Scale(out, count, r.dtype, r.prescale_factor);
  for (size_t m = 1; m < contributions.size(); ++m) {
    const void* theirs = contributions[m] + first * esize;
    if (r.prescale_factor != 1.0) {  // scaled in a copy; else reduced from where it lies
      contribution_.resize(bytes);
      std::memcpy(contribution_.data(), theirs, bytes);
      Scale(contribution_.data(), count, r.dtype, r.prescale_factor);
      theirs = contribution_.data();
    }
    ReduceInto(out, theirs, count, r.dtype, CollectiveOp(r.reduce_op));
  }
}

}  // namespace horo
