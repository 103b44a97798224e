#include "timeline/execution_trace.h"

#include <string>
#include <vector>

namespace horo {

void ExecutionTrace::RecordOpen(const FusedResponse& fused) {
  const Response& head = fused.front();
  std::vector<TraceTensor> tensors(fused.size());
  for (size_t i = 0; i < fused.size(); ++i) {
    tensors[i].name = fused[i].name;
    tensors[i].dtype = static_cast<int32_t>(fused[i].dtype);
    tensors[i].shape = fused[i].shape;
  }
  EventBatch& batch = timeline_->batch();
  group_ = batch.AddGroup(head.process_set_id, tensors);
  const int64_t now = timeline_->Now();
  // The list may have arrived before the timeline was switched on: then the queue is not known.
  int64_t arrived = timeline_->responses_arrived_us();
  if (arrived <= 0 || arrived > now) arrived = now;
  batch.AddEvent(group_, TraceTrack::kRank, 'B', arrived, TimelineOpName(head.op_type));
  batch.AddEvent(group_, TraceTrack::kRank, 'B', arrived, "QUEUE");
  batch.AddEvent(group_, TraceTrack::kRank, 'E', now, std::string());
  on_ = true;
  in_activity_ = false;
}

void ExecutionTrace::RecordActivity(const char* name) {
  EventBatch& batch = timeline_->batch();
  const int64_t now = timeline_->Now();
  if (in_activity_) batch.AddEvent(group_, TraceTrack::kRank, 'E', now, std::string());
  in_activity_ = name != nullptr;
  if (in_activity_) batch.AddEvent(group_, TraceTrack::kRank, 'B', now, name);
}

void ExecutionTrace::RecordClose() {
  RecordActivity(nullptr);
  timeline_->batch().AddEvent(group_, TraceTrack::kRank, 'E', timeline_->Now(), std::string(), /*tensor_args=*/true);
  on_ = false;
}

void ExecutionTrace::RecordError(const Response& response) {
  EventBatch& batch = timeline_->batch();
  const int32_t group = batch.AddTensor(response.process_set_id, response.name);
  const int64_t now = timeline_->Now();
  batch.AddEvent(group, TraceTrack::kRank, 'B', now, "ERROR");
  batch.AddEvent(group, TraceTrack::kRank, 'E', now, std::string(), false, {{"message", response.error_message}});
}

}  // namespace horo
