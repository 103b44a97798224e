#include "timeline/timeline.h"

#include <algorithm>

#include "common/logging.h"

namespace horo {
namespace {

int64_t Micros(std::chrono::nanoseconds d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

// The system clock minus the steady clock. A thread preempted between the two readings would
// misplace this rank on the shared time axis by the length of the preemption, so the system clock
// is read between two steady readings and the tightest of a few tries is kept.
int64_t EpochOffsetMicros() {
  using std::chrono::steady_clock;
  using std::chrono::system_clock;
  int64_t best_gap = -1;
  int64_t offset = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const auto before = steady_clock::now();
    const auto system = system_clock::now();
    const auto after = steady_clock::now();
    const int64_t gap = (after - before).count();
    if (best_gap < 0 || gap < best_gap) {
      best_gap = gap;
      const int64_t steady_us = Micros((before + (after - before) / 2).time_since_epoch());
      offset = Micros(system.time_since_epoch()) - steady_us;
    }
  }
  return offset;
}

}  // namespace

const char* TimelineOpName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "ALLREDUCE";
    case OpType::kAllgather: return "ALLGATHER";
    case OpType::kBroadcast: return "BROADCAST";
    case OpType::kAlltoall: return "ALLTOALL";
    case OpType::kReducescatter: return "REDUCESCATTER";
    case OpType::kBarrier: return "BARRIER";
    case OpType::kJoin: return "JOIN";
  }
  return "UNKNOWN";
}

Timeline::Timeline(int rank, int size, bool api_enabled, Transport* transport)
    : rank_(rank),
      api_enabled_(api_enabled),
      transport_(transport),
      epoch_offset_us_(EpochOffsetMicros()) {
  if (rank == 0) writer_ = std::make_unique<TimelineWriter>(size);
}

Timeline::~Timeline() { Shutdown(); }

int64_t Timeline::Now() const {
  return Micros(std::chrono::steady_clock::now().time_since_epoch()) + epoch_offset_us_;
}

Status Timeline::Start(const std::string& path, bool mark_cycles, bool loop_running) {
  if (!api_enabled_) {
    return Status::InvalidArgument(
        "Set HORO_TIMELINE=DYNAMIC (or HOROVOD_TIMELINE=DYNAMIC) to enable dynamic timeline usage.");
  }
  if (path.empty()) return Status::InvalidArgument("start_timeline: file_path is empty");
  std::lock_guard<std::mutex> control(control_mutex_);
  mark_cycles_ = mark_cycles;
  bool new_file = false;
  int64_t start_us = 0;
  if (rank_ == 0 && !(writer_->is_open() && writer_->path() == path)) {
    if (writer_->is_open()) {
      // Switching files: what was recorded so far belongs to the old one, which waits for the
      // workers' events up to the switch as a stop does; the new one starts where it ends.
      const bool handing_over = recording_ && loop_running && !LoopEnded();
      if (recording_) ShipThroughLoop(kFlushRequest, loop_running);
      start_us = Now();  // after this rank's flush, so that its flushed events are all before it
      writer_->Close(start_us, handing_over ? kCloseWaitSeconds : 0, handing_over);
      if (!handing_over) start_us = Now();
    } else {
      start_us = Now();
    }
    HORO_RETURN_IF_ERROR(writer_->Open(path, start_us));
    new_file = true;
  }
  // A new recording: negotiations that began before it are drawn from its start.
  if (new_file || !recording_) {
    generation_start_us_.store(new_file ? start_us : Now());
    ++generation_;
  }
  const bool was_recording = recording_.exchange(true);
  // A worker tells rank 0 at once that it records, so that rank 0's stop waits for its events
  // even if it stops before this worker's first batch would be due.
  if (rank_ != 0 && !was_recording) ShipThroughLoop(kFlushRequest, loop_running);
  return Status::OK();
}

Status Timeline::Stop(bool loop_running) {
  const int64_t stop_us = Now();
  std::lock_guard<std::mutex> control(control_mutex_);
  if (recording_.exchange(false)) ShipThroughLoop(kFinalRequest, loop_running);
  if (rank_ == 0 && writer_->is_open()) {
    // The workers' events up to now reach rank 0 through the loop; without it they cannot arrive.
    writer_->Close(stop_us, loop_running && !LoopEnded() ? kCloseWaitSeconds : 0);
  }
  return Status::OK();
}

bool Timeline::LoopEnded() {
  std::lock_guard<std::mutex> lock(ship_mutex_);
  return loop_ended_;
}

void Timeline::Shutdown() {
  std::lock_guard<std::mutex> control(control_mutex_);
  recording_ = false;
  // The background loop is over (or never ran): nothing else touches the batch now.
  if (rank_ != 0) {
    batch_ = EventBatch();
    return;
  }
  if (!batch_.empty()) Hand(true);
  writer_->Close(Now(), 0);
}

void Timeline::ShipThroughLoop(ShipRequest request, bool loop_running) {
  std::unique_lock<std::mutex> lock(ship_mutex_);
  if (loop_running && !loop_ended_) {
    ship_request_ = request;
    lock.unlock();
    transport_->Wake();
    lock.lock();
    // ShipNow clears the request; ShipFinal (the loop ending) ships everything there is.
    shipped_.wait(lock, [this] { return ship_request_ == kNoRequest || loop_ended_; });
    ship_request_ = kNoRequest;
    return;
  }
  lock.unlock();
  // No background loop runs, so this thread may touch the batch. A worker without its loop has
  // no connection to send on: its events are dropped.
  if (rank_ == 0) {
    Hand(request == kFinalRequest);
  } else {
    batch_ = EventBatch();
  }
}

int Timeline::ShipDueInMs(int timeout_ms) const {
  const auto since = std::chrono::steady_clock::now() - last_ship_;
  const int64_t left = kShipIntervalMs - std::chrono::duration_cast<std::chrono::milliseconds>(since).count();
  const int due = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, kShipIntervalMs)));
  return timeout_ms < 0 ? due : std::min(timeout_ms, due);
}

void Timeline::ShipNow() {
  const int request = ship_request_.load();
  if (request == kNoRequest && rank_ != 0 && batch_.bytes() < kShipBytes &&
      std::chrono::steady_clock::now() - last_ship_ < std::chrono::milliseconds(kShipIntervalMs)) {
    return;  // a worker ships once per interval, or sooner when the batch is large
  }
  Hand(request == kFinalRequest);
  if (request != kNoRequest) {
    std::lock_guard<std::mutex> lock(ship_mutex_);
    ship_request_ = kNoRequest;
    shipped_.notify_all();
  }
}

void Timeline::ShipFinal() {
  if (recording_.exchange(false) || !batch_.empty() || ship_request_ != kNoRequest) Hand(true);
  std::lock_guard<std::mutex> lock(ship_mutex_);
  loop_ended_ = true;
  shipped_.notify_all();
}

void Timeline::Hand(bool final) {
  // A recording worker ships even an empty batch: it tells rank 0 how far its events have come.
  if (batch_.empty() && !final && (rank_ == 0 || !active())) return;
  last_ship_ = std::chrono::steady_clock::now();
  std::string bytes = batch_.Take(final, Now());
  if (rank_ == 0) {
    writer_->Submit(0, std::move(bytes));
    return;
  }
  RequestList list;
  list.timeline = std::move(bytes);
  Status st = transport_->SendControl(0, SerializeRequestList(list));
  // A lost coordinator is the loop's business; the events are simply gone.
  if (!st.ok()) HORO_LOG(kDebug, rank_) << "timeline: could not send events to rank 0: " << st.message();
}

void Timeline::ReceiveBatch(int rank, const std::string& batch) {
  if (writer_ != nullptr) writer_->Submit(rank, batch);
}

void Timeline::RecordNegotiationRequest(const Request& request, const std::map<int32_t, Request>& earlier) {
  const int64_t generation = generation_.load();
  if (negotiating_generation_ != generation) {
    negotiating_.clear();
    negotiating_generation_ = generation;
  }
  const int64_t now = Now();
  const int32_t group = batch_.AddTensor(request.process_set_id, request.name);
  if (negotiating_.insert({request.process_set_id, request.name}).second) {
    // The negotiation begins here, or began before the recording did (some ranks were ready
    // already): then it is drawn from the recording's start, those ranks ticked there, so that
    // the file shows how long they waited for this one.
    const int64_t begin = earlier.empty() ? now : std::min(now, generation_start_us_.load());
    batch_.AddEvent(group, TraceTrack::kNegotiation, 'B', begin,
                    std::string("NEGOTIATE_") + TimelineOpName(request.op_type));
    for (const auto& kv : earlier) {
      batch_.AddEvent(group, TraceTrack::kNegotiation, 'X', begin, std::to_string(kv.first));
    }
  }
  // Horovod's tick: an event of no duration named after the rank that became ready.
  batch_.AddEvent(group, TraceTrack::kNegotiation, 'X', now, std::to_string(request.rank));
}

void Timeline::RecordNegotiationEnd(int32_t process_set_id, const std::string& name) {
  // Only negotiations begun in this recording; the others would end a slice the file never began.
  if (negotiating_generation_ != generation_.load() || negotiating_.erase({process_set_id, name}) == 0) return;
  const int32_t group = batch_.AddTensor(process_set_id, name);
  batch_.AddEvent(group, TraceTrack::kNegotiation, 'E', Now(), std::string());
}

void Timeline::RecordCycleStart(int64_t at_us) {
  if (mark_cycles_) batch_.AddMarker(at_us, "CYCLE_START");
}

}  // namespace horo
