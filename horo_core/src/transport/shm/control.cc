// The control plane of ShmTransport: request and response lists between rank 0 and the workers
// that share its host, through the pair's control rings (see transport.h).
//
// Waiting is what makes negotiation cost microseconds or milliseconds. A waiter first spins for
// spin_microseconds (common/spin.h), then sleeps on its doorbell, which a peer rings when it
// publishes to one of this rank's rings and Wake() rings for a local enqueue.
#include <algorithm>
#include <cstring>

#include "common/coarse_clock.h"
#include "common/logging.h"
#include "common/spin.h"
#include "transport/shm/transport.h"

namespace horo {
namespace {

constexpr size_t kHeaderBytes = tcp::Connection::kControlHeaderSize;
constexpr int64_t kFirstSleepNs = 1000000;     // ... then sleep 1 ms ...
constexpr int64_t kLongestSleepNs = 8000000;   // ... doubling up to 8 ms, checking TCP in between
constexpr int64_t kTcpPollNs = 1000000;        // with TCP control peers too: poll() them for 1 ms
// A frame up to this size is written in one piece: a round message with a 4 KB allreduce's bytes.
constexpr size_t kSmallFrameBytes = 8192;

int64_t NanosBetween(std::chrono::steady_clock::time_point from, std::chrono::steady_clock::time_point to) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count();
}

}  // namespace

shm::Link* ShmTransport::ControlLink(int peer) const {
  // Null for this rank itself and, unless every pair is linked, for a pair of workers (TCP refuses
  // that with a message); one lookup, as it runs for every control frame sent or looked for.
  if (!connected_ || peer < 0 || static_cast<size_t>(peer) >= control_link_of_.size()) return nullptr;
  return control_link_of_[static_cast<size_t>(peer)];
}

void ShmTransport::Wake() {
  wake_requested_.store(true, std::memory_order_release);
  if (connected_) ControlDoorbell().Ring();
  // PollControl waits in TCP's poll() when some control peer is on TCP.
  if (!connected_ || tcp_control_peers_) tcp_->Wake();
}

bool ShmTransport::ControlReady() {
  if (closed_ || wake_requested_.load(std::memory_order_acquire)) return true;
  // Not the reader: a pass may be reading these rings on another thread right now, so look at the
  // shared counters only (CanRead would overwrite the reader's private copy of head).
  for (const auto& owned : links_.links) {
    if (owned && ControlLink(owned->peer) == owned.get() && owned->control_in.HasUnread()) return true;
  }
  // Held by a PollControl that is reading: it may be returning something, so say so.
  std::unique_lock<std::mutex> lock(control_read_mutex_, std::try_to_lock);
  return !lock.owns_lock() || !pending_control_.empty();
}

void ShmTransport::WaitControl(int timeout_ms) {
  if (!CanWaitControl()) return;
  shm::Doorbell doorbell = ControlDoorbell();
  const uint32_t armed = doorbell.Arm();
  if (ControlReady()) {
    doorbell.Disarm();
    return;
  }
  // At most kLongestSleepNs, so that the caller's next PollControl looks at TCP for lost peers.
  const int64_t timeout_ns = timeout_ms < 0 ? kLongestSleepNs : std::min<int64_t>(timeout_ms * 1000000LL, kLongestSleepNs);
  doorbell.Wait(armed, timeout_ns);
}

Status ShmTransport::SendControl(int peer, const std::string& payload) {
  shm::Link* link = ControlLink(peer);
  if (link == nullptr) return tcp_->SendControl(peer, payload);
  if (closed_) return Status::ShutDown(Who() + ": SendControl on a closed transport");
  if (payload.size() > tcp::Connection::kMaxControlFrame) {
    return Status::InvalidArgument(Who() + ": control message of " + std::to_string(payload.size()) +
                                   " bytes exceeds the limit of " + std::to_string(tcp::Connection::kMaxControlFrame));
  }
  std::lock_guard<std::mutex> lock(control_send_mutex_);
  char header[kHeaderBytes];
  const uint64_t length = payload.size();
  for (size_t i = 0; i < kHeaderBytes; ++i) header[i] = static_cast<char>(length >> (8 * i));
  const size_t total = kHeaderBytes + payload.size();
  size_t done = 0;
  if (total <= kSmallFrameBytes) {
    // One write publishes the frame and rings the peer once, instead of once for the header and
    // once for the payload.
    char frame[kSmallFrameBytes];
    std::memcpy(frame, header, kHeaderBytes);
    std::memcpy(frame + kHeaderBytes, payload.data(), payload.size());
    done = link->control_out.Write(frame, total);
  }
  // The time of the last progress is read only once a write is stuck (unset: it just moved).
  Clock::time_point last_progress;
  while (done < total) {
    size_t moved = 0;
    if (done < kHeaderBytes) {
      moved = link->control_out.Write(header + done, kHeaderBytes - done);
    } else {
      moved = link->control_out.Write(payload.data() + (done - kHeaderBytes), total - done);
    }
    done += moved;
    if (moved > 0) {
      last_progress = Clock::time_point();
      continue;
    }
    HORO_RETURN_IF_ERROR(WaitControlSpace(link, peer, done, total, &last_progress));
  }
  return Status::OK();
}

// The control ring to peer is full: the peer reads it whenever its background thread waits, so
// this only waits for that thread to get there (or for the peer to go away).
Status ShmTransport::WaitControlSpace(shm::Link* link, int peer, size_t done, size_t total,
                                      Clock::time_point* last_progress) {
  const std::string progress = std::to_string(done) + " of " + std::to_string(total) + " bytes sent";
  if (closed_) return Status::ShutDown(Who() + ": transport closed while sending a control message");
  if (link->control_out.reader_closed()) {
    return Status::PeerLost(Who() + ": rank " + std::to_string(peer) + " closed its transport while a control " +
                            "message to it was being sent (" + progress + ")");
  }
  DrainControlWhileWaiting();
  const Clock::time_point now = Clock::now();
  if (*last_progress == Clock::time_point()) *last_progress = now;
  const double waited = std::chrono::duration<double>(now - *last_progress).count();
  if (waited > tcp_->options().data_timeout_seconds) {
    return Status::Timeout(Who() + ": rank " + std::to_string(peer) + " read nothing of a control message for " +
                           std::to_string(waited) + " s (" + progress + ")");
  }
  if (NanosBetween(*last_progress, now) < SpinNanos()) {
    SpinRound();
    return Status::OK();
  }
  shm::Doorbell doorbell = links_.own->doorbell();
  const uint32_t armed = doorbell.Arm();
  if (link->control_out.CanWrite() || link->control_out.reader_closed() || closed_) {
    doorbell.Disarm();
    return Status::OK();
  }
  doorbell.Wait(armed, kFirstSleepNs);
  pollfd fd = {tcp_->DataConnection(peer)->fd(), POLLIN | POLLRDHUP, 0};
  if (::poll(&fd, 1, 0) > 0 && fd.revents != 0) {
    return Status::PeerLost(Who() + ": rank " + std::to_string(peer) + " exited while a control message to it " +
                            "was being sent (" + progress + ")");
  }
  return Status::OK();
}

Status ShmTransport::DrainControlLocked(std::vector<ControlMessage>* out) {
  for (const auto& owned : links_.links) {
    shm::Link* link = owned.get();
    if (link == nullptr || ControlLink(link->peer) != link) continue;
    if (!link->control_broken.ok()) return link->control_broken;
    while (true) {
      if (link->control_header_have < kHeaderBytes) {
        link->control_header_have += link->control_in.Read(link->control_header + link->control_header_have,
                                                           kHeaderBytes - link->control_header_have);
        if (link->control_header_have < kHeaderBytes) break;
        uint64_t length = 0;
        for (size_t i = 0; i < kHeaderBytes; ++i) {
          length |= static_cast<uint64_t>(static_cast<uint8_t>(link->control_header[i])) << (8 * i);
        }
        if (length > tcp::Connection::kMaxControlFrame) {
          link->control_broken = Status::Internal(Who() + ": corrupt control frame from rank " +
                                                  std::to_string(link->peer) + " (length " + std::to_string(length) +
                                                  ")");
          return link->control_broken;
        }
        link->control_frame.resize(length);
        link->control_frame_have = 0;
      }
      const size_t length = link->control_frame.size();
      if (link->control_frame_have < length) {
        link->control_frame_have +=
            link->control_in.Read(&link->control_frame[link->control_frame_have], length - link->control_frame_have);
        if (link->control_frame_have < length) break;
      }
      out->emplace_back();
      out->back().peer = link->peer;
      out->back().payload.swap(link->control_frame);
      if (reader_spares_.empty()) {  // the recycled payloads, taken over in one go
        std::lock_guard<std::mutex> lock(spare_mutex_);
        reader_spares_.swap(spare_frames_);
      }
      if (!reader_spares_.empty()) {  // the next frame reuses storage instead of allocating
        link->control_frame.swap(reader_spares_.back());
        reader_spares_.pop_back();
      }
      link->control_header_have = 0;
      link->control_frame_have = 0;
    }
  }
  return Status::OK();
}

void ShmTransport::RecycleControl(std::vector<ControlMessage>* messages) {
  // Only rings take spares (TCP's messages come with their own storage), and only small payloads
  // are kept: a large request list or timeline shipment would otherwise stay allocated for good.
  // Not under control_read_mutex_: ControlReady takes that mutex being held for a reader at work
  // (a message may be coming), and a background thread woken by it would answer a round that the
  // caller means to answer with its next call.
  if (connected_ && control_links_) {
    std::lock_guard<std::mutex> lock(spare_mutex_);
    for (ControlMessage& m : *messages) {
      if (spare_frames_.size() >= kSpareFrames) break;
      if (m.payload.capacity() > kSpareFrameBytes) continue;
      m.payload.clear();
      spare_frames_.push_back(std::move(m.payload));
    }
  }
  messages->clear();
}

void ShmTransport::DrainControlWhileWaiting() {
  std::unique_lock<std::mutex> lock(control_read_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  Status status = DrainControlLocked(&pending_control_);
  // A corrupt frame stays recorded on its link; the next PollControl returns it.
  (void)status;
}

Status ShmTransport::PollControl(int timeout_ms, std::vector<ControlMessage>* messages,
                                 std::vector<int>* lost_peers) {
  // With no control peer at all (one rank) this path still serves Wake() through the doorbell.
  if (!connected_ || (!control_links_ && tcp_control_peers_)) return tcp_->PollControl(timeout_ms, messages, lost_peers);
  std::lock_guard<std::mutex> lock(control_read_mutex_);
  const size_t first = messages->size();
  const size_t first_lost = lost_peers->size();
  // A poll (timeout 0, the callers' fast path) reads no precise clock at all.
  const bool polling = timeout_ms == 0;
  const Clock::time_point start = polling ? Clock::time_point() : Clock::now();
  const bool forever = timeout_ms < 0;
  const Clock::time_point deadline = start + std::chrono::milliseconds(forever ? 0 : timeout_ms);
  Clock::time_point spin_until = start + std::chrono::nanoseconds(SpinNanos());
  int64_t sleep_ns = kFirstSleepNs;
  while (true) {
    if (closed_) return Status::ShutDown(Who() + ": transport closed during PollControl");
    for (ControlMessage& m : pending_control_) messages->push_back(std::move(m));
    pending_control_.clear();
    HORO_RETURN_IF_ERROR(DrainControlLocked(messages));
    const bool woken = wake_requested_.exchange(false, std::memory_order_acq_rel);
    Clock::time_point now = polling ? start : Clock::now();
    const int64_t coarse_now = CoarseNanos();
    // TCP holds the messages of unlinked peers and tells of lost ones: look at it when it may
    // matter (every millisecond or so, and before sleeping), without a system call on every pass
    // of the fast path.
    if (tcp_control_peers_ || coarse_now - last_tcp_check_ns_ >= kFirstSleepNs ||
        (!polling && now >= spin_until && !woken && messages->size() == first)) {
      last_tcp_check_ns_ = coarse_now;
      HORO_RETURN_IF_ERROR(tcp_->PollControl(0, messages, lost_peers));
    }
    if (lost_peers->size() > first_lost) {
      // A worker that fails writes its report to the ring, then closes: read the report too, so
      // that the caller sees it before (in the same call as) the loss.
      return DrainControlLocked(messages);
    }
    if (woken || messages->size() > first || timeout_ms == 0) return Status::OK();
    if (now < spin_until) {
      SpinRound();
      continue;
    }
    if (!forever && now >= deadline) return Status::OK();
    int64_t wait_ns = forever ? sleep_ns : std::min(sleep_ns, NanosBetween(now, deadline));
    if (tcp_control_peers_) {
      // Linked peers ring the doorbell, TCP peers wake poll(): poll TCP briefly, look again.
      const int ms = static_cast<int>(std::max<int64_t>(1, std::min(wait_ns, kTcpPollNs) / 1000000));
      HORO_RETURN_IF_ERROR(tcp_->PollControl(ms, messages, lost_peers));
      if (lost_peers->size() > first_lost) return DrainControlLocked(messages);
      if (messages->size() > first) return Status::OK();
    } else {
      shm::Doorbell doorbell = ControlDoorbell();
      const uint32_t armed = doorbell.Arm();
      bool ready = closed_ || wake_requested_.load(std::memory_order_acquire);
      for (const auto& owned : links_.links) {
        if (ready) break;
        ready = owned && ControlLink(owned->peer) == owned.get() && owned->control_in.CanRead();
      }
      if (ready) {
        doorbell.Disarm();
      } else {
        doorbell.Wait(armed, wait_ns);
        sleep_ns = std::min(sleep_ns * 2, kLongestSleepNs);
      }
    }
    // Whatever woke this thread is likely followed by more: spin again before the next sleep.
    spin_until = Clock::now() + std::chrono::nanoseconds(SpinNanos());
  }
}

}  // namespace horo
