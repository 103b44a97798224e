// Timeline: one rank's part of Horovod's timeline (HORO_TIMELINE / HOROVOD_TIMELINE,
// start_timeline() / stop_timeline(), hororun --timeline-filename).
//
// Every rank records its own events while the timeline is on: rank 0 the negotiation of every
// tensor (NEGOTIATE_<OP> from the first request to the response, one tick per rank as it becomes
// ready) and, like every other rank, the execution of the tensors it takes part in (<OP> with its
// activities, see ExecutionTrace). Events go into an EventBatch. At the end of each iteration of
// the background loop the batch is shipped: rank 0 hands it to its TimelineWriter; a worker sends
// it to rank 0 as a control message of its own every kShipIntervalMs while it records (empty if it
// has nothing, so rank 0 knows how far every rank has shipped), or sooner when it grows past
// kShipBytes; the shipping never depends on request lists being sent. Rank 0 writes all of it into
// the one file.
//
// Cost when off: every recording hook is one relaxed atomic load and a branch; nothing is
// allocated and no message is sent.
//
// Threads: Start/Stop/Shutdown come from user threads (serialized here); recording and shipping
// happen inside the runtime loop's passes, which run one at a time under its progress mutex (on
// the background thread, or on a caller that drives the loop while it waits). Stop hands the final
// batch over through the loop (it wakes the background thread and waits for a pass to ship), so no
// two threads ever touch the batch at once.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "common/status.h"
#include "coordinator/request.h"
#include "timeline/event_batch.h"
#include "timeline/timeline_writer.h"
#include "transport/transport.h"

namespace horo {

// "ALLREDUCE", "BROADCAST", ...: the name of an operation's phase in the timeline.
const char* TimelineOpName(OpType op);

class Timeline {
 public:
  static constexpr int kShipIntervalMs = 100;
  static constexpr size_t kShipBytes = size_t{256} << 10;
  // How long rank 0's stop waits for the workers' last events.
  static constexpr double kCloseWaitSeconds = 5.0;

  // api_enabled: HORO_TIMELINE is set (to a path or DYNAMIC); Horovod refuses start_timeline
  // otherwise. transport: the control plane to rank 0, and Wake() for the background thread.
  Timeline(int rank, int size, bool api_enabled, Transport* transport);
  bool api_enabled() const { return api_enabled_; }
  ~Timeline();

  // Control, from any thread. Called on every rank, like Horovod. Rank 0 creates path and writes
  // every rank's events into it (starting again with the same path continues that file; another
  // path closes it and starts the new one); the other ranks start recording and ignore path.
  // loop_running: the background loop runs (it ships the batches).
  Status Start(const std::string& path, bool mark_cycles, bool loop_running);
  // Stops recording and hands this rank's last events over. Rank 0 then closes the file once every
  // recording worker has shipped its events up to this moment (at most kCloseWaitSeconds later),
  // so calling it on rank 0 alone is enough for a complete file. A no-op when not recording.
  Status Stop(bool loop_running);
  // After the background loop ended: rank 0 writes what it still holds and closes the file.
  void Shutdown();

  bool active() const { return recording_.load(std::memory_order_relaxed); }
  // Microseconds since the Unix epoch on a clock that never goes back: the steady clock, anchored
  // once to the system clock. Ranks of one host agree exactly; ranks of different hosts as well as
  // their system clocks do (NTP).
  int64_t Now() const;

  // Recording (inside a pass). The coordinator calls these for tensor requests; earlier: the
  // requests of the same tensor that arrived before this one.
  void NegotiationRequest(const Request& request, const std::map<int32_t, Request>& earlier) {
    if (active()) RecordNegotiationRequest(request, earlier);
  }
  void NegotiationEnd(int32_t process_set_id, const std::string& name) {
    if (active()) RecordNegotiationEnd(process_set_id, name);
  }
  // A negotiation round produced responses (CYCLE_START when mark_cycles is on), now or at at_us
  // (Now()'s clock).
  void MarkCycleStart() {
    if (active()) RecordCycleStart(Now());
  }
  void MarkCycleStart(int64_t at_us) {
    if (active()) RecordCycleStart(at_us);
  }
  // A response list arrived on this rank: what ExecutionTrace's QUEUE measures from (0: the
  // timeline was off then).
  void ResponsesArrived() { responses_arrived_us_ = active() ? Now() : 0; }
  int64_t responses_arrived_us() const { return responses_arrived_us_; }
  EventBatch& batch() { return batch_; }

  // Shipping (inside a pass). Ship at the end of every loop iteration; PollTimeoutMs bounds
  // the loop's wait so that a recording worker ships every kShipIntervalMs.
  int PollTimeoutMs(int timeout_ms) const {
    return rank_ == 0 || (batch_.empty() && !active()) ? timeout_ms : ShipDueInMs(timeout_ms);
  }
  void Ship() {
    if (!batch_.empty() || active() || ship_request_.load(std::memory_order_relaxed) != kNoRequest) ShipNow();
  }
  // The loop is ending: ships what remains as this rank's final batch and releases Stop().
  void ShipFinal();
  // Rank 0: events another rank shipped (the timeline field of its request list).
  void Receive(int rank, const std::string& batch) {
    if (!batch.empty()) ReceiveBatch(rank, batch);
  }

 private:
  enum ShipRequest : int { kNoRequest = 0, kFlushRequest = 1, kFinalRequest = 2 };

  void RecordNegotiationRequest(const Request& request, const std::map<int32_t, Request>& earlier);
  void RecordNegotiationEnd(int32_t process_set_id, const std::string& name);
  void RecordCycleStart(int64_t at_us);
  int ShipDueInMs(int timeout_ms) const;
  void ShipNow();
  void Hand(bool final);
  void ReceiveBatch(int rank, const std::string& batch);
  // Whether the background loop has ended (it delivers the workers' events to rank 0).
  bool LoopEnded();
  // Has the background thread ship this rank's batch (final or not) and waits for it.
  void ShipThroughLoop(ShipRequest request, bool loop_running);

  const int rank_;
  const bool api_enabled_;
  Transport* transport_;
  const int64_t epoch_offset_us_;  // system clock minus steady clock, read once
  std::unique_ptr<TimelineWriter> writer_;  // rank 0 only

  std::atomic<bool> recording_{false};
  std::atomic<bool> mark_cycles_{false};
  std::atomic<int64_t> generation_{0};  // counts starts, so that the loop forgets older negotiations
  std::atomic<int64_t> generation_start_us_{0};  // when the current generation began (its file's start)
  std::atomic<int> ship_request_{kNoRequest};

  // Background thread only.
  EventBatch batch_;
  // Negotiations whose NEGOTIATE_<OP> began in the current recording (generation).
  std::set<std::pair<int32_t, std::string>> negotiating_;
  int64_t negotiating_generation_ = -1;
  int64_t responses_arrived_us_ = 0;
  std::chrono::steady_clock::time_point last_ship_;

  std::mutex control_mutex_;  // serializes Start/Stop/Shutdown
  std::mutex ship_mutex_;
  std::condition_variable shipped_;
  bool loop_ended_ = false;  // guarded by ship_mutex_
};

}  // namespace horo
