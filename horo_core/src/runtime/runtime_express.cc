// Runtime, part 5 of 5: a synchronous allreduce or broadcast of one small repeated tensor, run by
// its caller alone.
//
// Such a call (a loss or a metric averaged every step, horo_run) travels with its data in one
// round of peer agreement (coordinator/peer_agreement.h). Through Enqueue and Wait it also takes a
// handle, an entry in the tensor queue and its request, and a pass that takes the queue, offers
// the request, completes the round through the general bookkeeping and finds the entry again to
// write the result: about 18,000 instructions per call on 4 ranks, where the round itself needs a
// few thousand. On a host with more ranks than cores each rank pays that work in turn, with cold
// caches, so the latency of a small allreduce there is mostly this work (docs/benchmarks.md, "Per-call
// work on a shared core").
//
// So when nothing else is pending on this rank (no queued request, no announcement or response
// list waiting, no coordinator work on rank 0) and the tensor is cached with the same parameters,
// the caller announces it straight away, under progress_mutex_, and waits for the round as a
// driving caller does. The messages on the wire are the ones the general path sends, so peers may
// take either path. If every member announced the same tensor alone and nothing else arrived, the
// caller reduces the contributions into its output (a broadcast: copies the root's there).
// Anything else (another message, a lost peer, a round with other news, a wait longer than the
// spin time) hands the call over: it becomes a queued entry with a handle, announced already, and
// continues as any other call. The tensor's name is reserved in the queue meanwhile, so that a
// concurrent call of the same name still fails as in flight.
#include <chrono>

#include "common/coarse_clock.h"
#include "runtime/runtime.h"

namespace horo {

bool Runtime::ExpressAllowed(OpType op, const horo_tensor_t& t, const horo_op_options_t& options) const {
  return agreement_ != nullptr && callers_drive_ && t.device == HORO_DEVICE_HOST && t.output != nullptr &&
         started_ && !stopped_ && !shutdown_requested_ && !timeline_->active() && !queue_.HasRequests() &&
         ValidateTensor(op, t, options).ok();
}

bool Runtime::RunExpress(OpType op, const horo_tensor_t& t, const horo_op_options_t& options, Status* status) {
  if (!ExpressAllowed(op, t, options)) return false;
  std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
  if (!lock.owns_lock() || loop_ended_ || cycle_time_ms_ > 0 || !held_lists_.empty() || !agreement_->Idle()) {
    return false;
  }
  if (rank_ == 0) {
    // The coordinator's work goes first, as between any two rounds (AdvanceRounds).
    CheckStallsIfDue();
    bool progress = false;
    if (!RespondAsCoordinator(&progress)) {
      loop_ended_ = true;
      lock.unlock();
      WakeBackground();
      return false;  // Enqueue reports the stop
    }
    if (!agreement_->Idle()) return false;
  }
  Request& r = express_request_;
  DescribeRequest(op, t, options, &r);
  const int64_t id = agreement_->FitsAlone(r);
  if (id < 0 || !queue_.Reserve(r.process_set_id, r.name)) return false;

  drivers_.fetch_add(1);
  agreement_->AnnounceAlone(id, t.input, &round_payload_);
  DriveState drive;
  size_t first = 0;
  if (!SendRound(round_payload_)) {
    loop_ended_ = true;
  } else if (AwaitExpressRound(&drive, &first) && agreement_->CompleteAlone(id, &express_contributions_)) {
    executor_->RunAnnounced(*cache_.Get(id), express_contributions_, t.output);
    agreement_->EndAlone();
    queue_.EndReservation();
    agreed_rounds_.fetch_add(1, std::memory_order_relaxed);
    agreed_responses_.fetch_add(1, std::memory_order_relaxed);
    caller_passes_.fetch_add(1, std::memory_order_relaxed);
    express_runs_.fetch_add(1, std::memory_order_relaxed);
    if (rank_ != 0) heard_from_coordinator_ns_ = CoarseNanos();  // the round has rank 0's message
    answer_owed_.store(agreement_->AnswerOwed(), std::memory_order_relaxed);
    lock.unlock();
    EndDrive(drive, /*finished=*/true);
    *status = Status::OK();
    return true;
  }
  if (!loop_ended_) {
    *status = HandOverExpress(id, t, first, &drive, &lock);
    return true;
  }
  // The runtime stopped while this rank waited for the round (SendRound or a message said so).
  queue_.EndReservation();
  lock.unlock();
  EndDrive(drive, /*finished=*/false);
  *status = StoppedStatus();
  if (status->ok()) *status = Status::ShutDown("Horo has been shut down");  // stopping, reason not set yet
  return true;
}

bool Runtime::AwaitExpressRound(DriveState* drive, size_t* first) {
  std::vector<ControlMessage>& messages = pass_messages_;
  std::vector<int>& lost = pass_lost_;
  static const std::atomic<bool> kNeverDone{false};
  int64_t round = 0;
  while (!agreement_->RoundReady(&round)) {
    if (!messages.empty()) transport_->RecycleControl(&messages);
    lost.clear();
    Status st = transport_->PollControl(0, &messages, &lost);
    if (!st.ok()) {
      ReportAndStop(st);
      loop_ended_ = true;
      return false;
    }
    for (size_t i = 0; i < messages.size(); ++i) {
      bool taken = false;
      if (!IsRoundMessage(messages[i].payload)) {
        *first = i;  // the coordinator's list or a request: the general path takes it
        return false;
      }
      if (!TakeRoundMessage(messages[i], &taken)) {
        loop_ended_ = true;
        return false;
      }
      if (messages[i].peer == 0) heard_from_coordinator_ns_ = CoarseNanos();
    }
    *first = messages.size();
    if (!lost.empty()) return false;
    if (!messages.empty()) {
      drive->Moved();
      continue;
    }
    if (!IdleRound(drive, kNeverDone, /*timed=*/false)) return false;
  }
  *first = messages.size();
  return true;
}

Status Runtime::HandOverExpress(int64_t id, const horo_tensor_t& t, size_t first, const DriveState* drive,
                                 std::unique_lock<std::mutex>* lock) {
  // Under progress_mutex_ (*lock): the call becomes what Enqueue and a pass would have
  // made of it, an entry with a handle whose request is announced in the open round.
  express_handovers_.fetch_add(1, std::memory_order_relaxed);
  TensorEntry e;
  e.request = express_request_;
  e.input = t.input;
  e.output = t.output;
  e.output_bytes = t.output_bytes;
  const int64_t handle = e.handle = handles_.Allocate();
  agreement_->AdoptAlone(id, express_request_);
  queue_.AddReserved(&e);
  FailIfStoppedMeanwhile(&handle, 1);
  // The messages the wait read and did not take, then a pass: it completes the round if it is
  // ready, runs what the coordinator's lists say, and sends what fell back to the coordinator.
  bool progress = false;
  if (!TakeControl(pass_messages_, first, pass_lost_) || !Pass(0, &progress)) loop_ended_ = true;
  lock->unlock();
  EndDrive(*drive, /*finished=*/false);
  Status status = Wait(handle, -1);
  handles_.Release(handle);
  return status;
}

}  // namespace horo
