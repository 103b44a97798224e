// Connection: the one-way byte stream from one rank to another inside a loopback hub.
//
// A write copies the bytes into the stream and returns at once, so senders never block; a read
// blocks until the requested number of bytes has arrived. Either end may close: a read that cannot
// be satisfied any more fails with PeerLost (the writer closed) or ShutDown (the reader itself
// closed), and so does a write (reader closed: PeerLost, writer closed: ShutDown).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "common/status.h"

namespace horo {
namespace loopback {

class Connection {
 public:
  Connection(int src_rank, int dst_rank);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Called by the source rank.
  Status Write(const void* data, size_t len);
  // Called by the destination rank. Fails with Timeout when no byte arrives for no_progress_timeout
  // (a zero or negative timeout waits without limit).
  Status Read(void* data, size_t len, std::chrono::duration<double> no_progress_timeout);

  // The source rank closed: reads that are not yet satisfied fail with PeerLost.
  void CloseWriter();
  // The destination rank closed: writes fail with PeerLost, its own reads with ShutDown.
  void CloseReader();

 private:
  // Moves up to len bytes from the queued segments into out; returns how many. Needs mutex_.
  size_t TakeLocked(uint8_t* out, size_t len);

  const int src_rank_;
  const int dst_rank_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<std::vector<uint8_t>> segments_;  // one per Write, oldest first
  size_t front_offset_ = 0;                    // bytes of segments_.front() already read
  bool writer_closed_ = false;
  bool reader_closed_ = false;
};

}  // namespace loopback
}  // namespace horo
