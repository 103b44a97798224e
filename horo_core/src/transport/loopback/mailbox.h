// Mailbox: the control-plane inbox of one rank inside a loopback hub.
//
// Peers deliver framed control messages into it and the hub reports peers that closed; the owner
// drains both with Poll, which sleeps on a condition variable until something arrives, Wake() is
// called, the owner closes, or the timeout passes. A pending Wake is consumed by one Poll.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace horo {

class Mailbox {
 public:
  explicit Mailbox(int owner_rank);
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Fails with PeerLost when the owner has closed.
  Status Deliver(ControlMessage message);
  // Records that peer closed; reported by exactly one Poll however often it is called.
  void ReportLostPeer(int peer);
  void Wake();
  // The owner closed: Poll fails with ShutDown from now on, deliveries with PeerLost.
  void Close();

  // timeout_ms < 0 waits without limit. Returns OK when woken, timed out or given something.
  Status Poll(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers);
  // Waits as Poll does, but takes nothing.
  void WaitReady(int timeout_ms);
  // Poll would return something now.
  bool Ready() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ReadyLocked();
  }

 private:
  bool ReadyLocked() const { return !messages_.empty() || !lost_peers_.empty() || woken_ || closed_; }

  const int owner_rank_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<ControlMessage> messages_;
  std::vector<int> lost_peers_;       // not yet reported by Poll
  std::vector<int> reported_peers_;   // every peer ever reported lost
  bool woken_ = false;
  bool closed_ = false;
};

}  // namespace horo
