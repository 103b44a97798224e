// Runtime, part 4 of 5: failures: a silent coordinator, a failed collective, stopping every rank
// with the cause.
#include "runtime/runtime.h"

#include <algorithm>
#include <chrono>
#include <sstream>

#include "common/coarse_clock.h"
#include "common/logging.h"

namespace horo {
namespace {

constexpr int64_t kCoordinatorWatchNs = 250000000;  // a worker looks at rank 0's silence this often

}  // namespace

bool Runtime::WatchCoordinator() {
  const int64_t now = CoarseNanos();
  if (now - last_coordinator_watch_ns_ < kCoordinatorWatchNs) return true;
  last_coordinator_watch_ns_ = now;
  std::string name;
  int64_t oldest = queue_.OldestEnqueued(&name);
  std::string waiting = "tensor '" + name + "'";
  const bool in_shutdown = oldest == 0 && shutdown_sent_;
  if (in_shutdown) {
    // shutdown() waits for rank 0's answer as a collective waits for its response.
    oldest = shutdown_sent_ns_;
    waiting = "shutdown()";
  }
  if (oldest == 0) {
    coordinator_silence_warned_ = false;
    return true;
  }
  const double silent_s = static_cast<double>(now - std::max(oldest, heard_from_coordinator_ns_)) / 1e9;
  if (silent_s < config_.stall_check_time_seconds) coordinator_silence_warned_ = false;
  const bool warns = !config_.stall_check_disable && config_.stall_check_time_seconds > 0;
  const double limit = config_.stall_shutdown_time_seconds + config_.peer_timeout_seconds;
  const bool stops = config_.stall_shutdown_time_seconds > 0 && silent_s >= limit;
  const bool warning = warns && !coordinator_silence_warned_ && silent_s >= config_.stall_check_time_seconds;
  if (!warning && !stops) return true;
  // Rank 0 sends nothing new while the ranks' round of agreement waits for another rank's
  // message (a stopped process): then that rank is the one to name, not rank 0.
  const std::string held_by = RoundHeldBy();
  // Where the ranks agree among themselves, this rank sees every announcement, as rank 0 does.
  const std::string not_submitted = held_by.empty() && !in_shutdown ? NotAnnouncedBy(name) : "";
  if (warning) {
    coordinator_silence_warned_ = true;
    if (!held_by.empty()) {
      HORO_LOG(kWarning, rank_) << waiting << " has waited " << static_cast<int64_t>(silent_s) << " s: the ranks' "
                                << "round of agreement waits for the message of " << held_by << " (rank 0's is "
                                << "in), and no step runs without it; " << held_by << " may be stopped or stuck";
    } else if (!not_submitted.empty()) {
      HORO_LOG(kWarning, rank_) << waiting << " has waited " << static_cast<int64_t>(silent_s) << " s for "
                                << not_submitted << ", which the ranks' announcements show ha"
                                << (not_submitted.rfind("rank ", 0) == 0 ? "s" : "ve") << " not submitted it";
    } else {
      HORO_LOG(kWarning, rank_) << waiting << " has waited " << static_cast<int64_t>(silent_s)
                                << " s, and rank 0 (the coordinator) has sent this rank nothing meanwhile. Rank 0's "
                                << "stall warning names the ranks it waits for; if it logs none, rank 0 may be "
                                << "stopped or stuck";
    }
  }
  if (stops) {
    std::ostringstream os;
    if (!held_by.empty()) {
      os << "the ranks' round of agreement waited " << static_cast<int64_t>(silent_s) << " s for the message of "
         << held_by << " while " << waiting << " waited; " << (held_by.rfind("rank ", 0) == 0 ? "it is" : "they are")
         << " stopped or stuck (";
    } else {
      os << "rank 0 (the coordinator) sent this rank nothing for " << static_cast<int64_t>(silent_s)
         << " s while " << waiting << " waited; it is stopped or stuck (";
    }
    os << config_.VariableName("STALL_SHUTDOWN_TIME_SECONDS") << " + " << config_.VariableName("PEER_TIMEOUT_SECONDS")
       << " = " << limit << " s)";
    Stop(Status::PeerLost(os.str()), true);
    return false;
  }
  return true;
}

namespace {

// "rank 3" or "ranks 2, 3".
std::string RankList(const std::vector<int32_t>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

std::string Runtime::RoundHeldBy() const {
  if (!agreement_) return "";
  const std::vector<int32_t> owed = agreement_->OpenRoundOwedBy();
  if (owed.empty() || owed.front() == 0) return "";  // rank 0's own message is among those missing
  return RankList(owed);
}

std::string Runtime::NotAnnouncedBy(const std::string& name) const {
  if (!agreement_) return "";
  for (const StalledTensor& t : agreement_->Waiting()) {
    if (t.name == name && !t.missing_ranks.empty()) return RankList(t.missing_ranks);
  }
  return "";
}

void Runtime::StopAfterCoordinatorLoss(const std::string& detail) {
  // A coordinator that fails sends the reason before it closes: read what is still in flight so
  // that the real cause, not the closed connection, reaches the user.
  std::vector<ControlMessage> messages;
  std::vector<int> lost;
  if (transport_->PollControl(200, &messages, &lost).ok()) {
    for (const ControlMessage& m : messages) {
      if (!ApplyMessage(m)) return;
    }
  }
  Stop(Status::PeerLost("lost the connection to the coordinator (rank 0): " + detail), true);
}

void Runtime::FailOnDataPlane(const Status& status) {
  if (rank_ == 0) {
    Stop(Status(status.code(), DiagnoseOnCoordinator(status)), true);
    return;
  }
  // A connection lost mid-transfer may be a consequence, and the peer it names innocent: rank 0,
  // having learned which rank died, tells every worker why and closes; a worker that lost the
  // coordinator stops and closes too. So before blaming the peer, look at the control plane for up
  // to kReasonWait: rank 0's reason (in this pass's messages, or drained from the control ring
  // while this rank waited) or rank 0's loss is the cause the user must see.
  if (status.code() == HORO_ERR_PEER_LOST || status.code() == HORO_ERR_SHUT_DOWN) {
    constexpr auto kReasonWait = std::chrono::milliseconds(50);
    Status reason;
    auto told = [&reason](const std::vector<ControlMessage>& messages) {
      for (const ControlMessage& m : messages) {
        ResponseList list;
        if (m.peer == 0 && !IsRoundMessage(m.payload) && ParseResponseList(m.payload, &list).ok() &&
            ShutdownIn(list, &reason)) {
          return true;
        }
      }
      return false;
    };
    bool found = told(pass_messages_);
    bool coordinator_lost = std::find(pass_lost_.begin(), pass_lost_.end(), 0) != pass_lost_.end();
    const auto deadline = std::chrono::steady_clock::now() + kReasonWait;
    while (!found && !coordinator_lost && std::chrono::steady_clock::now() < deadline) {
      std::vector<ControlMessage> messages;
      std::vector<int> lost;
      if (!transport_->PollControl(10, &messages, &lost).ok()) break;
      found = told(messages);
      coordinator_lost = std::find(lost.begin(), lost.end(), 0) != lost.end();
    }
    if (found) {
      Stop(reason, reason.code() != HORO_ERR_SHUT_DOWN);
      return;
    }
    if (coordinator_lost) {
      Stop(Status::PeerLost("lost the connection to the coordinator (rank 0): it exited or crashed (this rank "
                            "saw: " + status.message() + ")"),
           true);
      return;
    }
  }
  ReportAndStop(status);
}

void Runtime::ReportAndStop(const Status& status) {
  if (rank_ != 0) {
    // Tell the coordinator this rank failed (and why) before closing, so that it does not mistake
    // this rank for one that died, and every rank learns the cause.
    RequestList report;
    report.failure = status.message();
    transport_->SendControl(0, SerializeRequestList(report));
  }
  Stop(status, true);
}

std::string Runtime::DiagnoseOnCoordinator(const Status& local) {
  // A collective failed here because some peer went away. Its control connection tells whether it
  // died or failed in turn (then it reports why first): wait briefly for that before naming a cause.
  // A second, not less: on a loaded host this rank may be descheduled for a few hundred ms.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  while (!coordinator_->HasDeadRank() && std::chrono::steady_clock::now() < deadline) {
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    if (!transport_->PollControl(50, &messages, &lost).ok()) break;
    for (const ControlMessage& m : messages) {
      RequestList list;
      if (IsRoundMessage(m.payload) || !ParseRequestList(m.payload, &list).ok()) continue;
      coordinator_->AddRequests(m.peer, list);
    }
    for (int r : lost) coordinator_->PeerLost(r, transport_->LostReason(r));
  }
  const std::string cause = coordinator_->DescribeUnexpectedLosses();
  return cause.empty() ? local.message() : cause + " (rank 0 saw: " + local.message() + ")";
}

void Runtime::Stop(const Status& reason, bool failure) {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_reason_ = reason;
  }
  stopped_ = true;
  if (failure) {
    HORO_LOG(kError, rank_) << reason.message();
  }
  Status handle_status(reason.code(), reason.code() == HORO_ERR_SHUT_DOWN ? reason.message()
                                                                           : "Horo has been shut down: " + reason.message());
  for (int64_t h : queue_.TakeAllHandles()) handles_.Complete(h, handle_status);
  handles_.FailAll(handle_status);
  timeline_->ShipFinal();
  if (rank_ == 0) {
    if (failure && !coordinator_->shut_down()) {
      // Tell every worker why before closing, so that none of them blames the coordinator.
      ResponseList list;
      ResponsePart part;
      part.response.kind = ResponseKind::kShutdown;
      part.response.error_code = reason.code();
      part.response.error_message = reason.message();
      list.fused.push_back({part});
      list.after_round = -1;  // at once, whatever round the workers are in
      const std::string bytes = SerializeResponseList(list);
      for (int peer = 1; peer < size_; ++peer) transport_->SendControl(peer, bytes);
    }
    Linger(failure ? 1.0 : 5.0);
  }
  // Closing makes every peer still waiting on this rank fail fast instead of timing out.
  transport_->Close();
}

void Runtime::Linger(double seconds) {
  // The coordinator closes last, after every worker has read the final responses and closed its
  // end; closing first could reset connections that still hold unread responses.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int open = size_ - 1 - coordinator_->lost_count();
  while (open > 0 && std::chrono::steady_clock::now() < deadline) {
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    if (!transport_->PollControl(100, &messages, &lost).ok()) break;
    for (const ControlMessage& m : messages) {
      RequestList list;  // the workers' last timeline events still reach the file
      if (IsRoundMessage(m.payload) || !ParseRequestList(m.payload, &list).ok()) continue;
      timeline_->Receive(m.peer, list.timeline);
    }
    open -= static_cast<int>(lost.size());
  }
}

}  // namespace horo
