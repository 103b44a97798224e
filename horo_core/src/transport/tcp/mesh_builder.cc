#include "transport/tcp/mesh_builder.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/logging.h"

namespace horo {
namespace {

constexpr int kMaxBackoffMs = 500;
constexpr int kMaxAcceptsPerWakeup = 64;

int MillisecondsUntil(std::chrono::steady_clock::time_point when) {
  auto left = std::chrono::duration_cast<std::chrono::microseconds>(when - std::chrono::steady_clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((left.count() + 999) / 1000, 1 << 30));
}

std::string SlotName(int peer, tcp::ChannelKind channel) {
  return "rank " + std::to_string(peer) + " (" + ChannelName(channel) + ")";
}

}  // namespace

MeshBuilder::MeshBuilder(const TcpOptions& options, int listen_fd, int close_fd)
    : options_(options), listen_fd_(listen_fd), close_fd_(close_fd) {
  identity_.secret = &options_.secret;
  identity_.rank = options_.rank;
  identity_.size = options_.size;
}

MeshBuilder::~MeshBuilder() {
  for (Dial& dial : dials_) {
    if (dial.fd >= 0) ::close(dial.fd);
  }
}

MeshBuilder::SlotState& MeshBuilder::Slot(int peer, tcp::ChannelKind channel) {
  return channel == tcp::ChannelKind::kData ? data_slots_[peer] : control_slots_[peer];
}

Status MeshBuilder::ResolveDials(const std::vector<std::string>& addresses) {
  auto add = [&](int peer, tcp::ChannelKind channel) -> Status {
    Dial dial;
    dial.peer = peer;
    dial.channel = channel;
    dial.address_text = addresses[peer];
    std::string host;
    int port = 0;
    Status st = SocketAddress::SplitHostPort(addresses[peer], &host, &port);
    if (st.ok()) st = SocketAddress::Resolve(host, port, /*passive=*/false, &dial.addresses);
    if (!st.ok()) {
      return Status::InvalidArgument("rank " + std::to_string(options_.rank) + ": address of rank " +
                                     std::to_string(peer) + ": " + st.message());
    }
    dial.retry_at = Clock::now();
    dials_.push_back(std::move(dial));
    return Status::OK();
  };
  for (int peer = 0; peer < options_.rank; ++peer) HORO_RETURN_IF_ERROR(add(peer, tcp::ChannelKind::kData));
  if (options_.rank > 0) HORO_RETURN_IF_ERROR(add(0, tcp::ChannelKind::kControl));
  return Status::OK();
}

Status MeshBuilder::Run(const std::vector<std::string>& addresses, std::vector<std::unique_ptr<tcp::Connection>>* data,
                        std::vector<std::unique_ptr<tcp::Connection>>* control) {
  const Clock::time_point deadline =
      Clock::now() + std::chrono::microseconds(static_cast<int64_t>(options_.connect_timeout_seconds * 1e6));
  data_ = data;
  control_ = control;
  data->clear();
  control->clear();
  data->resize(options_.size);
  control->resize(options_.size);
  data_slots_.assign(options_.size, SlotState::kNotExpected);
  control_slots_.assign(options_.size, SlotState::kNotExpected);
  for (int peer = options_.rank + 1; peer < options_.size; ++peer) data_slots_[peer] = SlotState::kWaiting;
  if (options_.rank == 0) {
    for (int peer = 1; peer < options_.size; ++peer) control_slots_[peer] = SlotState::kWaiting;
  }
  HORO_RETURN_IF_ERROR(ResolveDials(addresses));

  // What each pollfd belongs to, with the index into dials_ or accepted_.
  enum class Owner { kCloseFd, kListener, kDial, kAccepted };
  std::vector<pollfd> fds;
  std::vector<std::pair<Owner, size_t>> owners;
  while (!Complete()) {
    Clock::time_point now = Clock::now();
    if (now >= deadline) return DeadlineFailure();
    for (Dial& dial : dials_) {
      if (!dial.done && dial.fd < 0 && !dial.handshake && dial.retry_at <= now) HORO_RETURN_IF_ERROR(StartDial(&dial));
    }
    if (Complete()) break;

    fds.clear();
    owners.clear();
    Clock::time_point wake_at = deadline;
    fds.push_back({close_fd_, POLLIN, 0});
    owners.emplace_back(Owner::kCloseFd, 0);
    bool accepting = std::count(data_slots_.begin(), data_slots_.end(), SlotState::kWaiting) +
                         std::count(control_slots_.begin(), control_slots_.end(), SlotState::kWaiting) > 0;
    if (accepting) {
      fds.push_back({listen_fd_, POLLIN, 0});
      owners.emplace_back(Owner::kListener, 0);
    }
    for (size_t i = 0; i < dials_.size(); ++i) {
      Dial& dial = dials_[i];
      if (dial.done) continue;
      if (dial.fd >= 0) {
        fds.push_back({dial.fd, POLLOUT, 0});
      } else if (dial.handshake) {
        fds.push_back({dial.handshake->fd(), dial.handshake->events(), 0});
      } else {
        wake_at = std::min(wake_at, dial.retry_at);
        continue;
      }
      owners.emplace_back(Owner::kDial, i);
    }
    for (size_t i = 0; i < accepted_.size(); ++i) {
      fds.push_back({accepted_[i]->fd(), accepted_[i]->events(), 0});
      owners.emplace_back(Owner::kAccepted, i);
    }

    int ready = ::poll(fds.data(), fds.size(), MillisecondsUntil(wake_at));
    if (ready < 0) {
      if (errno == EINTR) continue;
      return Status::Internal("rank " + std::to_string(options_.rank) + ": poll failed while connecting: " +
                              std::strerror(errno));
    }
    if (ready == 0) continue;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const size_t index = owners[k].second;
      switch (owners[k].first) {
        case Owner::kCloseFd:
          return Status::ShutDown("rank " + std::to_string(options_.rank) + ": transport closed while connecting");
        case Owner::kListener:
          HORO_RETURN_IF_ERROR(AcceptNew());
          break;
        case Owner::kDial:
          HORO_RETURN_IF_ERROR(AdvanceDial(&dials_[index]));
          break;
        case Owner::kAccepted:
          if (accepted_[index]) AdvanceAccepted(&accepted_[index]);
          break;
      }
    }
    accepted_.erase(std::remove(accepted_.begin(), accepted_.end(), nullptr), accepted_.end());
  }
  accepted_.clear();  // strangers still mid-handshake are dropped with the builder
  return Status::OK();
}

bool MeshBuilder::Complete() const {
  for (const Dial& dial : dials_) {
    if (!dial.done) return false;
  }
  for (int peer = 0; peer < options_.size; ++peer) {
    if (data_slots_[peer] == SlotState::kWaiting || data_slots_[peer] == SlotState::kClaimed) return false;
    if (control_slots_[peer] == SlotState::kWaiting || control_slots_[peer] == SlotState::kClaimed) return false;
  }
  return true;
}

Status MeshBuilder::StartDial(Dial* dial) {
  const SocketAddress& address = dial->addresses[dial->attempts++ % dial->addresses.size()];
  int fd = ::socket(address.family(), SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    return Status::Internal("rank " + std::to_string(options_.rank) + ": cannot create a socket to reach rank " +
                            std::to_string(dial->peer) + ": " + std::strerror(errno));
  }
  int rc;
  do {
    rc = ::connect(fd, address.get(), address.length());
  } while (rc < 0 && errno == EINTR);
  if (rc == 0 || errno == EINPROGRESS) {
    dial->fd = fd;
    return rc == 0 ? AdvanceDial(dial) : Status::OK();
  }
  std::string error = std::strerror(errno);
  ::close(fd);
  ScheduleRetry(dial, error);
  return Status::OK();
}

void MeshBuilder::ScheduleRetry(Dial* dial, const std::string& error) {
  if (dial->fd >= 0) ::close(dial->fd);
  dial->fd = -1;
  dial->handshake.reset();
  dial->last_error = error;
  dial->retry_at = Clock::now() + std::chrono::milliseconds(dial->backoff_ms);
  dial->backoff_ms = std::min(dial->backoff_ms * 2, kMaxBackoffMs);
  HORO_LOG(kDebug, options_.rank) << "connecting to rank " << dial->peer << " at " << dial->address_text << " ("
                                  << ChannelName(dial->channel) << "): " << error << "; retrying";
}

Status MeshBuilder::AdvanceDial(Dial* dial) {
  if (dial->fd >= 0) {  // connect() in progress
    int error = 0;
    socklen_t length = sizeof(error);
    if (::getsockopt(dial->fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error == EINPROGRESS || error == EALREADY) return Status::OK();
    if (error != 0) {
      ScheduleRetry(dial, std::strerror(error));
      return Status::OK();
    }
    int fd = dial->fd;
    dial->fd = -1;
    dial->handshake = Handshake::ForConnector(fd, SocketAddress::OfSocket(fd, true).ToString(), identity_,
                                              dial->peer, dial->channel);
    HORO_RETURN_IF_ERROR(dial->handshake->Start());
  }
  switch (dial->handshake->Step()) {
    case Handshake::Outcome::kInProgress:
      return Status::OK();
    case Handshake::Outcome::kDone:
      Install(*dial->handshake, dial->handshake->ReleaseFd(), dial->peer, dial->channel);
      dial->handshake.reset();
      dial->done = true;
      return Status::OK();
    case Handshake::Outcome::kRetry:
      ScheduleRetry(dial, dial->handshake->failure().message());
      return Status::OK();
    case Handshake::Outcome::kFailed:
      break;
  }
  const Status& failure = dial->handshake->failure();
  return Status(failure.code(), "rank " + std::to_string(options_.rank) + ": " + failure.message());
}

Status MeshBuilder::AcceptNew() {
  for (int i = 0; i < kMaxAcceptsPerWakeup; ++i) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        return Status::Internal("rank " + std::to_string(options_.rank) + ": cannot accept connections: " +
                                std::strerror(errno));
      }
      HORO_LOG(kWarning, options_.rank) << "accept failed: " << std::strerror(errno);
      return Status::OK();
    }
    size_t pending = accepted_.size() - std::count(accepted_.begin(), accepted_.end(), nullptr);
    if (pending >= kMaxPendingAccepts) {
      // Shed the oldest stranger that has not proven the secret yet (reset, not erased: Run() is
      // iterating over indices into accepted_).
      auto oldest = std::find_if(accepted_.begin(), accepted_.end(),
                                 [](const std::unique_ptr<Handshake>& h) { return h && !h->admitted(); });
      if (oldest != accepted_.end()) {
        HORO_LOG(kWarning, options_.rank) << "too many unauthenticated connections; dropping the one from "
                                          << (*oldest)->peer_address();
        oldest->reset();
      }
    }
    std::unique_ptr<Handshake> handshake = Handshake::ForAcceptor(
        fd, SocketAddress::OfSocket(fd, true).ToString(), identity_,
        [this](int peer, tcp::ChannelKind channel) { return Admit(peer, channel); });
    HORO_RETURN_IF_ERROR(handshake->Start());
    AdvanceAccepted(&handshake);
    if (handshake) accepted_.push_back(std::move(handshake));
  }
  return Status::OK();
}

std::string MeshBuilder::Admit(int peer, tcp::ChannelKind channel) {
  SlotState& slot = Slot(peer, channel);
  switch (slot) {
    case SlotState::kNotExpected:
      return "rank " + std::to_string(options_.rank) + " does not accept a " + ChannelName(channel) +
             " connection from rank " + std::to_string(peer);
    case SlotState::kClaimed:
    case SlotState::kDone:
      return "duplicate " + std::string(ChannelName(channel)) + " connection from rank " + std::to_string(peer) +
             " (two processes started as rank " + std::to_string(peer) + "?)";
    case SlotState::kWaiting:
      slot = SlotState::kClaimed;
      return "";
  }
  return "internal error";
}

void MeshBuilder::AdvanceAccepted(std::unique_ptr<Handshake>* handshake) {
  Handshake& h = **handshake;
  switch (h.Step()) {
    case Handshake::Outcome::kInProgress:
      return;
    case Handshake::Outcome::kDone:
      Slot(h.peer_rank(), h.channel()) = SlotState::kDone;
      Install(h, h.ReleaseFd(), h.peer_rank(), h.channel());
      break;
    case Handshake::Outcome::kRetry:
    case Handshake::Outcome::kFailed:
      if (h.admitted()) Slot(h.peer_rank(), h.channel()) = SlotState::kWaiting;
      if (h.failure().code() == HORO_ERR_PEER_LOST) {
        HORO_LOG(kDebug, options_.rank) << h.failure().message();
      } else {
        HORO_LOG(kWarning, options_.rank) << h.failure().message();
        last_rejection_ = h.failure();
      }
      break;
  }
  handshake->reset();
}

void MeshBuilder::Install(const Handshake& done, int fd, int peer, tcp::ChannelKind channel) {
  tcp::Connection::TuneEstablished(fd);
  const std::string& peer_address = done.peer_address();
  auto connection = std::make_unique<tcp::Connection>(
      fd, peer, channel, peer_address, channel == tcp::ChannelKind::kControl ? done.frame_keys() : tcp::FrameKeys{});
  HORO_LOG(kDebug, options_.rank) << "authenticated " << ChannelName(channel) << " connection with rank " << peer
                                  << " at " << peer_address;
  if (channel == tcp::ChannelKind::kData) {
    (*data_)[peer] = std::move(connection);
  } else {
    (*control_)[peer] = std::move(connection);
  }
}

Status MeshBuilder::DeadlineFailure() const {
  std::string missing;
  auto append = [&missing](const std::string& item) { missing += (missing.empty() ? "" : ", ") + item; };
  for (int peer = 0; peer < options_.size; ++peer) {
    if (data_slots_[peer] == SlotState::kWaiting || data_slots_[peer] == SlotState::kClaimed) {
      append("a connection from " + SlotName(peer, tcp::ChannelKind::kData));
    }
    if (control_slots_[peer] == SlotState::kWaiting || control_slots_[peer] == SlotState::kClaimed) {
      append("a connection from " + SlotName(peer, tcp::ChannelKind::kControl));
    }
  }
  for (const Dial& dial : dials_) {
    if (!dial.done) {
      append("reaching " + SlotName(dial.peer, dial.channel) + " at " + dial.address_text + " (last error: " +
             dial.last_error + ")");
    }
  }
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%g", options_.connect_timeout_seconds);
  std::string where = "rank " + std::to_string(options_.rank) + ": ";
  std::string summary = "mesh not complete after " + std::string(seconds) + " s; still waiting for " + missing;
  bool waiting_for_incoming = false;
  for (int peer = 0; peer < options_.size; ++peer) {
    waiting_for_incoming |= data_slots_[peer] == SlotState::kWaiting || control_slots_[peer] == SlotState::kWaiting;
  }
  if (!last_rejection_.ok() && waiting_for_incoming) {
    return Status(last_rejection_.code(), where + last_rejection_.message() + "; " + summary);
  }
  return Status::Timeout(where + summary);
}

}  // namespace horo
