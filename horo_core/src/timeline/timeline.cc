#include "timeline/timeline.h"

#include <algorithm>

#include "common/logging.h"

namespace horo {
namespace {

int64_t Micros(std::chrono::nanoseconds d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

int64_t EpochOffsetMicros() {
  const int64_t system_us = Micros(std::chrono::system_clock::now().time_since_epoch());
  const int64_t steady_us = Micros(std::chrono::steady_clock::now().time_since_epoch());
  return system_us - steady_us;
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
  if (rank_ == 0 && !(writer_->is_open() && writer_->path() == path)) {
    if (writer_->is_open()) {
      // Switching files: what was recorded so far belongs to the old one.
      if (recording_) ShipThroughLoop(kFlushRequest, loop_running);
      writer_->Close(0);
    }
    HORO_RETURN_IF_ERROR(writer_->Open(path, Now()));
  }
  recording_ = true;
  return Status::OK();
}

Status Timeline::Stop(bool loop_running) {
  std::lock_guard<std::mutex> control(control_mutex_);
  if (recording_.exchange(false)) ShipThroughLoop(kFinalRequest, loop_running);
  if (rank_ == 0 && writer_->is_open()) {
    bool loop_alive = loop_running;
    {
      std::lock_guard<std::mutex> lock(ship_mutex_);
      loop_alive = loop_alive && !loop_ended_;
    }
    // The workers' last events reach rank 0 through the loop; without it they cannot arrive.
    writer_->Close(loop_alive ? kCloseWaitSeconds : 0);
  }
  return Status::OK();
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
  writer_->Close(0);
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

int Timeline::PollTimeoutMs(int timeout_ms) const {
  if (rank_ == 0 || batch_.empty()) return timeout_ms;
  const auto since = std::chrono::steady_clock::now() - last_ship_;
  const int64_t left = kShipIntervalMs - std::chrono::duration_cast<std::chrono::milliseconds>(since).count();
  const int due = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, kShipIntervalMs)));
  return timeout_ms < 0 ? due : std::min(timeout_ms, due);
}

void Timeline::ShipNow() {
  const int request = ship_request_.load();
  if (request == kNoRequest && rank_ != 0 && batch_.bytes() < kShipBytes &&
      std::chrono::steady_clock::now() - last_ship_ < std::chrono::milliseconds(kShipIntervalMs)) {
    return;  // a worker sends at most one batch per interval, unless the batch is large
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
  if (batch_.empty() && !final) return;
  last_ship_ = std::chrono::steady_clock::now();
  std::string bytes = batch_.Take(final);
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

void Timeline::RecordNegotiationRequest(const Request& request, bool first) {
  const int64_t now = Now();
  const int32_t group = batch_.AddTensor(request.process_set_id, request.name);
  if (first) {
    batch_.AddEvent(group, TraceTrack::kNegotiation, 'B', now,
                    std::string("NEGOTIATE_") + TimelineOpName(request.op_type));
  }
  // Horovod's tick: an event of no duration named after the rank that became ready.
  batch_.AddEvent(group, TraceTrack::kNegotiation, 'X', now, std::to_string(request.rank));
}

void Timeline::RecordNegotiationEnd(int32_t process_set_id, const std::string& name) {
  const int32_t group = batch_.AddTensor(process_set_id, name);
  batch_.AddEvent(group, TraceTrack::kNegotiation, 'E', Now(), std::string());
}

void Timeline::RecordCycleStart() {
  if (mark_cycles_) batch_.AddMarker(Now(), "CYCLE_START");
}

}  // namespace horo
