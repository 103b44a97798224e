// TimelineWriter: rank 0's writer thread for the timeline file. The background thread only hands
// it batches (Submit moves a string under a lock); parsing, formatting and file I/O happen on the
// writer thread, which flushes at least every kFlushIntervalMs so that the file on disk is a
// complete JSON array at most that far behind, even if the job dies.
//
// Closing waits for the workers: a worker that records ships a batch at least every
// Timeline::kShipIntervalMs (empty if need be), each stamped with its shipping time, and a final one
// when it stops recording. Close(until_us) keeps the file open until every recording worker has
// shipped past until_us or stopped, so every rank's events up to the stop are in the file.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/status.h"
#include "timeline/trace_file.h"

namespace horo {

class TimelineWriter {
 public:
  static constexpr int kFlushIntervalMs = 100;
  // Batches queued beyond this many bytes are dropped (the disk cannot keep up).
  static constexpr size_t kMaxQueuedBytes = size_t{256} << 20;

  TimelineWriter(int world_size);
  ~TimelineWriter();

  // Creates path (truncating it), writes the header with time zero start_epoch_us and starts the
  // writer thread. The caller closes any file open before.
  Status Open(const std::string& path, int64_t start_epoch_us);
  bool is_open() const;
  std::string path() const;

  // Background thread: queues the events rank recorded (dropped when no file is open) and notes
  // how far that rank has shipped.
  void Submit(int rank, std::string batch);
  // Closes the file once every recording worker has shipped its events up to until_us (Timeline
  // clock), or after wait_seconds; then a warning names the ranks whose last events are missing.
  // Blocks until the file is closed. No-op when no file is open. hand_over: the next file opens
  // right after, at until_us (switching files while recording); the events after until_us that
  // arrive meanwhile are kept for it instead of written here.
  void Close(int64_t until_us, double wait_seconds, bool hand_over = false);

 private:
  struct Worker {
    bool recording = false;
    int64_t shipped_us = 0;  // the shipping time of its last batch
  };

  void Run();
  void WriteQueued(std::vector<std::pair<int, std::string>> batches, int64_t end_us);
  // Workers still recording that have not shipped up to close_until_us_. Under mutex_.
  std::vector<int> Lagging() const;

  const int world_size_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool open_ = false;
  bool closing_ = false;
  bool handing_over_ = false;  // Close(hand_over) until the next Open
  std::vector<std::pair<int, std::string>> handed_over_;  // batches for the next file
  int64_t close_until_us_ = 0;
  std::chrono::steady_clock::time_point close_deadline_;
  std::vector<std::pair<int, std::string>> queue_;
  size_t queued_bytes_ = 0;
  int64_t dropped_batches_ = 0;
  std::map<int, Worker> workers_;  // kept across files: a worker may start before rank 0 does
  std::string path_;
  std::thread thread_;
  TraceFile file_;  // the writer thread's, between Open and Close
};

}  // namespace horo
