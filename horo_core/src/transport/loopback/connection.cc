#include "transport/loopback/connection.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace horo {
namespace loopback {

Connection::Connection(int src_rank, int dst_rank) : src_rank_(src_rank), dst_rank_(dst_rank) {}

Status Connection::Write(const void* data, size_t len) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (writer_closed_) {
    return Status::ShutDown("loopback transport of rank " + std::to_string(src_rank_) +
                            " is closed; cannot send to rank " + std::to_string(dst_rank_));
  }
  if (reader_closed_) {
    return Status::PeerLost("lost peer rank " + std::to_string(dst_rank_) + ": its transport closed (send of " +
                            std::to_string(len) + " bytes from rank " + std::to_string(src_rank_) + ")");
  }
  if (len == 0) return Status::OK();
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  segments_.emplace_back(bytes, bytes + len);
  arrived_.notify_all();
  return Status::OK();
}

size_t Connection::TakeLocked(uint8_t* out, size_t len) {
  size_t taken = 0;
  while (taken < len && !segments_.empty()) {
    std::vector<uint8_t>& front = segments_.front();
    const size_t n = std::min(len - taken, front.size() - front_offset_);
    std::memcpy(out + taken, front.data() + front_offset_, n);
    taken += n;
    front_offset_ += n;
    if (front_offset_ == front.size()) {
      segments_.pop_front();
      front_offset_ = 0;
    }
  }
  return taken;
}

Status Connection::Read(void* data, size_t len, std::chrono::duration<double> no_progress_timeout) {
  using Clock = std::chrono::steady_clock;
  const bool limited = no_progress_timeout.count() > 0;
  const auto timeout = std::chrono::duration_cast<Clock::duration>(no_progress_timeout);
  uint8_t* out = static_cast<uint8_t*>(data);
  size_t received = 0;
  auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (reader_closed_) {
      return Status::ShutDown("loopback transport of rank " + std::to_string(dst_rank_) +
                              " is closed; cannot receive from rank " + std::to_string(src_rank_));
    }
    const size_t taken = TakeLocked(out + received, len - received);
    received += taken;
    if (received == len) return Status::OK();
    if (writer_closed_) {
      return Status::PeerLost("lost peer rank " + std::to_string(src_rank_) + ": its transport closed after " +
                              std::to_string(received) + " of " + std::to_string(len) +
                              " bytes of a receive on rank " + std::to_string(dst_rank_));
    }
    if (!limited) {
      arrived_.wait(lock);
      continue;
    }
    if (taken > 0) deadline = Clock::now() + timeout;
    if (arrived_.wait_until(lock, deadline) == std::cv_status::timeout && segments_.empty() && !writer_closed_ &&
        !reader_closed_) {
      std::ostringstream message;
      message << "timeout: no data from rank " << src_rank_ << " for " << no_progress_timeout.count()
              << " s (received " << received << " of " << len << " bytes on rank " << dst_rank_ << ")";
      return Status::Timeout(message.str());
    }
  }
}

void Connection::CloseWriter() {
  std::lock_guard<std::mutex> lock(mutex_);
  writer_closed_ = true;
  arrived_.notify_all();
}

void Connection::CloseReader() {
  std::lock_guard<std::mutex> lock(mutex_);
  reader_closed_ = true;
  segments_.clear();
  front_offset_ = 0;
  arrived_.notify_all();
}

}  // namespace loopback
}  // namespace horo
