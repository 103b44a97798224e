#include "runtime/executor.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "collectives/adasum.h"
#include "collectives/reduce_kernels.h"
#include "common/huge_pages.h"
#include "common/logging.h"
#include "runtime/executor_arithmetic.h"

namespace horo {

Executor::Executor(const Config& config, int rank, Transport* transport, ProcessSetTable* sets, TensorQueue* queue,
                   HandleManager* handles, Timeline* timeline)
    : config_(config),
      rank_(rank),
      transport_(transport),
      sets_(sets),
      members_view_(sets),
      queue_(queue),
      handles_(handles),
      trace_(timeline) {
  allreduce_options_.small_message_bytes = config.small_message_bytes;
  allreduce_options_.chunk_bytes = config.chunk_bytes;
  allreduce_options_.slice_bytes = config.ring_slice_bytes;
}

bool Executor::GroupOf(int32_t set_id, CommGroup* group) {
  static_assert(std::is_same<decltype(group->ranks), std::vector<int32_t>>::value, "members are read in place");
  if (!sets_->Members(set_id, &group->ranks)) return false;
  auto it = std::find(group->ranks.begin(), group->ranks.end(), rank_);
  if (it == group->ranks.end()) return false;
  group->transport = &transport_;
  group->index = static_cast<int>(it - group->ranks.begin());
  return true;
}

Status Executor::TopologyOf(int32_t set_id, const CommGroup& group, const HostTopology** topology) {
  if (!host_ids_fetched_) {
    host_ids_ = transport_.HostIds();
    host_ids_fetched_ = true;
  }
  auto it = topologies_.find(set_id);
  if (it == topologies_.end() || it->second.ranks != group.ranks) {
    SetTopology computed;
    computed.ranks = group.ranks;
    HORO_RETURN_IF_ERROR(BuildHostTopology(group.ranks, group.index, host_ids_, &computed.topology));
    const HostTopology& t = computed.topology;
    HORO_LOG(kDebug, rank_) << "process set " << set_id << ": " << group.size() << " members on " << t.num_hosts()
                            << " hosts, local index " << t.local_index << " of " << t.local_size()
                            << ", cross index " << t.cross_index() << " of " << t.cross_size();
    it = topologies_.insert_or_assign(set_id, std::move(computed)).first;
  }
  *topology = &it->second.topology;
  return Status::OK();
}

Status Executor::AllreduceOptionsFor(const CommGroup& group, const Response& head, AllreduceOptions* options) {
  *options = allreduce_options_;
  if (!small_message_bytes_tuned_) options->small_message_bytes = head.small_message_bytes;
  options->hierarchical = head.hierarchical_allreduce;
  options->slice_bytes = head.slice_bytes;
  return TopologyOf(head.process_set_id, group, &options->topology);
}

Status Executor::ReduceAcrossGroup(const CommGroup& group, const Response& head, void* buffer, int64_t count) {
  AllreduceOptions options;
  HORO_RETURN_IF_ERROR(AllreduceOptionsFor(group, head, &options));
  bool scaled_in_ring = false;
  if (group.size() > 1 && count > 0) {
    const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(head.dtype));
    const AllreduceAlgorithm algorithm = ChooseAllreduceAlgorithm(bytes, options);
    allreduce_runs_[static_cast<int>(algorithm)].fetch_add(1, std::memory_order_relaxed);
    trace_.Activity(AllreduceAlgorithmTimelineName(algorithm));
    HORO_LOG(kTrace, rank_) << "allreduce '" << head.name << "' (" << bytes << " bytes, process set "
                            << head.process_set_id << "): " << AllreduceAlgorithmName(algorithm);
    // The ring scales each block right after reducing it, while it is in cache: Average's division
    // (DistributedOptimizer's default) then costs no pass of its own over every gradient.
    if (algorithm == AllreduceAlgorithm::kRing && IsFloatingPoint(head.dtype)) {
      options.ring_postscale = PostscaleFactor(head, group.size());
      scaled_in_ring = true;
    }
  }
  HORO_RETURN_IF_ERROR(Allreduce(group, buffer, count, head.dtype, CollectiveOp(head.reduce_op), options));
  if (!scaled_in_ring) Postscale(buffer, count, head, group.size());
  return Status::OK();
}

ExecutorStats Executor::Stats() const {
  ExecutorStats stats;
  for (int a = 0; a < kAllreduceAlgorithmCount; ++a) stats.allreduce_runs[a] = allreduce_runs_[a].load(std::memory_order_relaxed);
  for (int a = 0; a < kAllgatherAlgorithmCount; ++a) stats.allgather_runs[a] = allgather_runs_[a].load(std::memory_order_relaxed);
  stats.sent = transport_.sent();
  stats.allreduce_from_announcements = allreduce_from_announcements_.load(std::memory_order_relaxed);
  stats.allgather_from_announcements = allgather_from_announcements_.load(std::memory_order_relaxed);
  stats.reducescatter_from_announcements = reducescatter_from_announcements_.load(std::memory_order_relaxed);
  stats.alltoall_from_announcements = alltoall_from_announcements_.load(std::memory_order_relaxed);
  stats.broadcast_from_announcements = broadcast_from_announcements_.load(std::memory_order_relaxed);
  return stats;
}

Status Executor::TakeSlot(const Response& response, Slot* slot) {
  slot->response = &response;
  if (queue_->Take(response.process_set_id, response.name, &slot->entry)) {
    slot->present = true;
    return Status::OK();
  }
  if (std::find(response.joined_ranks.begin(), response.joined_ranks.end(), rank_) == response.joined_ranks.end()) {
    return Status::Internal("response for tensor '" + response.name + "' in process set " +
                            std::to_string(response.process_set_id) + " has no local entry on rank " +
                            std::to_string(rank_));
  }
  const int64_t count = response.NumElements();
  slot->stand_in.resize(count * DataTypeSize(response.dtype));
  FillNeutral(slot->stand_in.data(), count, response.dtype, CollectiveOp(response.reduce_op));
  slot->entry.input = slot->stand_in.data();
  slot->entry.output = slot->stand_in.data();
  return Status::OK();
}

void Executor::Finish(Slot& slot, const Status& status, HandleResult* result) {
  if (slot.present) handles_->Complete(slot.entry.handle, status, result);
}

uint8_t* Executor::ResultBuffer(const Slot& slot, int64_t bytes, HandleResult* result) {
  result->nbytes = bytes;
  uint8_t* out = nullptr;
  if (slot.entry.output != nullptr && slot.entry.output_bytes == bytes) {
    result->allocated = false;
    out = static_cast<uint8_t*>(slot.entry.output);
  } else {
    result->allocated = true;
    result->data.resize(static_cast<size_t>(bytes));
    out = result->data.data();
  }
  // Results are mostly fresh memory, which the collective faults in as it writes (huge_pages.h).
  if (bytes >= static_cast<int64_t>(2 * kHugePageBytes)) AdviseHugePages(out, static_cast<size_t>(bytes));
  return out;
}

uint8_t* Executor::FusionBuffer(int64_t bytes) {
  if (static_cast<int64_t>(fusion_buffer_.size()) < bytes) fusion_buffer_.resize(bytes);
  return fusion_buffer_.data();
}

Status Executor::Execute(const FusedResponse& fused) {
  const Response& head = fused.front();
  if (head.kind == ResponseKind::kError) {
    for (const Response& r : fused) {
      TensorEntry entry;
      if (queue_->Take(r.process_set_id, r.name, &entry)) {
        trace_.Error(r);
        handles_->Complete(entry.handle, Status(r.error_code, r.error_message));
      }
    }
    return Status::OK();
  }
  if (head.kind == ResponseKind::kProcessSetAdd || head.kind == ResponseKind::kProcessSetRemove) {
    HandleResult result;
    if (head.kind == ResponseKind::kProcessSetAdd) {
      result.value = sets_->Add(head.ranks);
    } else {
      sets_->Remove(head.process_set_id);
      topologies_.erase(head.process_set_id);
      result.value = head.process_set_id;
    }
    TensorEntry entry;
    if (queue_->Take(0, head.name, &entry)) handles_->Complete(entry.handle, Status::OK(), &result);
    return Status::OK();
  }

  CommGroup group;
  if (!GroupOf(head.process_set_id, &group)) {
    // Not a member: nothing to do, unless this rank has an entry, which means the set was removed
    // while the tensor was in flight.
    for (const Response& r : fused) {
      TensorEntry entry;
      if (queue_->Take(r.process_set_id, r.name, &entry)) {
        handles_->Complete(entry.handle, Status::InvalidArgument("process set " + std::to_string(r.process_set_id) +
                                                                 " no longer exists (tensor '" + r.name + "')"));
      }
    }
    return Status::OK();
  }

  if (head.op_type == OpType::kBarrier || head.op_type == OpType::kJoin) {
    TensorEntry entry;
    if (queue_->Take(head.process_set_id, head.name, &entry)) {
      trace_.Open(fused);
      HandleResult result;
      result.value = head.last_joined_rank;
      handles_->Complete(entry.handle, Status::OK(), &result);
      trace_.Close();
    }
    return Status::OK();
  }

  std::vector<Slot> slots(fused.size());
  for (size_t i = 0; i < fused.size(); ++i) HORO_RETURN_IF_ERROR(TakeSlot(fused[i], &slots[i]));
  if (head.on_device) return RunOnDevice(group, slots);

  trace_.Open(fused);
  Status status;
  switch (head.op_type) {
    case OpType::kAllreduce: status = RunAllreduce(group, slots); break;
    case OpType::kAllgather: status = RunAllgather(group, slots[0]); break;
    case OpType::kBroadcast: status = RunBroadcast(group, slots[0]); break;
    case OpType::kAlltoall: status = RunAlltoall(group, slots[0]); break;
    case OpType::kReducescatter: status = RunReducescatter(group, slots[0]); break;
    default: status = Status::Internal("unexpected operation in response"); break;
  }
  trace_.Close();
  // On failure the handles stay open: the runtime fails every outstanding handle with the cause it
  // works out (which rank died), not just this rank's view of a closed connection.
  return status;
}

Status Executor::ReduceInPlace(const CommGroup& group, Slot& slot) {
  const Response& r = *slot.response;
  const int64_t count = r.NumElements();
  if (slot.entry.output != slot.entry.input) {
    std::memcpy(slot.entry.output, slot.entry.input, count * DataTypeSize(r.dtype));
  }
  // A joined rank's stand-in holds the op's neutral value, which scaling would change.
  if (slot.present) Scale(slot.entry.output, count, r.dtype, r.prescale_factor);
  HORO_RETURN_IF_ERROR(ReduceAcrossGroup(group, r, slot.entry.output, count));
  Finish(slot, Status::OK());
  return Status::OK();
}

Status Executor::RunAdasum(const CommGroup& group, Slot& slot) {
  const Response& r = *slot.response;
  const int64_t count = r.NumElements();
  const int64_t bytes = count * static_cast<int64_t>(DataTypeSize(r.dtype));
  void* out = slot.entry.output;
  if (out != slot.entry.input) std::memcpy(out, slot.entry.input, bytes);
  if (slot.present) Scale(out, count, r.dtype, r.prescale_factor);
  if (group.size() > 1 && count > 0) {
    // Each member combines every vector itself, in the same order: size times the tensor's memory,
    // and the same bits everywhere (Horovod's recursive halving spreads the work instead).
    adasum_vectors_.resize(bytes * group.size());
    AllgatherOptions options;
    options.hierarchical = r.hierarchical_allgather;
    HORO_RETURN_IF_ERROR(TopologyOf(r.process_set_id, group, &options.topology));
    trace_.Activity("ADASUM_ALLGATHER");
    HORO_RETURN_IF_ERROR(Allgather(group, out, adasum_vectors_.data(), std::vector<int64_t>(group.size(), bytes),
                                   options));
    trace_.Activity("ADASUM_COMBINE");
    std::vector<void*> vectors;
    for (int m = 0; m < group.size(); ++m) vectors.push_back(adasum_vectors_.data() + m * bytes);
    AdasumCombine(vectors, count, r.dtype);
    std::memcpy(out, vectors.front(), bytes);
  }
  Scale(out, count, r.dtype, r.postscale_factor);
  Finish(slot, Status::OK());
  return Status::OK();
}

Status Executor::RunAllreduce(const CommGroup& group, std::vector<Slot>& slots) {
  const Response& head = *slots.front().response;
  const DataType dtype = head.dtype;
  const size_t esize = DataTypeSize(dtype);
  if (head.reduce_op == ReduceOp::kAdasum) {  // per tensor, as Horovod's: each has its own coefficients
    for (Slot& s : slots) HORO_RETURN_IF_ERROR(RunAdasum(group, s));
    return Status::OK();
  }

  // One tensor, and every member of a fused response of at least kInPlaceBytes, is reduced in its
  // output buffer: copying a large tensor into the fusion buffer and back costs two more passes
  // over its bytes (on 2 cores the training benchmark ran 5-8 % faster without them, see
  // docs/benchmarks.md) and saves only a collective's start-up, which is small next to moving a
  // megabyte. The rest is fused.
  // Every rank splits a response the same way: the sizes are part of the response.
  constexpr int64_t kInPlaceBytes = int64_t{1} << 20;
  std::vector<Slot*> fused;
  for (Slot& s : slots) {
    if (slots.size() == 1 || s.response->NumElements() * static_cast<int64_t>(esize) >= kInPlaceBytes) {
      HORO_RETURN_IF_ERROR(ReduceInPlace(group, s));
    } else {
      fused.push_back(&s);
    }
  }
  if (fused.empty()) return Status::OK();
  if (fused.size() == 1) return ReduceInPlace(group, *fused.front());

  int64_t total = 0;
  for (const Slot* s : fused) total += s->response->NumElements();
  trace_.Activity("MEMCPY_IN_FUSION_BUFFER");
  uint8_t* buffer = FusionBuffer(total * esize);
  int64_t offset = 0;
  for (const Slot* s : fused) {
    const int64_t count = s->response->NumElements();
    std::memcpy(buffer + offset, s->entry.input, count * esize);
    // Scaled member by member: a joined rank's stand-ins hold the op's neutral value, which
    // scaling would change (Product, Min and Max).
    if (s->present) Scale(buffer + offset, count, dtype, head.prescale_factor);
    offset += count * esize;
  }
  HORO_RETURN_IF_ERROR(ReduceAcrossGroup(group, head, buffer, total));
  trace_.Activity("MEMCPY_OUT_FUSION_BUFFER");
  offset = 0;
  for (Slot* s : fused) {
    const int64_t bytes = s->response->NumElements() * esize;
    std::memcpy(s->entry.output, buffer + offset, bytes);
    offset += bytes;
    Finish(*s, Status::OK());
  }
  return Status::OK();
}

Status Executor::RunAllgather(const CommGroup& group, Slot& slot) {
  const Response& r = *slot.response;
  const int64_t row_bytes = RowElements(r.shape) * static_cast<int64_t>(DataTypeSize(r.dtype));
  std::vector<int64_t> bytes_per_member;
  int64_t rows = 0;
  for (int64_t d : r.member_dims) {
    bytes_per_member.push_back(d * row_bytes);
    rows += d;
  }
  HandleResult result;
  uint8_t* gathered = ResultBuffer(slot, rows * row_bytes, &result);
  result.shape = r.shape;
  result.shape[0] = rows;
  // The coordinator's setting (stamped in the response) and the set's hosts: every member chooses alike.
  AllgatherOptions options;
  options.hierarchical = r.hierarchical_allgather;
  HORO_RETURN_IF_ERROR(TopologyOf(r.process_set_id, group, &options.topology));
  const AllgatherAlgorithm algorithm = ChooseAllgatherAlgorithm(options);
  if (group.size() > 1) allgather_runs_[static_cast<int>(algorithm)].fetch_add(1, std::memory_order_relaxed);
  trace_.Activity(AllgatherAlgorithmTimelineName(algorithm));
  HORO_RETURN_IF_ERROR(Allgather(group, slot.entry.input, gathered, bytes_per_member, options));
  Finish(slot, Status::OK(), &result);
  return Status::OK();
}

Status Executor::RunBroadcast(const CommGroup& group, Slot& slot) {
  const Response& r = *slot.response;
  const int64_t bytes = r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype));
  auto root = std::find(group.ranks.begin(), group.ranks.end(), r.root_rank);
  const int root_index = static_cast<int>(root - group.ranks.begin());
  if (group.index == root_index && slot.entry.output != slot.entry.input) {
    std::memcpy(slot.entry.output, slot.entry.input, bytes);
  }
  trace_.Activity(kBroadcastAlgorithmName);
  HORO_RETURN_IF_ERROR(Broadcast(group, slot.entry.output, bytes, root_index));
  Finish(slot, Status::OK());
  return Status::OK();
}

Status Executor::RunAlltoall(const CommGroup& group, Slot& slot) {
  const Response& r = *slot.response;
  const int n = group.size();
  const int64_t row_bytes = RowElements(r.shape) * static_cast<int64_t>(DataTypeSize(r.dtype));
  std::vector<int64_t> send_bytes(n), recv_bytes(n);
  HandleResult result;
  int64_t rows = 0;
  for (int j = 0; j < n; ++j) {
    send_bytes[j] = r.member_dims[static_cast<size_t>(group.index) * n + j] * row_bytes;
    const int64_t received = r.member_dims[static_cast<size_t>(j) * n + group.index];
    recv_bytes[j] = received * row_bytes;
    result.received_splits.push_back(received);
    rows += received;
  }
  uint8_t* received = ResultBuffer(slot, rows * row_bytes, &result);
  result.shape = slot.entry.request.shape;
  result.shape[0] = rows;
  trace_.Activity(kAlltoallAlgorithmName);
  HORO_RETURN_IF_ERROR(Alltoall(group, slot.entry.input, send_bytes, received, recv_bytes));
  Finish(slot, Status::OK(), &result);
  return Status::OK();
}

Status Executor::RunReducescatter(const CommGroup& group, Slot& slot) {
  const Response& r = *slot.response;
  const int n = group.size();
  const DataType dtype = r.dtype;
  const size_t esize = DataTypeSize(dtype);
  const int64_t row_elems = RowElements(r.shape);
  const int64_t dim0 = r.shape[0];
  std::vector<int64_t> counts(n);
  for (int i = 0; i < n; ++i) counts[i] = PartRows(dim0, n, i) * row_elems;
  const int64_t total = r.NumElements();
  trace_.Activity("MEMCPY_IN_FUSION_BUFFER");
  uint8_t* scratch = FusionBuffer(total * esize);
  std::memcpy(scratch, slot.entry.input, total * esize);
  Scale(scratch, total, dtype, r.prescale_factor);
  HandleResult result;
  uint8_t* reduced = ResultBuffer(slot, counts[group.index] * static_cast<int64_t>(esize), &result);
  result.shape = r.shape;
  result.shape[0] = PartRows(dim0, n, group.index);
  trace_.Activity(kReducescatterAlgorithmName);
  HORO_RETURN_IF_ERROR(Reducescatter(group, scratch, reduced, counts, dtype, CollectiveOp(r.reduce_op),
                                     allreduce_options_));
  Postscale(reduced, counts[group.index], r, n);
  Finish(slot, Status::OK(), &result);
  return Status::OK();
}

}  // namespace horo
