#include "transport/loopback/mailbox.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

namespace horo {

Mailbox::Mailbox(int owner_rank) : owner_rank_(owner_rank) {}

Status Mailbox::Deliver(ControlMessage message) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) {
    return Status::PeerLost("lost peer rank " + std::to_string(owner_rank_) +
                            ": its transport closed (control message from rank " + std::to_string(message.peer) + ")");
  }
  messages_.push_back(std::move(message));
  changed_.notify_all();
  return Status::OK();
}

void Mailbox::ReportLostPeer(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return;
  if (std::find(reported_peers_.begin(), reported_peers_.end(), peer) != reported_peers_.end()) return;
  reported_peers_.push_back(peer);
  lost_peers_.push_back(peer);
  changed_.notify_all();
}

void Mailbox::Wake() {
  std::lock_guard<std::mutex> lock(mutex_);
  woken_ = true;
  changed_.notify_all();
}

void Mailbox::Close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  messages_.clear();
  lost_peers_.clear();
  changed_.notify_all();
}

Status Mailbox::Poll(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout_ms < 0) {
    changed_.wait(lock, [this] { return ReadyLocked(); });
  } else if (timeout_ms > 0) {
    changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return ReadyLocked(); });
  }
  if (closed_) {
    return Status::ShutDown("loopback transport of rank " + std::to_string(owner_rank_) + " is closed");
  }
  woken_ = false;
  while (!messages_.empty()) {
    messages->push_back(std::move(messages_.front()));
    messages_.pop_front();
  }
  lost_peers->insert(lost_peers->end(), lost_peers_.begin(), lost_peers_.end());
  lost_peers_.clear();
  return Status::OK();
}

void Mailbox::WaitReady(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout_ms < 0) {
    changed_.wait(lock, [this] { return ReadyLocked(); });
  } else {
    changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [this] { return ReadyLocked(); });
  }
}

}  // namespace horo
