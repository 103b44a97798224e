// Runtime, part 2 of 5: who makes progress: the background loop, callers that drive, waits.
//
// The background thread exists so that collectives move while the user
// computes (backward passes enqueue gradients and wait for them much later). But when a caller
// blocks on a handle right away (a synchronous allreduce, synchronize() at the end of a step), the
// hand-offs between the caller and the background thread dominate small collectives: each one is
// a wake-up, and on a host with more busy threads than cores a spinning thread that waits for
// another steals the core that thread needs. So a waiting caller runs the loop's passes itself
// (Drive), one thread at a time under progress_mutex_, for as long as they make progress within
// the spin time; then it leaves the work to the background thread and sleeps on its handle.
//
// While callers drive, the background thread stays off the transport's doorbell (it parks on a
// condition variable with a short timeout), so that peers publishing to this rank need no system
// call to wake a thread that has nothing to do. Enqueue wakes it, unless the caller says it will
// wait at once (horo_op_options_t.caller_waits), or the thread is parked and a drive (or a wait
// that found its handle done) ended microseconds ago: an asynchronous call made then is most
// likely waited for at once too (synchronize(allreduce_async_()), a loop of them), and the wake-up
// would cost that caller more than the collective. Left asleep, the thread takes the request up
// when its park ends (kParkTime) if no caller has. A training step's gradients come later, and
// wake it, so that they are reduced while the backward pass goes on. A caller that gives up, or
// leaves requests behind, wakes it too.
// Without a transport that can wait without reading (CanWaitControl), the background thread alone
// runs the passes, blocking in PollControl as before.
//
// A driving caller that finds nothing to do yields its core (SpinRound): on a host with more ranks
// than cores, the peer it waits for may need that very core. Where every rank has a core, the
// system call only adds to a wait of a microsecond or two for a peer on another core; so before
// yielding a drive may busy-poll the control plane for a few microseconds at a time, while doing
// so keeps paying off (drives then finish without yielding at all), and seldom otherwise: ranks
// sharing a core never see a message arrive while they poll, and stop within a few calls. With
// more ranks on the host than CPUs online it never polls.
#include "runtime/runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "common/coarse_clock.h"
#include "common/spin.h"

namespace horo {
namespace {

constexpr auto kParkTime = std::chrono::milliseconds(1);  // background thread: recheck after a drive
// An asynchronous call made this soon after the end of a drive is taken to be waited for at once
// too (WakeAfterEnqueue): a loop of synchronize(allreduce_async_(t)) makes its next call within a
// few microseconds, a training step's first gradient comes a forward and part of a backward later.
constexpr int64_t kJustDrivenNs = 50'000;
// Drive's busy poll before it yields: CPU pauses, looking for a control message (or its handle
// done) every kPollPausesPerLook, for at most kPollTime (capped by HORO_SPIN_MICROSECONDS), about
// what a peer on another core takes to announce its next call, with margin. A drive polls again
// after each pass that moved something, until it finishes or a poll comes back empty and it
// yields. Polling paid off when the drive finished without yielding; each drive that did raises
// the score (up to kPollScoreMax), each that did not lowers it by kPollPenalty. At 0 a drive polls
// only as a probe, to notice when the peers have cores of their own again: after kPollProbeFirst
// drives, and twice as many after each probe that fails, up to kPollProbeLongest (on a shared core
// a probe holds the core the peer needs for the whole kPollTime).
constexpr auto kPollTime = std::chrono::microseconds(20);
constexpr int kPollPausesPerLook = 4;
constexpr int kPollScoreMax = 16;
constexpr int kPollPenalty = 4;
constexpr int kPollProbeFirst = 64;
constexpr int kPollProbeLongest = 8192;
// The background thread's longest sleep between passes, so that a request whose caller said it
// would wait (caller_waits) but does not is still negotiated soon.
constexpr int kLongestWaitMs = 8;

}  // namespace

void Runtime::Loop() {
  using Clock = std::chrono::steady_clock;
  const auto spin = std::chrono::nanoseconds(static_cast<int64_t>(config_.spin_microseconds * 1e3));
  Clock::time_point spin_until = Clock::now();
  int wait_ms = kLongestWaitMs;
  while (true) {
    if (callers_drive_) BackgroundWait(spin_until, wait_ms);
    bool progress = false;
    {
      // While a caller drives, one holding the lock is already making progress: blocking on it
      // would only cost that caller a wake-up of this thread when it lets go.
      std::unique_lock<std::mutex> lock(progress_mutex_, std::defer_lock);
      if (callers_drive_ && drivers_.load(std::memory_order_relaxed) > 0) {
        if (!lock.try_lock()) continue;
      } else {
        lock.lock();
      }
      if (loop_ended_) return;
      if (!Pass(callers_drive_ ? 0 : poll_ms_, &progress)) {
        loop_ended_ = true;
        return;
      }
      // poll_ms_ and the timeline belong to whoever runs a pass: read them here, under the lock.
      wait_ms = std::min(kLongestWaitMs, timeline_->PollTimeoutMs(poll_ms_));
    }
    if (progress) {
      background_passes_.fetch_add(1, std::memory_order_relaxed);
      spin_until = Clock::now() + spin;
    }
  }
}

void Runtime::BackgroundWait(std::chrono::steady_clock::time_point spin_until, int wait_ms) {
  const bool recently_driven =
      drivers_.load() > 0 ||
      SteadyNanos() - last_drive_ns_.load() < std::chrono::duration_cast<std::chrono::nanoseconds>(kParkTime).count();
  if (recently_driven) {
    std::unique_lock<std::mutex> lock(park_mutex_);
    parked_ = true;
    park_cv_.wait_for(lock, kParkTime, [this] { return park_wake_; });
    parked_ = false;
    park_wake_ = false;
    return;
  }
  if (answer_owed_.load(std::memory_order_relaxed)) return;  // its message was read: the doorbell is quiet
  if (std::chrono::steady_clock::now() < spin_until) {
    SpinRound();
    return;
  }
  transport_->WaitControl(wait_ms);
}

void Runtime::WakeAfterEnqueue(bool caller_waits) {
  if (!callers_drive_) {
    WakeBackground();
  } else if (!caller_waits) {
    const bool just_driven = SteadyNanos() - last_drive_ns_.load(std::memory_order_relaxed) < kJustDrivenNs;
    WakeBackground(/*unless_parked=*/just_driven);
  }
}

void Runtime::WakeBackground(bool unless_parked) {
  {
    std::lock_guard<std::mutex> lock(park_mutex_);
    if (unless_parked && parked_) return;
    park_wake_ = true;
  }
  park_cv_.notify_one();
  transport_->Wake();
}

Status Runtime::Wait(int64_t handle, double timeout_seconds) {
  using Clock = std::chrono::steady_clock;
  if (std::isnan(timeout_seconds)) return Status::InvalidArgument("wait: the timeout is NaN");
  // Beyond this (infinity included) a timeout means no timeout: converted to clock ticks it would
  // overflow, and the wait would end at once.
  if (timeout_seconds > 1e6) timeout_seconds = -1;
  if (callers_drive_ && timeout_seconds != 0) {
    std::shared_ptr<const std::atomic<bool>> done = handles_.DoneFlag(handle);
    if (done && !done->load(std::memory_order_acquire)) {
      const bool forever = timeout_seconds < 0;
      const Clock::time_point start = forever ? Clock::time_point() : Clock::now();
      const Clock::time_point deadline =
          forever ? Clock::time_point::max()
                  : start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
      Drive(*done, deadline);
      double left = timeout_seconds;
      if (!forever) {
        left = std::max(0.0, timeout_seconds - std::chrono::duration<double>(Clock::now() - start).count());
      }
      return handles_.Wait(handle, left, /*spin=*/false);
    }
    // Found done (the background thread ran it, woken for whatever reason): a caller that waits is
    // as likely to be back soon as one that drove. Without this, such a caller's next enqueue found
    // no recent drive and woke the thread, which ran that call too, and so on: in a loop of
    // synchronize(allreduce_async_(t)) on 2 ranks of a 2-core host, a fifth to a third of the calls.
    if (done) last_drive_ns_.store(SteadyNanos(), std::memory_order_relaxed);
  }
  return handles_.Wait(handle, timeout_seconds);
}

bool Runtime::CallerPass(const std::atomic<bool>& done) {
  // A pass with nothing queued and no control message would only poll: look first, cheaply.
  if (!queue_.HasRequests() && !transport_->ControlPending() && !answer_owed_.load(std::memory_order_relaxed)) {
    return false;
  }
  bool progress = false;
  std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
  if (lock.owns_lock() && !loop_ended_ && !Pass(0, &progress, &done)) loop_ended_ = true;
  return progress;
}

Status Runtime::PollDriving(int64_t handle, bool* done) {
  HORO_RETURN_IF_ERROR(handles_.Poll(handle, done));
  if (*done || !callers_drive_) return Status::OK();
  std::shared_ptr<const std::atomic<bool>> flag = handles_.DoneFlag(handle);
  const bool progress = flag && CallerPass(*flag);
  if (progress) {
    caller_passes_.fetch_add(1, std::memory_order_relaxed);
  } else {
    SpinRound();
  }
  // Whatever this pass left (or the loop's end) is the background thread's again.
  if (loop_ended_ || queue_.HasRequests()) WakeBackground();
  return handles_.Poll(handle, done);
}

void Runtime::Drive(const std::atomic<bool>& done, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  drivers_.fetch_add(1);
  const bool timed = deadline != Clock::time_point::max();
  DriveState state;
  // A pass already under way is not interrupted (it may move a large collective), so a timed wait
  // can overrun its deadline by one pass; it never starts another after it.
  while (!done.load(std::memory_order_acquire) && !loop_ended_ && (!timed || Clock::now() < deadline)) {
    if (CallerPass(done)) {
      caller_passes_.fetch_add(1, std::memory_order_relaxed);
      state.Moved();
      continue;
    }
    if (!IdleRound(&state, done, timed)) break;
  }
  const bool finished = done.load(std::memory_order_acquire);
  EndDrive(state, finished);
}

bool Runtime::IdleRound(DriveState* state, const std::atomic<bool>& done, bool timed) {
  using Clock = std::chrono::steady_clock;
  // The clock is read only while idle, and there only every kRoundsPerLook rounds (each round
  // yields the core, a microsecond or more): a loop of small collectives read it on every round
  // before, a measurable part of their cost.
  constexpr int kRoundsPerLook = 4;
  if (state->idle_rounds++ % kRoundsPerLook == 0) {
    const Clock::time_point now = Clock::now();
    const auto spin = std::chrono::nanoseconds(static_cast<int64_t>(config_.spin_microseconds * 1e3));
    if (state->idle_rounds == 1) {
      state->idle_since = now;
    } else if (now - state->idle_since >= spin) {
      return false;
    }
  }
  if (state->may_poll && state->yields == 0 && !timed) {
    state->may_poll = false;
    if (state->poll < 0) state->poll = PollAllowed() ? 1 : 0;
    if (state->poll == 1) {
      state->polled = true;
      const auto spin = std::chrono::nanoseconds(static_cast<int64_t>(config_.spin_microseconds * 1e3));
      if (PollForMessage(done, std::min<Clock::duration>(kPollTime, spin))) return true;
    }
  }
  SpinRound();
  ++state->yields;
  return true;
}

void Runtime::EndDrive(const DriveState& state, bool finished) {
  if (state.yields > 0) caller_yields_.fetch_add(state.yields, std::memory_order_relaxed);
  if (state.polled) {
    caller_polls_.fetch_add(1, std::memory_order_relaxed);
    ScorePoll(finished && state.yields == 0);
  }
  // A caller that finished will likely be back soon (a loop of synchronous collectives): the
  // background thread stays parked a little longer. One that gives up leaves it the work, and it
  // must listen to the doorbell again at once.
  last_drive_ns_.store(finished ? SteadyNanos() : 0);
  drivers_.fetch_sub(1);
  if (!finished || loop_ended_ || queue_.HasRequests()) {
    WakeBackground();
  } else if (answer_owed_.load(std::memory_order_relaxed)) {
    // The background thread may have looked at answer_owed_ just before it was set and be about
    // to sleep on the doorbell, which the message already read will not ring: ring it (no system
    // call unless it sleeps).
    transport_->Wake();
  }
}

bool Runtime::PollAllowed() {
  if (!poll_allowed_) return false;
  if (poll_score_.load(std::memory_order_relaxed) > 0) return true;
  return poll_skip_.fetch_sub(1, std::memory_order_relaxed) <= 0;  // a probe
}

bool Runtime::PollForMessage(const std::atomic<bool>& done, std::chrono::steady_clock::duration limit) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + limit;
  while (true) {
    for (int i = 0; i < kPollPausesPerLook; ++i) CpuRelax();
    if (done.load(std::memory_order_acquire) || transport_->ControlPending()) return true;
    if (Clock::now() >= until) return false;
  }
}

void Runtime::ScorePoll(bool paid_off) {
  int score = poll_score_.load(std::memory_order_relaxed);
  int next = 0;
  do {
    next = paid_off ? std::min(score + 1, kPollScoreMax) : std::max(score - kPollPenalty, 0);
  } while (!poll_score_.compare_exchange_weak(score, next, std::memory_order_relaxed));
  if (paid_off) {
    poll_backoff_.store(kPollProbeFirst, std::memory_order_relaxed);
  } else if (next == 0) {
    const int backoff = std::max(poll_backoff_.load(std::memory_order_relaxed), kPollProbeFirst);
    poll_skip_.store(backoff, std::memory_order_relaxed);
    poll_backoff_.store(std::min(backoff * 2, kPollProbeLongest), std::memory_order_relaxed);
  }
}

}  // namespace horo
