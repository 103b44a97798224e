// Runtime, part 3 of 5: one pass of negotiation (control messages, the coordinator's lists, the
// rounds of peer agreement) and applying what was agreed.
#include "runtime/runtime.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/coarse_clock.h"
#include "common/logging.h"

namespace horo {
namespace {

constexpr int64_t kStallCheckNs = 5000000;  // rank 0 looks for stalls at most this often

}  // namespace

bool Runtime::Pass(int poll_ms, bool* progress, const std::atomic<bool>* caller_done) {
  const bool is_coordinator = rank_ == 0;
  // Kept between passes for their storage; the last pass's messages go back to the transport now
  // (their payloads' storage receives the next ones).
  std::vector<ControlMessage>& messages = pass_messages_;
  std::vector<int>& lost = pass_lost_;
  if (!messages.empty()) transport_->RecycleControl(&messages);
  lost.clear();
  Status st = transport_->PollControl(timeline_->PollTimeoutMs(poll_ms), &messages, &lost);
  if (!st.ok()) {
    ReportAndStop(st);
    return false;
  }
  if (cycle_time_ms_ > 0 && queue_.HasRequests()) {
    // Batching delay: let more tensors arrive so that they are negotiated and fused together.
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(cycle_time_ms_));
  }
  RequestList mine;
  std::vector<Request>& taken = taken_;
  queue_.TakeRequests(&taken);
  const bool took = !taken.empty();
  if (agreement_) {
    // Repeated tensors are announced to the peers instead (coordinator/peer_agreement.h); the
    // members of a grouped call are consecutive here and go one way together.
    for (size_t begin = 0, end = 0; begin < taken.size(); begin = end) {
      const Request& first = taken[begin];
      end = begin + 1;
      while (first.group_size > 1 && end < taken.size() && taken[end].group_leader == first.group_leader &&
             taken[end].process_set_id == first.process_set_id && end - begin < static_cast<size_t>(first.group_size)) {
        ++end;
      }
      const bool announced =
          first.group_size > 1
              ? end - begin == static_cast<size_t>(first.group_size) &&
                    agreement_->OfferGroup(std::vector<Request>(taken.begin() + begin, taken.begin() + end))
              : agreement_->Offer(&taken[begin]);
      if (announced) continue;
      for (size_t i = begin; i < end; ++i) mine.requests.push_back(std::move(taken[i]));
    }
  } else {
    mine.requests = std::move(taken);
  }
  mine.shutdown = shutdown_requested_ && !shutdown_sent_;
  if (mine.shutdown) {
    shutdown_sent_ = true;
    shutdown_sent_ns_ = CoarseNanos();
  }
  *progress = took || mine.shutdown || !messages.empty() || !lost.empty();

  if (is_coordinator) {
    if (!mine.requests.empty() || mine.shutdown) coordinator_->AddRequests(0, mine);
    if (!TakeControl(messages, 0, lost)) return false;
    CheckStallsIfDue();
    if (agreement_ && !AdvanceRounds(progress, caller_done)) return false;
    if (!RespondAsCoordinator(progress)) return false;
  } else {
    if (!TakeControl(messages, 0, lost)) return false;
    if (agreement_) {
      const int64_t rounds_done = agreement_->round_done();
      if (!AdvanceRounds(progress, caller_done)) return false;
      // A round completes with rank 0's message, and its steps may have run long just now.
      if (agreement_->round_done() != rounds_done) heard_from_coordinator_ns_ = CoarseNanos();
      if (agreement_->has_fallbacks()) {
        for (Request& r : agreement_->TakeFallbacks()) mine.requests.push_back(std::move(r));
      }
    }
    if (!mine.requests.empty() || mine.shutdown) {
      *progress = true;
      st = transport_->SendControl(0, SerializeRequestList(mine));
      if (!st.ok()) {
        StopAfterCoordinatorLoss(st.message());
        return false;
      }
    }
    if (!WatchCoordinator()) return false;
  }
  timeline_->Ship();
  return true;
}

bool Runtime::TakeControl(const std::vector<ControlMessage>& messages, size_t first, const std::vector<int>& lost) {
  if (rank_ == 0) {
    for (size_t i = first; i < messages.size(); ++i) {
      const ControlMessage& m = messages[i];
      bool taken = false;
      if (!TakeRoundMessage(m, &taken)) return false;
      if (taken) continue;
      RequestList list;
      Status parsed = ParseRequestList(m.payload, &list);
      if (!parsed.ok()) {
        Stop(Status::Internal("rank " + std::to_string(m.peer) + " sent a malformed request list"), true);
        return false;
      }
      coordinator_->AddRequests(m.peer, list);
    }
    for (int r : lost) coordinator_->PeerLost(r, transport_->LostReason(r));
    return true;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ControlMessage& m = messages[i];
    bool taken = false;
    if (!TakeRoundMessage(m, &taken)) return false;
    if (!taken && !ReceiveResponseList(m)) return false;
    // After the collectives the message started, which may have run long in this very call.
    if (m.peer == 0) heard_from_coordinator_ns_ = CoarseNanos();
  }
  // Only the coordinator's loss matters here (some transports also report other ranks; their
  // failures reach this rank through the coordinator or the data plane).
  if (std::find(lost.begin(), lost.end(), 0) != lost.end()) {
    const std::string reason = transport_->LostReason(0);
    if (reason.empty()) {
      StopAfterCoordinatorLoss("it exited or crashed");
    } else {  // cut off for reading only: rank 0 can still be told, and tell the others
      ReportAndStop(Status::PeerLost(reason));
    }
    return false;
  }
  return true;
}

void Runtime::CheckStallsIfDue() {
  // Stalls are warned about after seconds: looking every few milliseconds is enough, and spares
  // a loop of small collectives building the list of waiting tensors on every pass.
  const int64_t now_ns = CoarseNanos();
  if (now_ns - last_stall_check_ns_ < kStallCheckNs) return;
  last_stall_check_ns_ = now_ns;
  poll_ms_ = coordinator_->CheckStalls(agreement_ ? agreement_->Waiting() : std::vector<StalledTensor>());
}

Status Runtime::DecidePeerAgreement() {
  bool usable = config_.coordinator_free && config_.cache_capacity > 0 && !config_.autotune &&
                transport_->ControlToEveryPeer();
  if (network_ != nullptr && size_ > 1) {
    // Every rank must decide alike (a shared-memory link that failed for one pair, settings that
    // differ between ranks): rank 0 collects the answers on the data plane, idle until the loop
    // starts, and sends back whether all said yes.
    uint8_t yes = usable ? 1 : 0;
    if (rank_ == 0) {
      for (int peer = 1; peer < size_; ++peer) {
        uint8_t theirs = 0;
        HORO_RETURN_IF_ERROR(transport_->Recv(peer, &theirs, 1));
        yes = yes & theirs;
      }
      for (int peer = 1; peer < size_; ++peer) HORO_RETURN_IF_ERROR(transport_->Send(peer, &yes, 1));
    } else {
      HORO_RETURN_IF_ERROR(transport_->Send(0, &yes, 1));
      HORO_RETURN_IF_ERROR(transport_->Recv(0, &yes, 1));
    }
    usable = yes == 1;
  }
  if (usable) {
    agreement_ = std::make_unique<PeerAgreement>(rank_, size_, &cache_, &sets_);
  }
  return Status::OK();
}

bool Runtime::RespondAsCoordinator(bool* progress) {
  while (true) {
    if (agreement_ && agreement_->has_fallbacks()) {
      RequestList fallbacks;
      fallbacks.requests = agreement_->TakeFallbacks();
      coordinator_->AddRequests(0, fallbacks);
    }
    // In the middle of a round, a list would reach the workers after messages of a round that this
    // rank has not completed: only a failure's shutdown may go then, applied at once.
    ResponseList list;
    const bool mid_round = agreement_ && agreement_->mid_round();
    const bool built = mid_round ? coordinator_->BuildFailureShutdown(&list) : coordinator_->BuildResponses(&list);
    if (!built) return true;
    *progress = true;
    list.after_round = mid_round ? -1 : agreement_ ? agreement_->round_done() : 0;
    timeline_->MarkCycleStart();
    if (tuner_) TuneOnCoordinator(&list);
    const std::string bytes = SerializeResponseList(list);
    for (int peer = 1; peer < size_; ++peer) {
      Status sent = transport_->SendControl(peer, bytes);
      if (!sent.ok()) {
        HORO_LOG(kDebug, rank_) << "could not send responses to rank " << peer << ": " << sent.message();
      }
    }
    if (!Apply(list, false)) return false;
    if (!agreement_) return true;  // applying a list hands requests back only with peer agreement
  }
}

bool Runtime::AdvanceRounds(bool* progress, const std::atomic<bool>* caller_done) {
  while (true) {
    // Between two rounds, rank 0 first sends what the coordinator has (after this round, on every
    // rank), so that its lists are never held back by a stream of rounds.
    if (rank_ == 0 && !agreement_->mid_round() && !RespondAsCoordinator(progress)) return false;
    std::string& payload = round_payload_;
    // A round is answered late at most once: rank 0 may finish a coordinator-negotiated call in
    // the same pass as it answers, so without the limit a stream of them would put it off forever.
    const int64_t next_round = agreement_->round_done() + 1;
    const bool answer =
        caller_done == nullptr || !caller_done->load(std::memory_order_acquire) || deferred_round_ == next_round;
    if (!answer && agreement_->AnswerOwed()) deferred_round_ = next_round;
    if (agreement_->NextMessage(&payload, answer)) {
      *progress = true;
      if (!SendRound(payload)) return false;
    }
    int64_t round = 0;
    if (!agreement_->RoundReady(&round)) break;
    *progress = true;
    // The round's steps became known now: their op phases (and QUEUE) begin here on the timeline,
    // not at the last coordinator list, which may be several steps old.
    timeline_->ResponsesArrived();
    // The coordinator's lists made before this round come first, as on every rank.
    while (!held_lists_.empty() && held_lists_.front().after_round < round) {
      ResponseList list = std::move(held_lists_.front());
      held_lists_.pop_front();
      if (!Apply(list, true)) return false;
    }
    std::vector<AgreedStep>& run = agreed_run_;
    agreement_->CompleteRound(&run);
    // A round that runs steps is a negotiation cycle, as a coordinator list is: the steady state of
    // a training loop runs on rounds alone. Rank 0 marks it, as it marks the lists, where its steps
    // became known.
    if (rank_ == 0 && !run.empty()) timeline_->MarkCycleStart(timeline_->responses_arrived_us());
    agreed_rounds_.fetch_add(1, std::memory_order_relaxed);
    for (const AgreedStep& step : run) {
      agreed_responses_.fetch_add(step.contributed ? 1 : static_cast<int64_t>(step.fused.size()),
                                  std::memory_order_relaxed);
      Status st = step.contributed ? executor_->RunFromContributions(*step.contributed, step.contributions)
                                   : executor_->Execute(step.fused);
      if (!st.ok()) {
        FailOnDataPlane(st);
        return false;
      }
    }
  }
  while (!held_lists_.empty() && held_lists_.front().after_round <= agreement_->round_done()) {
    ResponseList list = std::move(held_lists_.front());
    held_lists_.pop_front();
    if (!Apply(list, true)) return false;
  }
  answer_owed_.store(agreement_->AnswerOwed(), std::memory_order_relaxed);
  return true;
}

bool Runtime::SendRound(const std::string& payload) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    Status sent = transport_->SendControl(peer, payload);
    if (sent.ok()) continue;
    // A peer that closed (it failed, died or is shutting down) needs no message: rank 0 learns
    // it and ends the job, or its shutdown is under way.
    if (peer != 0 && (sent.code() == HORO_ERR_PEER_LOST || sent.code() == HORO_ERR_SHUT_DOWN)) {
      HORO_LOG(kDebug, rank_) << "could not send a round message to rank " << peer << ": " << sent.message();
      continue;
    }
    // A live peer would wait for this message forever: fail, telling rank 0, which shuts every
    // rank down.
    if (rank_ != 0 && peer == 0) {
      StopAfterCoordinatorLoss(sent.message());
    } else {
      FailOnDataPlane(Status(sent.code(), "could not send a round message to rank " + std::to_string(peer) + ": " +
                                             sent.message()));
    }
    return false;
  }
  return true;
}

bool Runtime::TakeRoundMessage(const ControlMessage& message, bool* taken) {
  *taken = agreement_ && IsRoundMessage(message.payload);
  if (!*taken) return true;
  Status received = agreement_->Receive(message.peer, message.payload);
  if (received.ok()) return true;
  ReportAndStop(received);
  return false;
}

bool Runtime::ReceiveResponseList(const ControlMessage& message) {
  ResponseList list;
  Status parsed = ParseResponseList(message.payload, &list);
  if (!parsed.ok()) {
    ReportAndStop(Status::Internal("malformed response list from the coordinator: " + parsed.message()));
    return false;
  }
  // A list waits for the round it follows, behind those already waiting, unless it must be applied
  // at once (after_round < 0: a failure).
  if (agreement_ && list.after_round >= 0 && (list.after_round > agreement_->round_done() || !held_lists_.empty())) {
    held_lists_.push_back(std::move(list));
    return true;
  }
  return Apply(list, true);
}

bool Runtime::ApplyMessage(const ControlMessage& message) {
  if (IsRoundMessage(message.payload)) return true;  // no more rounds once the coordinator is gone
  ResponseList list;
  Status parsed = ParseResponseList(message.payload, &list);
  if (!parsed.ok()) {
    Stop(Status::Internal("malformed response list from the coordinator: " + parsed.message()), true);
    return false;
  }
  // With peer agreement a list may belong after a round that will never complete now: only the
  // coordinator's last word (a shutdown, with its reason) is applied.
  Status reason;
  if (agreement_ && !ShutdownIn(list, &reason)) return true;
  return Apply(list, true);
}

void Runtime::TuneOnCoordinator(ResponseList* list) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  tuner_->OnResponseList(list, std::chrono::duration<double, std::micro>(now).count());
  // A new threshold applies to the next list built, which is also the one that announces it.
  coordinator_->set_fusion_threshold_bytes(tuner_->parameters().fusion_threshold_bytes);
}

void Runtime::ApplyParameters(const TunedParameters& parameters) {
  cycle_time_ms_ = parameters.cycle_time_ms;
  executor_->set_small_message_bytes(parameters.small_message_bytes);
}

bool Runtime::Apply(ResponseList& list, bool parsed) {
  timeline_->ResponsesArrived();
  if (list.has_parameters) ApplyParameters(list.parameters);
  for (auto& parts : list.fused) {
    FusedResponse fused;
    for (ResponsePart& part : parts) {
      if (parsed && part.cache_id >= 0) {
        const Response* cached = cache_.Get(part.cache_id);
        if (cached == nullptr) {
          ReportAndStop(Status::Internal("response cache out of step: unknown id " + std::to_string(part.cache_id)));
          return false;
        }
        part.response = *cached;
      } else if (parsed && part.assign_id >= 0) {
        cache_.MirrorPut(part.assign_id, part.response);
      }
      fused.push_back(part.response);
    }
    const Response& head = fused.front();
    if (head.kind == ResponseKind::kShutdown) {
      Stop(Status(head.error_code, head.error_message), head.error_code != HORO_ERR_SHUT_DOWN);
      return false;
    }
    coordinator_responses_.fetch_add(static_cast<int64_t>(fused.size()), std::memory_order_relaxed);
    Status st = executor_->Execute(fused);
    if (!st.ok()) {
      FailOnDataPlane(st);
      return false;
    }
    if (agreement_ && head.kind == ResponseKind::kOp && head.op_type == OpType::kJoin) {
      agreement_->JoinDone(head.process_set_id);
    }
  }
  for (int64_t id : list.evicted_ids) {
    if (parsed) cache_.MirrorErase(id);
    if (agreement_) agreement_->Forget(id);
  }
  return true;
}

}  // namespace horo
