// ExecutionTrace: the timeline of one fused response as this rank executes it, Horovod's op phase:
//
//   <OP> (ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN)
//     QUEUE                      from the arrival of the response list to the start of this
//                                response (the time spent behind earlier responses of the list)
//     MEMCPY_IN_FUSION_BUFFER    packing the tensors into the fusion buffer
//     <algorithm>                what ran, e.g. RING_ALLREDUCE, RECURSIVE_DOUBLING_ALLREDUCE
//     MEMCPY_OUT_FUSION_BUFFER   unpacking the results
//
// on every tensor of the response. Activities follow each other (starting one ends the previous).
// Whether to record is decided once, in Open, so a response is traced whole or not at all even if
// the timeline is switched on or off meanwhile.
#pragma once

#include <cstdint>

#include "coordinator/response.h"
#include "timeline/timeline.h"

namespace horo {

class ExecutionTrace {
 public:
  explicit ExecutionTrace(Timeline* timeline) : timeline_(timeline) {}

  // Begins the op phase on every tensor of fused, with its QUEUE activity.
  void Open(const FusedResponse& fused) {
    if (timeline_->active()) RecordOpen(fused);
  }
  // Open for a response that runs alone; it is copied into a list only when the timeline records.
  void Open(const Response& single) {
    if (timeline_->active()) RecordOpen(FusedResponse{single});
  }
  // Ends the current activity and begins the named one (nullptr: none).
  void Activity(const char* name) {
    if (on_) RecordActivity(name);
  }
  // Ends the activity and the op phase; each tensor's end carries its dtype and shape.
  void Close() {
    if (on_) RecordClose();
  }
  // An ERROR phase on the tensor of an error response, carrying the message.
  void Error(const Response& response) {
    if (timeline_->active()) RecordError(response);
  }

 private:
  void RecordOpen(const FusedResponse& fused);
  void RecordActivity(const char* name);
  void RecordClose();
  void RecordError(const Response& response);

  Timeline* timeline_;
  bool on_ = false;
  bool in_activity_ = false;
  int32_t group_ = -1;
};

}  // namespace horo
