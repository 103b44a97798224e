#include "timeline/timeline_writer.h"

#include <sstream>

#include "common/logging.h"
#include "timeline/event_batch.h"

namespace horo {

TimelineWriter::TimelineWriter(int world_size) : world_size_(world_size) {}

TimelineWriter::~TimelineWriter() { Close(0, 0); }

Status TimelineWriter::Open(const std::string& path, int64_t start_epoch_us) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (open_) return Status::Internal("timeline writer: '" + path_ + "' is still open");
  Status opened = file_.Open(path, start_epoch_us, world_size_);
  if (!opened.ok()) {
    handing_over_ = false;  // nobody takes the handed-over events now
    handed_over_.clear();
    return opened;
  }
  open_ = true;
  closing_ = false;
  queue_.clear();
  if (handing_over_) {  // what the file before received after its end, from this file's start
    queue_.swap(handed_over_);
    handing_over_ = false;
  }
  handed_over_.clear();
  queued_bytes_ = 0;
  for (const auto& rb : queue_) queued_bytes_ += rb.second.size();
  dropped_batches_ = 0;
  path_ = path;
  thread_ = std::thread([this] { Run(); });
  return Status::OK();
}

bool TimelineWriter::is_open() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return open_;
}

std::string TimelineWriter::path() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return path_;
}

void TimelineWriter::Submit(int rank, std::string batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  bool final = false;
  int64_t shipped_us = 0;
  if (rank != 0 && ReadBatchEnd(batch, &final, &shipped_us)) {
    Worker& w = workers_[rank];
    w.recording = !final;
    w.shipped_us = shipped_us;
    if (closing_ && Lagging().empty()) wake_.notify_all();
  }
  if (!open_) {
    if (handing_over_) handed_over_.emplace_back(rank, std::move(batch));  // between two files
    return;
  }
  if (queued_bytes_ + batch.size() > kMaxQueuedBytes) {
    if (dropped_batches_++ == 0) {
      HORO_LOG(kWarning, 0) << "timeline: the writer cannot keep up with '" << path_
                            << "'; dropping events until it catches up";
    }
    return;
  }
  queued_bytes_ += batch.size();
  queue_.emplace_back(rank, std::move(batch));
}

std::vector<int> TimelineWriter::Lagging() const {
  std::vector<int> ranks;
  for (const auto& kv : workers_) {
    if (kv.second.recording && kv.second.shipped_us < close_until_us_) ranks.push_back(kv.first);
  }
  return ranks;
}

void TimelineWriter::Close(int64_t until_us, double wait_seconds, bool hand_over) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!open_ || closing_) return;
  closing_ = true;
  handing_over_ = hand_over;
  handed_over_.clear();
  close_until_us_ = until_us;
  close_deadline_ = std::chrono::steady_clock::now() +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(wait_seconds > 0 ? wait_seconds : 0.0));
  wake_.notify_all();
  lock.unlock();
  thread_.join();
  lock.lock();
  if (handing_over_) {  // arrived after the writer's last look: for the next file
    for (auto& rb : queue_) handed_over_.push_back(std::move(rb));
  }
  queue_.clear();
  open_ = false;
  closing_ = false;
}

void TimelineWriter::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    const auto next_flush = std::chrono::steady_clock::now() + std::chrono::milliseconds(kFlushIntervalMs);
    const auto closable = [this] {
      return closing_ && (Lagging().empty() || std::chrono::steady_clock::now() >= close_deadline_);
    };
    wake_.wait_until(lock, closing_ ? std::min(next_flush, close_deadline_) : next_flush, closable);
    const bool close_now = closable();
    std::vector<std::pair<int, std::string>> batches;
    batches.swap(queue_);
    queued_bytes_ = 0;
    const std::vector<int> missing = close_now ? Lagging() : std::vector<int>();
    // Handing over, the batches that arrive while this file waits for the workers hold events
    // of the next file too: this one takes what is up to its end, the next one what follows.
    const int64_t end_us = closing_ && handing_over_ ? close_until_us_ : INT64_MAX;
    if (end_us != INT64_MAX) handed_over_.insert(handed_over_.end(), batches.begin(), batches.end());
    lock.unlock();
    WriteQueued(std::move(batches), end_us);
    if (close_now) {
      if (!missing.empty()) {
        std::ostringstream ranks;
        for (int r : missing) ranks << (ranks.tellp() > 0 ? ", " : "") << r;
        HORO_LOG(kWarning, 0) << "timeline: rank(s) " << ranks.str() << " sent no events for the last "
                              << "moments before '" << file_.path() << "' was closed (busy or gone); "
                              << "their last events are missing";
      }
      Status st = file_.Close();
      if (!st.ok()) HORO_LOG(kError, 0) << st.message();
      return;
    }
    lock.lock();
  }
}

void TimelineWriter::WriteQueued(std::vector<std::pair<int, std::string>> batches, int64_t end_us) {
  if (!file_.is_open()) return;  // a write failed earlier; the error was logged then
  for (const auto& rb : batches) {
    ParsedEventBatch parsed;
    Status st = ParseEventBatch(rb.second, &parsed);
    if (!st.ok()) {
      HORO_LOG(kError, 0) << "timeline: dropping events of rank " << rb.first << ": " << st.message();
      continue;
    }
    file_.Append(rb.first, parsed, end_us);
  }
  Status st = file_.Flush();
  if (!st.ok()) HORO_LOG(kError, 0) << st.message() << "; the timeline stops here";
}

}  // namespace horo
