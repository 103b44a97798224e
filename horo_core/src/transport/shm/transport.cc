#include "transport/shm/transport.h"

#include <errno.h>
#include <poll.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "common/spin.h"

namespace horo {
namespace {

constexpr int64_t kFirstSleepNs = 1000000;    // doorbell sleeps start at 1 ms ...
constexpr int64_t kLongestSleepNs = 8000000;  // ... and double up to 8 ms while nothing moves
constexpr int64_t kMixedSleepNs = 200000;     // with a TCP direction pending: ppoll() for 200 us

std::string Progress(size_t done, size_t total, bool sending) {
  return std::to_string(done) + " of " + std::to_string(total) + " bytes " + (sending ? "sent" : "received");
}

std::string Seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

}  // namespace

ShmTransport::ShmTransport(std::unique_ptr<TcpTransport> tcp, const ShmOptions& options)
    : tcp_(std::move(tcp)), options_(options) {}

ShmTransport::~ShmTransport() {
  Close();
  control_link_of_.clear();
  links_.links.clear();
  links_.mapped.clear();
  links_.own.reset();
  tcp_.reset();
}

Status ShmTransport::Connect(const std::vector<std::string>& addresses) {
  if (connect_called_) return Status::InvalidArgument(Who() + ": ShmTransport::Connect called twice");
  connect_called_ = true;
  HORO_RETURN_IF_ERROR(tcp_->Connect(addresses));
  shm::LinkSet links;
  shm::LinkBuilder builder(options_, tcp_.get());
  HORO_RETURN_IF_ERROR(builder.Run(&links));
  std::lock_guard<std::mutex> lock(close_mutex_);
  if (closed_) return Status::ShutDown(Who() + ": transport closed while connecting");
  links_ = std::move(links);
  // Control peers: rank 0 talks to every rank, a worker to rank 0 only, unless every pair of ranks
  // is linked: then any two ranks talk through their control rings.
  every_peer_linked_ = true;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank() && !links_.links[peer]) every_peer_linked_ = false;
  }
  control_link_of_.assign(static_cast<size_t>(size()), nullptr);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank() || (rank() != 0 && peer != 0 && !every_peer_linked_)) continue;
    (links_.links[peer] ? control_links_ : tcp_control_peers_) = true;
    control_link_of_[static_cast<size_t>(peer)] = links_.links[peer].get();
  }
  connected_ = true;
  return Status::OK();
}

bool ShmTransport::SharedMemoryPeer(int peer) const {
  return connected_ && peer >= 0 && peer < size() && links_.links[peer] != nullptr;
}

std::vector<int> ShmTransport::HostIds() const { return connected_ ? links_.host_ids : std::vector<int>(); }

void ShmTransport::Close() {
  {
    std::lock_guard<std::mutex> lock(close_mutex_);
    if (!closed_.exchange(true)) {
      // Peers waiting on this rank see the flags at once; this rank's own waiter wakes up too.
      for (auto& link : links_.links) {
        if (!link) continue;
        link->out.CloseWriter();
        link->in.CloseReader();
        link->control_out.CloseWriter();
        link->control_in.CloseReader();
      }
      ControlDoorbell().RingAlways();
    }
  }
  tcp_->Close();
}

Status ShmTransport::CheckDataPeer(int peer, const char* what) const {
  if (closed_) return Status::ShutDown(Who() + ": " + what + " on a closed transport");
  if (!connected_) return Status::InvalidArgument(Who() + ": " + what + " called before Connect succeeded");
  if (peer < 0 || peer >= size() || peer == rank()) {
    return Status::InvalidArgument(Who() + ": " + what + ": invalid peer rank " + std::to_string(peer) +
                                   " (world size " + std::to_string(size()) + ")");
  }
  return Status::OK();
}

Status ShmTransport::Prepare(int peer, const void* data, size_t len, const char* what, Direction* direction) const {
  HORO_RETURN_IF_ERROR(CheckDataPeer(peer, what));
  if (len > 0 && data == nullptr) {
    return Status::InvalidArgument(Who() + ": " + what + " of " + std::to_string(len) + " bytes with a null buffer");
  }
  direction->peer = peer;
  direction->link = links_.links[peer].get();
  direction->conn = direction->link ? nullptr : tcp_->DataConnection(peer);
  direction->data = static_cast<char*>(const_cast<void*>(data));
  direction->len = len;
  return Status::OK();
}

Status ShmTransport::Send(int peer, const void* data, size_t len) {
  Direction send, idle;
  HORO_RETURN_IF_ERROR(Prepare(peer, data, len, "Send", &send));
  if (send.link == nullptr) return tcp_->Send(peer, data, len);
  return len == 0 ? Status::OK() : Transfer(&send, &idle);
}

Status ShmTransport::Recv(int peer, void* data, size_t len) {
  Direction recv, idle;
  HORO_RETURN_IF_ERROR(Prepare(peer, data, len, "Recv", &recv));
  if (recv.link == nullptr) return tcp_->Recv(peer, data, len);
  return len == 0 ? Status::OK() : Transfer(&idle, &recv);
}

Status ShmTransport::SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                              void* recv_data, size_t recv_len) {
  return Exchange(send_peer, send_data, send_len, recv_peer, recv_data, recv_len, /*uncached=*/false);
}

Status ShmTransport::SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                      void* recv_data, size_t recv_len) {
  return Exchange(send_peer, send_data, send_len, recv_peer, recv_data, recv_len, /*uncached=*/true);
}

Status ShmTransport::Exchange(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                              size_t recv_len, bool uncached) {
  Direction send, recv;
  if (send_peer != -1) HORO_RETURN_IF_ERROR(Prepare(send_peer, send_data, send_len, "SendRecv", &send));
  if (recv_peer != -1) HORO_RETURN_IF_ERROR(Prepare(recv_peer, recv_data, recv_len, "SendRecv", &recv));
  recv.uncached = uncached;
  if (send.link == nullptr && recv.link == nullptr) {
    return tcp_->SendRecv(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  }
  if (send_peer == -1 && recv_peer == -1 && closed_) return Status::ShutDown(Who() + ": SendRecv on a closed transport");
  return Transfer(&send, &recv);
}

Status ShmTransport::SendRecvReduce(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                    void* recv_data, size_t recv_len, const ReceiveReducer& reducer) {
  if (recv_peer == -1 || recv_len == 0) return SendRecv(send_peer, send_data, send_len, -1, nullptr, 0);
  Direction send, recv;
  if (send_peer != -1) HORO_RETURN_IF_ERROR(Prepare(send_peer, send_data, send_len, "SendRecvReduce", &send));
  HORO_RETURN_IF_ERROR(Prepare(recv_peer, recv_data, recv_len, "SendRecvReduce", &recv));
  if (recv.link == nullptr) {
    return Status::Unsupported(Who() + ": no shared memory with rank " + std::to_string(recv_peer));
  }
  if (reducer.reduce == nullptr || reducer.element_size == 0 || reducer.element_size > sizeof(recv.carry.bytes) ||
      recv_len % reducer.element_size != 0) {
    return Status::InvalidArgument(Who() + ": SendRecvReduce of " + std::to_string(recv_len) +
                                   " bytes with an invalid reducer (element size " +
                                   std::to_string(reducer.element_size) + ")");
  }
  recv.reducer = &reducer;
  return Transfer(&send, &recv);
}

// Both directions are attempted on every pass. A pass that moves nothing first checks for closed
// peers, then spins, then sleeps; the no-progress clock restarts whenever a byte moves.
Status ShmTransport::Transfer(Direction* send, Direction* recv) {
  for (Direction* direction : {send, recv}) {
    if (direction->link && !direction->link->broken.ok()) return direction->link->broken;
    if (direction->conn && direction->pending() && direction->conn->broken()) return direction->conn->broken_status();
  }
  const auto timeout = std::chrono::microseconds(static_cast<int64_t>(tcp_->options().data_timeout_seconds * 1e6));
  const auto spin = std::chrono::nanoseconds(SpinNanos());
  Clock::time_point last_progress = Clock::now();
  Clock::time_point spin_until;
  bool spinning = false;
  int64_t sleep_ns = kFirstSleepNs;
  while (true) {
    bool progress = false;
    Status status;
    if (send->pending() && !Step(send, true, &progress, &status)) return status;
    if (recv->pending() && !Step(recv, false, &progress, &status)) return status;
    if (!send->pending() && !recv->pending()) return Status::OK();
    Clock::time_point now = Clock::now();
    if (progress) {
      last_progress = now;
      spinning = false;
      sleep_ns = kFirstSleepNs;
      continue;
    }
    HORO_RETURN_IF_ERROR(CheckClosed(send, recv));
    if (control_links_) DrainControlWhileWaiting();
    if (!spinning) {
      spinning = true;
      spin_until = now + spin;
    }
    if (now < spin_until) {
      SpinRound();
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(timeout - (now - last_progress));
    if (left.count() <= 0) return TimeoutFailure(send, recv);
    Block(send, recv, left, sleep_ns);
    sleep_ns = std::min(sleep_ns * 2, kLongestSleepNs);
    HORO_RETURN_IF_ERROR(CheckHangUps(send, recv));
    spinning = false;
  }
}

bool ShmTransport::Step(Direction* direction, bool sending, bool* progress, Status* status) {
  size_t moved = 0;
  char* at = direction->data + direction->done;
  const size_t left = direction->len - direction->done;
  if (direction->link != nullptr) {
    if (!direction->aligned) {
      direction->aligned = sending ? direction->link->out.AlignWriter() : direction->link->in.AlignReader();
      if (!direction->aligned) return true;
    }
    if (sending) {
      moved = direction->link->out.Write(at, left);
    } else if (direction->reducer != nullptr) {
      moved = direction->link->in.ReadReduce(at, left, *direction->reducer, &direction->carry);
    } else if (direction->uncached) {
      moved = direction->link->in.ReadUncached(at, left);
    } else {
      moved = direction->link->in.Read(at, left);
    }
  } else {
    int error = 0;
    tcp::Connection::Io io = sending ? direction->conn->SendSome(at, left, &moved, &error)
                                     : direction->conn->RecvSome(at, left, &moved, &error);
    if (io != tcp::Connection::Io::kOk) {
      direction->done += moved;
      *status = Lost(direction, io == tcp::Connection::Io::kClosed ? "peer closed the connection" : std::strerror(error),
                     sending);
      return false;
    }
  }
  direction->done += moved;
  *progress |= moved > 0;
  return true;
}

Status ShmTransport::CheckClosed(Direction* send, Direction* recv) {
  if (closed_) return Status::ShutDown(Who() + ": transport closed during a transfer");
  if (send->pending() && send->link && send->link->out.reader_closed()) {
    return Lost(send, "rank " + std::to_string(send->peer) + " closed its transport", true);
  }
  // Bytes published before the peer closed are still delivered, as TCP would.
  if (recv->pending() && recv->link && recv->link->in.writer_closed() && !recv->link->in.CanRead()) {
    return Lost(recv, "rank " + std::to_string(recv->peer) + " closed its transport", false);
  }
  return Status::OK();
}

void ShmTransport::Block(Direction* send, Direction* recv, std::chrono::microseconds timeout, int64_t sleep_ns) {
  const int64_t timeout_ns = timeout.count() * 1000;
  pollfd fds[2];
  nfds_t count = 0;
  if (send->pending() && send->conn) fds[count++] = {send->conn->fd(), POLLOUT, 0};
  if (recv->pending() && recv->conn) fds[count++] = {recv->conn->fd(), POLLIN, 0};
  if (count > 0) {
    const int64_t ns = std::min(timeout_ns, kMixedSleepNs);
    timespec wait = {static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    ::ppoll(fds, count, &wait, nullptr);
    return;
  }
  shm::Doorbell doorbell = links_.own->doorbell();
  const uint32_t armed = doorbell.Arm();
  const bool ready = closed_ ||
                     (send->pending() &&
                      (send->link->out.CanWrite(send->aligned ? 1 : kDataMessageAlignment) ||
                       send->link->out.reader_closed())) ||
                     (recv->pending() && (recv->link->in.CanRead() || recv->link->in.writer_closed()));
  if (ready) {
    doorbell.Disarm();
    return;
  }
  doorbell.Wait(armed, std::min(timeout_ns, sleep_ns));
}

Status ShmTransport::CheckHangUps(Direction* send, Direction* recv) {
  HORO_RETURN_IF_ERROR(CheckClosed(send, recv));  // a peer's Close() is the more precise cause
  for (Direction* direction : {send, recv}) {
    if (!direction->pending() || direction->link == nullptr) continue;
    // The pair's TCP data connection carries nothing after setup: any event means the peer's
    // process closed it, normally by exiting or dying.
    pollfd fd = {tcp_->DataConnection(direction->peer)->fd(), POLLIN | POLLRDHUP, 0};
    if (::poll(&fd, 1, 0) <= 0 || fd.revents == 0) continue;
    if (direction == recv && recv->link->in.CanRead()) continue;  // deliver what it wrote first
    return Lost(direction, "its process exited (connection closed)", direction == send);
  }
  return Status::OK();
}

Status ShmTransport::Lost(Direction* direction, const std::string& reason, bool sending) {
  const std::string peer = "rank " + std::to_string(direction->peer);
  const char* verb = sending ? "send" : "recv";
  if (closed_) return Status::ShutDown(Who() + ": transport closed during " + verb + " with " + peer);
  const std::string kind = direction->link ? "shared-memory connection" : "connection";
  Status status = Status::PeerLost(Who() + ": " + kind + " to " + peer + " lost during " + verb + ": " + reason +
                                   " (" + Progress(direction->done, direction->len, sending) + ")");
  if (direction->link) {
    if (direction->link->broken.ok()) direction->link->broken = status;
  } else {
    direction->conn->MarkBroken(status);
  }
  return status;
}

Status ShmTransport::TimeoutFailure(Direction* send, Direction* recv) {
  std::string what;
  if (send->pending()) what = "send to rank " + std::to_string(send->peer) + ": " + Progress(send->done, send->len, true);
  if (recv->pending()) {
    what += std::string(what.empty() ? "" : "; ") + "recv from rank " + std::to_string(recv->peer) + ": " +
            Progress(recv->done, recv->len, false);
  }
  Status status = Status::Timeout(Who() + ": no progress for " + Seconds(tcp_->options().data_timeout_seconds) +
                                  " (" + what + "); the byte stream is now out of step");
  for (Direction* direction : {send, recv}) {
    if (!direction->pending()) continue;
    if (direction->link && direction->link->broken.ok()) direction->link->broken = status;
    if (direction->conn) direction->conn->MarkBroken(status);
  }
  return status;
}

}  // namespace horo
