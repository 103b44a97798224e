// EventBatch: the timeline events one rank recorded since it last shipped them, in the compact
// binary form in which they travel to rank 0 (workers send it as the `timeline` field of a request
// list; rank 0 hands its own batches to the writer the same way). ParseEventBatch reads one back.
//
// Events refer to tensor groups declared earlier in the same batch: a fused response of 100
// tensors is declared once with its names, dtypes and shapes, and each of its ~10 events then
// costs a few bytes instead of 100 copies of every name. Timestamps are microseconds since the
// Unix epoch (see Timeline::Now), so that rank 0 can place every rank's events on one time axis.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/wire.h"

namespace horo {

// Where an event is drawn: on the recording rank's own track of the tensor, or on the coordinator's
// negotiation track of the tensor.
enum class TraceTrack : uint8_t { kRank = 0, kNegotiation = 1 };

// One tensor of a group, with what the op phase reports about it when it ends (dtype < 0: nothing).
struct TraceTensor {
  std::string name;
  int32_t dtype = -1;
  std::vector<int64_t> shape;
};

using TraceArgs = std::vector<std::pair<std::string, std::string>>;

class EventBatch {
 public:
  bool empty() const { return records_ == 0; }
  size_t bytes() const { return out_.data().size(); }

  // Declares the tensors the following events refer to; returns the group's id in this batch.
  int32_t AddGroup(int32_t process_set_id, const std::vector<TraceTensor>& tensors);
  // Declares a group of one tensor, reusing the previous declaration when it named the same one.
  int32_t AddTensor(int32_t process_set_id, const std::string& name);

  // A Chrome trace event on every tensor of the group: phase 'B' (begin), 'E' (end of the innermost
  // open event) or 'X' (a tick of zero duration). tensor_args: attach each tensor's dtype and shape.
  void AddEvent(int32_t group, TraceTrack track, char phase, int64_t ts_us, const std::string& name,
                bool tensor_args = false, const TraceArgs& args = TraceArgs());
  // An instant event across the whole timeline (CYCLE_START).
  void AddMarker(int64_t ts_us, const std::string& name);

  // The serialized batch, closed by when it was shipped (every event recorded by then is in it or
  // in an earlier batch) and whether it is the last one of a rank that stopped recording. Resets.
  std::string Take(bool final, int64_t shipped_us);

 private:
  WireWriter out_;
  int64_t records_ = 0;
  int32_t groups_ = 0;
  int32_t last_single_set_ = -1;
  std::string last_single_name_;
};

// What a parsed batch holds, in recording order.
struct ParsedEventBatch {
  struct Group {
    int32_t process_set_id = 0;
    std::vector<TraceTensor> tensors;
  };
  struct Event {
    bool marker = false;
    int32_t group = -1;
    TraceTrack track = TraceTrack::kRank;
    char phase = 'i';
    int64_t ts_us = 0;
    std::string name;
    bool tensor_args = false;
    TraceArgs args;
  };
  bool final = false;
  int64_t shipped_us = 0;
  std::vector<Group> groups;
  std::vector<Event> events;
};

// Fails (without crashing) on truncated or malformed input, or events naming undeclared groups.
Status ParseEventBatch(const std::string& bytes, ParsedEventBatch* out);
// Reads only the closing record (final, shipped_us) without parsing the events; false if absent.
bool ReadBatchEnd(const std::string& bytes, bool* final, int64_t* shipped_us);

}  // namespace horo
