// TraceFile: the timeline as a Chrome trace JSON array (what chrome://tracing and ui.perfetto.dev
// open), in Horovod's layout: every tensor is a "process" (pid = tensor index, from 1, named by a
// process_name metadata event), and the first object carries start_time_since_epoch_in_micros.
// Timestamps are microseconds since that start.
//
// Horo adds threads inside each tensor's process: one track per rank that executed the tensor
// ("rank R") and one for the coordinator's negotiation ("negotiation"). Perfetto keys threads by
// tid alone, so every (tensor, track) pair gets a tid of its own: tid = pid * stride + slot, slot 0
// being negotiation and slot r + 1 rank r, stride the smallest power of ten above the number of
// ranks (tid 31 is tensor 3, rank 2 when there are fewer than 10 ranks).
//
// The file is a complete JSON array after every Flush (the closing bracket is rewritten after the
// last event each time, as Horovod does), so a job that dies leaves a readable trace. Close ends
// every slice still open, so that begin and end events always balance on every track.
//
// Used by one thread (the timeline writer's).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "timeline/event_batch.h"

namespace horo {

class TraceFile {
 public:
  TraceFile() = default;
  TraceFile(const TraceFile&) = delete;
  TraceFile& operator=(const TraceFile&) = delete;
  ~TraceFile();

  // Creates (or truncates) path and writes the header. start_epoch_us is time zero of the trace.
  Status Open(const std::string& path, int64_t start_epoch_us, int world_size);
  bool is_open() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

  // Appends the events rank recorded. Events from before the start, or from end_epoch_us on, are
  // dropped, and so is an end whose begin was dropped; each track's timestamps never decrease.
  void Append(int rank, const ParsedEventBatch& batch, int64_t end_epoch_us = INT64_MAX);
  // Writes what is buffered; the file is then a complete JSON array.
  Status Flush();
  // Ends the slices still open at the last timestamp seen, terminates the array and closes.
  Status Close();

 private:
  struct Track {
    int open = 0;  // slices begun and not yet ended
    int64_t last_ts = 0;
  };

  int TensorPid(int32_t process_set_id, const std::string& name);
  // The track (tid = pid * stride + slot), named by metadata when first used.
  Track& TrackOf(int pid, int slot, int rank);
  // pids: the pid of each tensor of the group, 0 where not looked up yet.
  void AppendEvent(int rank, const ParsedEventBatch::Group& group, std::vector<int>* pids,
                   const ParsedEventBatch::Event& e, int64_t ts);
  void Element(const std::string& json);
  void StartElement();
  void AppendNumber(int64_t value);
  Status Fail(const std::string& what);

  FILE* file_ = nullptr;
  std::string path_;
  bool seekable_ = false;
  long body_end_ = 0;  // where the closing bracket starts
  int64_t elements_ = 0;
  std::string buffer_;
  int64_t start_epoch_us_ = 0;
  int64_t max_ts_ = 0;
  int world_size_ = 1;
  int64_t tid_stride_ = 10;
  std::map<std::pair<int32_t, std::string>, int> pids_;
  std::unordered_map<int64_t, Track> tracks_;
};

}  // namespace horo
