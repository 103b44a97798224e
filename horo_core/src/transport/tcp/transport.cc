#include "transport/tcp/transport.h"

#include <errno.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/logging.h"
#include "transport/tcp/mesh_builder.h"
#include "transport/tcp/socket_address.h"

namespace horo {
namespace {

using Clock = std::chrono::steady_clock;

std::string Seconds(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

std::string Progress(size_t done, size_t total, const char* verb) {
  return std::to_string(done) + " of " + std::to_string(total) + " bytes " + verb;
}

bool IsWildcardHost(const std::string& host) { return host.empty() || host == "0.0.0.0" || host == "::"; }

}  // namespace

TcpTransport::TcpTransport(const TcpOptions& options) : options_(options) {}

TcpTransport::~TcpTransport() {
  Close();
  data_.clear();
  control_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (close_fd_ >= 0) ::close(close_fd_);
}

Status TcpTransport::Listen(const TcpOptions& options, std::unique_ptr<TcpTransport>* out) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("TcpOptions: rank " + std::to_string(options.rank) + " is not in [0, " +
                                   std::to_string(options.size) + ")");
  }
  if (options.secret.empty()) {
    return Status::InvalidArgument("TcpOptions.secret is empty: refusing to run unauthenticated; the launcher "
                                   "must hand every rank the same per-job secret");
  }
  if (!(options.connect_timeout_seconds > 0) || !(options.data_timeout_seconds > 0)) {
    return Status::InvalidArgument("TcpOptions: connect_timeout_seconds and data_timeout_seconds must be > 0");
  }
  std::unique_ptr<TcpTransport> transport(new TcpTransport(options));
  const std::string who = "rank " + std::to_string(options.rank);

  std::vector<SocketAddress> candidates;
  Status st = SocketAddress::Resolve(options.bind_host, 0, /*passive=*/true, &candidates);
  if (!st.ok()) return Status::InvalidArgument(who + ": bind_host: " + st.message());
  std::string last_error;
  for (const SocketAddress& candidate : candidates) {
    int fd = ::socket(candidate.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    if (::bind(fd, candidate.get(), candidate.length()) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      transport->listen_fd_ = fd;
      break;
    }
    last_error = candidate.ToString() + ": " + std::strerror(errno);
    ::close(fd);
  }
  if (transport->listen_fd_ < 0) {
    return Status::InvalidArgument(who + ": cannot listen on bind_host '" + options.bind_host + "': " + last_error);
  }
  std::string host = options.bind_host;
  if (IsWildcardHost(host)) {
    char name[256] = "";
    if (::gethostname(name, sizeof(name) - 1) != 0) {
      return Status::Internal(who + ": gethostname failed: " + std::strerror(errno));
    }
    host = name;
  }
  transport->address_ = SocketAddress::JoinHostPort(host, SocketAddress::OfSocket(transport->listen_fd_, false).port());

  transport->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  transport->close_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (transport->wake_fd_ < 0 || transport->close_fd_ < 0) {
    return Status::Internal(who + ": eventfd failed: " + std::strerror(errno));
  }
  *out = std::move(transport);
  return Status::OK();
}

Status TcpTransport::Connect(const std::vector<std::string>& addresses) {
  if (connect_called_) return Status::InvalidArgument(Who() + ": TcpTransport::Connect called twice");
  if (closed_) return Status::ShutDown(Who() + ": transport closed before Connect");
  if (addresses.size() != static_cast<size_t>(options_.size)) {
    return Status::InvalidArgument(Who() + ": Connect needs one address per rank: got " +
                                   std::to_string(addresses.size()) + " for world size " +
                                   std::to_string(options_.size));
  }
  connect_called_ = true;
  std::vector<std::unique_ptr<tcp::Connection>> data, control;
  Status st;
  {
    MeshBuilder builder(options_, listen_fd_, close_fd_);
    st = builder.Run(addresses, &data, &control);
  }
  {
    std::lock_guard<std::mutex> lock(close_mutex_);
    // The mesh is complete (or failed): nobody else may connect from now on.
    ::close(listen_fd_);
    listen_fd_ = -1;
    if (st.ok() && closed_) st = Status::ShutDown(Who() + ": transport closed while connecting");
    if (!st.ok()) return st;
    data_ = std::move(data);
    control_ = std::move(control);
  }
  control_lost_.assign(options_.size, false);
  poll_fds_.reserve(options_.size + 2);
  poll_peers_.reserve(options_.size + 2);
  connected_ = true;
  HORO_LOG(kDebug, options_.rank) << "tcp mesh of " << options_.size << " ranks connected";
  return Status::OK();
}

void TcpTransport::Close() {
  std::lock_guard<std::mutex> lock(close_mutex_);
  if (closed_.exchange(true)) return;
  if (close_fd_ >= 0) {
    uint64_t one = 1;
    ssize_t ignored = ::write(close_fd_, &one, sizeof(one));
    (void)ignored;
  }
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  for (auto& connection : data_) {
    if (connection) connection->Shutdown();
  }
  for (auto& connection : control_) {
    if (connection) connection->Shutdown();
  }
}

void TcpTransport::Wake() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

Status TcpTransport::CheckDataPeer(int peer, const char* what) const {
  if (closed_) return Status::ShutDown(Who() + ": " + what + " on a closed transport");
  if (!connected_) return Status::InvalidArgument(Who() + ": " + what + " called before Connect succeeded");
  if (peer < 0 || peer >= options_.size || peer == options_.rank) {
    return Status::InvalidArgument(Who() + ": " + what + ": invalid peer rank " + std::to_string(peer) +
                                   " (world size " + std::to_string(options_.size) + ")");
  }
  return Status::OK();
}

Status TcpTransport::Send(int peer, const void* data, size_t len) {
  HORO_RETURN_IF_ERROR(CheckDataPeer(peer, "Send"));
  if (len == 0) return Status::OK();
  if (data == nullptr) return Status::InvalidArgument(Who() + ": Send of " + std::to_string(len) + " bytes from null");
  return Transfer(data_[peer].get(), static_cast<const char*>(data), len, nullptr, nullptr, 0);
}

Status TcpTransport::Recv(int peer, void* data, size_t len) {
  HORO_RETURN_IF_ERROR(CheckDataPeer(peer, "Recv"));
  if (len == 0) return Status::OK();
  if (data == nullptr) return Status::InvalidArgument(Who() + ": Recv of " + std::to_string(len) + " bytes into null");
  return Transfer(nullptr, nullptr, 0, data_[peer].get(), static_cast<char*>(data), len);
}

Status TcpTransport::SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                              void* recv_data, size_t recv_len) {
  tcp::Connection* send_conn = nullptr;
  tcp::Connection* recv_conn = nullptr;
  if (send_peer != -1) {
    HORO_RETURN_IF_ERROR(CheckDataPeer(send_peer, "SendRecv"));
    if (send_len > 0 && send_data == nullptr) return Status::InvalidArgument(Who() + ": SendRecv sends from null");
    if (send_len > 0) send_conn = data_[send_peer].get();
  }
  if (recv_peer != -1) {
    HORO_RETURN_IF_ERROR(CheckDataPeer(recv_peer, "SendRecv"));
    if (recv_len > 0 && recv_data == nullptr) return Status::InvalidArgument(Who() + ": SendRecv receives into null");
    if (recv_len > 0) recv_conn = data_[recv_peer].get();
  }
  if (send_conn == nullptr && recv_conn == nullptr) {
    return closed_ ? Status::ShutDown(Who() + ": SendRecv on a closed transport") : Status::OK();
  }
  return Transfer(send_conn, static_cast<const char*>(send_data), send_conn ? send_len : 0, recv_conn,
                  static_cast<char*>(recv_data), recv_conn ? recv_len : 0);
}

// Both directions are attempted on every pass, and poll() waits for whichever socket can move next,
// so a ring step where every rank sends and receives at once never waits on a full buffer. The
// no-progress clock restarts whenever any byte moves in either direction.
Status TcpTransport::Transfer(tcp::Connection* send_conn, const char* send_data, size_t send_len, tcp::Connection* recv_conn,
                              char* recv_data, size_t recv_len) {
  if (send_conn != nullptr && send_conn->broken()) return send_conn->broken_status();
  if (recv_conn != nullptr && recv_conn->broken()) return recv_conn->broken_status();
  const auto timeout = std::chrono::microseconds(static_cast<int64_t>(options_.data_timeout_seconds * 1e6));
  size_t sent = 0, received = 0;
  Clock::time_point last_progress = Clock::now();
  while (true) {
    bool progress = false;
    size_t moved = 0;
    int error = 0;
    if (sent < send_len) {
      tcp::Connection::Io io = send_conn->SendSome(send_data + sent, send_len - sent, &moved, &error);
      sent += moved;
      progress |= moved > 0;
      if (io != tcp::Connection::Io::kOk) return IoFailure(send_conn, "send", io, error, sent, send_len);
    }
    if (received < recv_len) {
      moved = 0;
      tcp::Connection::Io io = recv_conn->RecvSome(recv_data + received, recv_len - received, &moved, &error);
      received += moved;
      progress |= moved > 0;
      if (io != tcp::Connection::Io::kOk) return IoFailure(recv_conn, "recv", io, error, received, recv_len);
    }
    if (sent == send_len && received == recv_len) return Status::OK();

    Clock::time_point now = Clock::now();
    if (progress) last_progress = now;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(timeout - (now - last_progress));
    if (left.count() <= 0) return TimeoutFailure(send_conn, sent, send_len, recv_conn, received, recv_len);

    pollfd fds[2];
    nfds_t count = 0;
    if (sent < send_len) fds[count++] = {send_conn->fd(), POLLOUT, 0};
    if (received < recv_len) {
      if (count == 1 && recv_conn == send_conn) {
        fds[0].events |= POLLIN;
      } else {
        fds[count++] = {recv_conn->fd(), POLLIN, 0};
      }
    }
    int ready = ::poll(fds, count, static_cast<int>((left.count() + 999) / 1000));
    if (ready < 0 && errno != EINTR) {
      return Status::Internal(Who() + ": poll failed on the data plane: " + std::strerror(errno));
    }
  }
}

Status TcpTransport::IoFailure(tcp::Connection* conn, const char* direction, tcp::Connection::Io io, int error, size_t done,
                               size_t total) {
  const std::string peer = "rank " + std::to_string(conn->peer());
  if (closed_) return Status::ShutDown(Who() + ": transport closed during " + direction + " with " + peer);
  std::string reason = io == tcp::Connection::Io::kClosed ? "peer closed the connection" : std::strerror(error);
  Status status = Status::PeerLost(Who() + ": connection to " + peer + " lost during " + direction + ": " + reason +
                                   " (" + Progress(done, total, direction[0] == 's' ? "sent" : "received") + ")");
  conn->MarkBroken(status);
  return status;
}

Status TcpTransport::TimeoutFailure(tcp::Connection* send_conn, size_t sent, size_t send_len, tcp::Connection* recv_conn,
                                    size_t received, size_t recv_len) {
  std::string what;
  if (send_conn != nullptr) {
    what = "send to rank " + std::to_string(send_conn->peer()) + ": " + Progress(sent, send_len, "sent");
  }
  if (recv_conn != nullptr) {
    what += std::string(what.empty() ? "" : "; ") + "recv from rank " + std::to_string(recv_conn->peer()) + ": " +
            Progress(received, recv_len, "received");
  }
  Status status = Status::Timeout(Who() + ": no progress for " + Seconds(options_.data_timeout_seconds) + " (" +
                                  what + "); the byte stream is now out of step");
  // A message cut off in the middle leaves the stream unusable; later calls fail the same way.
  if (send_conn != nullptr) send_conn->MarkBroken(status);
  if (recv_conn != nullptr) recv_conn->MarkBroken(status);
  return status;
}

tcp::Connection* TcpTransport::ControlConnection(int peer) const {
  return options_.rank == 0 ? control_[peer].get() : control_[0].get();
}

Status TcpTransport::SendControl(int peer, const std::string& payload) {
  if (closed_) return Status::ShutDown(Who() + ": SendControl on a closed transport");
  if (!connected_) return Status::InvalidArgument(Who() + ": SendControl called before Connect succeeded");
  bool valid = options_.rank == 0 ? (peer > 0 && peer < options_.size) : peer == 0;
  if (!valid) {
    return Status::InvalidArgument(Who() + ": SendControl to rank " + std::to_string(peer) +
                                   ": rank 0 sends to ranks 1.." + std::to_string(options_.size - 1) +
                                   ", every other rank only to rank 0");
  }
  if (payload.size() > tcp::Connection::kMaxControlFrame) {
    return Status::InvalidArgument(Who() + ": control message of " + std::to_string(payload.size()) +
                                   " bytes exceeds the limit of " + std::to_string(tcp::Connection::kMaxControlFrame));
  }
  tcp::Connection* conn = ControlConnection(peer);
  std::lock_guard<std::mutex> lock(conn->send_mutex());
  if (conn->broken()) return conn->broken_status();
  uint8_t header[tcp::Connection::kControlHeaderSize];
  uint64_t length = payload.size();
  for (size_t i = 0; i < sizeof(header); ++i) header[i] = static_cast<uint8_t>(length >> (8 * i));
  uint8_t mac[tcp::Connection::kControlMacSize];
  conn->Seal(header, payload, mac);
  const size_t total = sizeof(header) + payload.size() + sizeof(mac);
  const auto timeout = std::chrono::microseconds(static_cast<int64_t>(options_.data_timeout_seconds * 1e6));
  size_t offset = 0;
  Clock::time_point last_progress = Clock::now();
  while (true) {
    size_t before = offset;
    int error = 0;
    tcp::Connection::Io io = conn->SendFrameSome(header, payload, mac, &offset, &error);
    if (io != tcp::Connection::Io::kOk) {
      if (closed_) return Status::ShutDown(Who() + ": transport closed while sending a control message");
      std::string reason = io == tcp::Connection::Io::kClosed ? "peer closed the connection" : std::strerror(error);
      Status status = Status::PeerLost(Who() + ": control connection to rank " + std::to_string(peer) +
                                       " lost during send: " + reason + " (" + Progress(offset, total, "sent") + ")");
      conn->MarkBroken(status);
      return status;
    }
    if (offset == total) return Status::OK();
    Clock::time_point now = Clock::now();
    if (offset > before) last_progress = now;
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(timeout - (now - last_progress));
    if (left.count() <= 0) {
      Status status = Status::Timeout(Who() + ": no progress for " + Seconds(options_.data_timeout_seconds) +
                                      " sending a control message to rank " + std::to_string(peer) + " (" +
                                      Progress(offset, total, "sent") + ")");
      conn->MarkBroken(status);
      return status;
    }
    HORO_RETURN_IF_ERROR(WaitControlSpace(conn, static_cast<int>((left.count() + 999) / 1000)));
  }
}

Status TcpTransport::WaitControlSpace(tcp::Connection* conn, int wait_ms) {
  std::vector<pollfd> fds = {{conn->fd(), POLLOUT, 0}};
  std::vector<int> peers = {-1};
  {
    std::lock_guard<std::mutex> lock(inbound_mutex_);
    for (int peer = 0; peer < options_.size; ++peer) {
      if (control_[peer] && !control_lost_[peer]) {
        fds.push_back({control_[peer]->fd(), POLLIN, 0});
        peers.push_back(peer);
      }
    }
  }
  if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
    if (errno == EINTR) return Status::OK();
    return Status::Internal(Who() + ": poll failed on the control plane: " + std::strerror(errno));
  }
  bool buffered = false;
  {
    std::lock_guard<std::mutex> lock(inbound_mutex_);
    const size_t before = pending_control_.size() + pending_lost_.size();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0 && !control_lost_[peers[i]]) ReadControl(peers[i], &pending_control_, &pending_lost_);
    }
    buffered = pending_control_.size() + pending_lost_.size() > before;
  }
  if (buffered) Wake();  // a PollControl on another thread may sleep on the sockets just read
  return Status::OK();
}

void TcpTransport::ReadControl(int peer, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) {
  int error = 0;
  tcp::Connection::Io io = control_[peer]->ReadFrames(messages, &error);
  if (io == tcp::Connection::Io::kOk) return;
  std::string reason = io == tcp::Connection::Io::kClosed ? "peer closed the connection"
                       : error < 0                   ? tcp::Connection::FrameFault(error)
                                                     : std::strerror(error);
  HORO_LOG(kDebug, options_.rank) << "control connection to rank " << peer << " lost: " << reason;
  if (io == tcp::Connection::Io::kError && error == tcp::Connection::kForgedFrame) {
    // Not a peer that went away: someone else wrote into the connection, or it was altered on the
    // way. Nothing more it brings can be trusted, so it is lost to this rank, which stops the job
    // as it would for a lost peer, but says why; it can still be written to, so that rank 0 can
    // tell that peer why the job stops.
    lost_reasons_[peer] = Who() + " stopped reading its control connection with rank " + std::to_string(peer) +
                          " (" + control_[peer]->peer_address() + "): " + reason;
    control_[peer]->ShutdownRead();
  } else {
    control_[peer]->Shutdown();
  }
  control_lost_[peer] = true;
  lost_peers->push_back(peer);
}

std::string TcpTransport::LostReason(int peer) const {
  std::lock_guard<std::mutex> lock(inbound_mutex_);
  auto it = lost_reasons_.find(peer);
  return it == lost_reasons_.end() ? "" : it->second;
}

bool TcpTransport::TakePending(std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) {
  if (pending_control_.empty() && pending_lost_.empty()) return false;
  for (ControlMessage& m : pending_control_) messages->push_back(std::move(m));
  lost_peers->insert(lost_peers->end(), pending_lost_.begin(), pending_lost_.end());
  pending_control_.clear();
  pending_lost_.clear();
  return true;
}

Status TcpTransport::PollControl(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) {
  std::lock_guard<std::mutex> lock(poll_mutex_);
  if (closed_) return Status::ShutDown(Who() + ": PollControl on a closed transport");
  if (!connected_) return Status::InvalidArgument(Who() + ": PollControl called before Connect succeeded");
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  while (true) {
    poll_fds_.clear();
    poll_peers_.clear();
    poll_fds_.push_back({close_fd_, POLLIN, 0});
    poll_peers_.push_back(-1);
    poll_fds_.push_back({wake_fd_, POLLIN, 0});
    poll_peers_.push_back(-1);
    {
      std::lock_guard<std::mutex> lock(inbound_mutex_);
      // What a waiting SendControl read comes first: it arrived before anything read from now on.
      if (TakePending(messages, lost_peers)) return Status::OK();
      for (int peer = 0; peer < options_.size; ++peer) {
        if (control_[peer] && !control_lost_[peer]) {
          poll_fds_.push_back({control_[peer]->fd(), POLLIN, 0});
          poll_peers_.push_back(peer);
        }
      }
    }
    int wait_ms = -1;
    if (timeout_ms >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now());
      wait_ms = left.count() <= 0 ? 0 : static_cast<int>((left.count() + 999) / 1000);
    }
    int ready = ::poll(poll_fds_.data(), poll_fds_.size(), wait_ms);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Status::Internal(Who() + ": poll failed on the control plane: " + std::strerror(errno));
    }
    if (closed_) return Status::ShutDown(Who() + ": transport closed during PollControl");
    bool returned_something = false;
    if (poll_fds_[1].revents != 0) {
      uint64_t count = 0;
      ssize_t ignored = ::read(wake_fd_, &count, sizeof(count));
      (void)ignored;
      returned_something = true;
    }
    {
      std::lock_guard<std::mutex> lock(inbound_mutex_);
      const size_t before = messages->size() + lost_peers->size();
      TakePending(messages, lost_peers);  // read by a SendControl during our poll(): older than what follows
      for (size_t i = 2; i < poll_fds_.size(); ++i) {
        const int peer = poll_peers_[i];
        if (poll_fds_[i].revents != 0 && !control_lost_[peer]) ReadControl(peer, messages, lost_peers);
      }
      returned_something |= messages->size() + lost_peers->size() > before;
    }
    if (returned_something) return Status::OK();
    if (timeout_ms >= 0 && Clock::now() >= deadline) return Status::OK();
  }
}

}  // namespace horo
