#include "transport/tcp/connection.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <set>
#include <utility>

namespace horo {
namespace tcp {
namespace {

// One send()/recv() moves at most this much: Linux caps a call near 2 GiB anyway, and this keeps
// every length well inside ssize_t.
constexpr size_t kMaxChunk = size_t{1} << 30;
constexpr size_t kControlReadChunk = 64 << 10;
constexpr int kMaxReadsPerCall = 64;

bool WouldBlock(int err) { return err == EAGAIN || err == EWOULDBLOCK; }

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

// A process forked from a rank (a DataLoader worker, a multiprocessing pool) inherits its sockets.
// Peers learn that a rank died from its sockets closing (ShmTransport::CheckHangUps, the TCP
// transport's hang-up checks), and a child holding copies would postpone that for as long as it
// lives, a hang when the child outlives the rank. So the child lets go of them at once: each
// descriptor of a live connection is pointed at /dev/null, which also keeps its number taken, so
// that nothing the child opens lands where the inherited connection objects still point.
// Process-wide state by nature (fork is): made once, never destroyed (a fork may run during exit),
// and its mutex is held across fork() so that the child finds it consistent.
struct ForkRegistry {
  std::mutex mutex;
  std::set<int> sockets;
  int null_fd = -1;  // opened in the parent: the child needs no open() that could fail
};
ForkRegistry* registry = nullptr;

void BeforeFork() { registry->mutex.lock(); }
void AfterForkInParent() { registry->mutex.unlock(); }
void AfterForkInChild() {
  // The child of a multithreaded process: no allocation and no other lock here.
  if (registry->null_fd >= 0) {
    for (int fd : registry->sockets) ::dup3(registry->null_fd, fd, O_CLOEXEC);
  }
  registry->mutex.unlock();
}

ForkRegistry& Registry() {
  static std::once_flag made;
  std::call_once(made, [] {
    registry = new ForkRegistry;
    registry->null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    ::pthread_atfork(BeforeFork, AfterForkInParent, AfterForkInChild);
  });
  return *registry;
}

void Track(int fd) {
  ForkRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.sockets.insert(fd);
}

// Closes fd under the registry's lock: a fork either sees it live (and the child lets go of it)
// or closed, never a number already reused for something else.
void CloseTracked(int fd) {
  ForkRegistry& r = Registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.sockets.erase(fd);
  ::close(fd);
}

}  // namespace

const char* ChannelName(ChannelKind kind) {
  return kind == ChannelKind::kControl ? "control" : "data";
}

const char* Connection::FrameFault(int error) {
  return error == kForgedFrame ? "a control frame failed authentication (forged, altered, replayed or out of order)"
                               : "it sent a corrupt frame header";
}

Connection::Connection(int fd, int peer, ChannelKind kind, std::string peer_address, const FrameKeys& keys)
    : fd_(fd),
      peer_(peer),
      kind_(kind),
      peer_address_(std::move(peer_address)),
      send_mac_(keys.send),
      receive_mac_(keys.receive) {
  if (fd_ >= 0) Track(fd_);
}

Connection::~Connection() {
  if (fd_ >= 0) CloseTracked(fd_);
}

void Connection::TuneEstablished(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  // Detect a vanished host (no FIN, no RST) on an idle connection within about two minutes.
  int idle_seconds = 60, interval_seconds = 10, probes = 6;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_seconds, sizeof(idle_seconds));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_seconds, sizeof(interval_seconds));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

void Connection::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

void Connection::ShutdownRead() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RD);
}

Connection::Io Connection::SendSome(const char* data, size_t len, size_t* moved, int* error) {
  size_t done = 0;
  while (done < len) {
    size_t chunk = len - done < kMaxChunk ? len - done : kMaxChunk;
    ssize_t n = ::send(fd_, data + done, chunk, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    *moved = done;
    if (n < 0 && WouldBlock(errno)) return Io::kOk;
    *error = n < 0 ? errno : 0;
    return (n < 0 && errno != EPIPE) ? Io::kError : Io::kClosed;
  }
  *moved = done;
  return Io::kOk;
}

Connection::Io Connection::RecvSome(char* data, size_t len, size_t* moved, int* error) {
  size_t done = 0;
  while (done < len) {
    size_t chunk = len - done < kMaxChunk ? len - done : kMaxChunk;
    ssize_t n = ::recv(fd_, data + done, chunk, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    *moved = done;
    if (n < 0 && WouldBlock(errno)) return Io::kOk;
    *error = n < 0 ? errno : 0;
    return n == 0 ? Io::kClosed : Io::kError;
  }
  *moved = done;
  return Io::kOk;
}

void Connection::FrameMac(HmacSha256 key, uint64_t sequence, const char* header, const char* payload,
                          size_t length, uint8_t* mac) {
  uint8_t counter[8];
  for (size_t i = 0; i < sizeof(counter); ++i) counter[i] = static_cast<uint8_t>(sequence >> (8 * i));
  key.Update(counter, sizeof(counter));
  key.Update(header, kControlHeaderSize);
  key.Update(payload, length);
  const Sha256Digest digest = key.Final();
  std::memcpy(mac, digest.data(), kControlMacSize);
}

void Connection::Seal(const uint8_t* header, const std::string& payload, uint8_t* mac) {
  FrameMac(send_mac_, send_sequence_++, reinterpret_cast<const char*>(header), payload.data(), payload.size(), mac);
}

Connection::Io Connection::SendFrameSome(const uint8_t* header, const std::string& payload, const uint8_t* mac,
                                         size_t* offset, int* error) {
  const iovec pieces[3] = {{const_cast<uint8_t*>(header), kControlHeaderSize},
                           {const_cast<char*>(payload.data()), payload.size()},
                           {const_cast<uint8_t*>(mac), kControlMacSize}};
  const size_t total = kControlHeaderSize + payload.size() + kControlMacSize;
  while (*offset < total) {
    // The rest of the frame from *offset: the pieces not yet sent, the first one partly.
    iovec iov[3];
    int count = 0;
    size_t start = 0;
    for (const iovec& piece : pieces) {
      const size_t end = start + piece.iov_len;
      if (*offset < end) {
        const size_t skip = *offset > start ? *offset - start : 0;
        const size_t left = piece.iov_len - skip;
        iov[count].iov_base = static_cast<char*>(piece.iov_base) + skip;
        iov[count].iov_len = left < kMaxChunk ? left : kMaxChunk;
        ++count;
      }
      start = end;
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    ssize_t n = ::sendmsg(fd_, &message, MSG_NOSIGNAL);
    if (n > 0) {
      *offset += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && WouldBlock(errno)) return Io::kOk;
    *error = n < 0 ? errno : 0;
    return (n < 0 && errno != EPIPE) ? Io::kError : Io::kClosed;
  }
  return Io::kOk;
}

int Connection::ExtractFrames(std::vector<ControlMessage>* messages) {
  while (rx_end_ - rx_begin_ >= kControlHeaderSize) {
    const char* header = rx_.data() + rx_begin_;
    uint64_t length = LoadLittleEndian64(header);
    if (length > kMaxControlFrame) return kCorruptLength;
    if (rx_end_ - rx_begin_ - kControlHeaderSize < length + kControlMacSize) break;  // incomplete: keep for later
    const char* payload = header + kControlHeaderSize;
    uint8_t expected[kControlMacSize];
    FrameMac(receive_mac_, receive_sequence_, header, payload, static_cast<size_t>(length), expected);
    if (!ConstantTimeEqual(expected, payload + length, kControlMacSize)) return kForgedFrame;
    ++receive_sequence_;
    ControlMessage message;
    message.peer = peer_;
    message.payload.assign(payload, static_cast<size_t>(length));
    messages->push_back(std::move(message));
    rx_begin_ += kControlHeaderSize + static_cast<size_t>(length) + kControlMacSize;
  }
  if (rx_begin_ == rx_end_) rx_begin_ = rx_end_ = 0;
  return 0;
}

Connection::Io Connection::ReadFrames(std::vector<ControlMessage>* messages, int* error) {
  // A bounded number of reads per call keeps PollControl responsive to a peer that never stops
  // sending; poll() reports the rest at once.
  for (int reads = 0; reads < kMaxReadsPerCall; ++reads) {
    if (rx_.size() - rx_end_ < kControlReadChunk) {
      if (rx_begin_ > 0) {
        std::memmove(rx_.data(), rx_.data() + rx_begin_, rx_end_ - rx_begin_);
        rx_end_ -= rx_begin_;
        rx_begin_ = 0;
      }
      if (rx_.size() - rx_end_ < kControlReadChunk) rx_.resize(rx_end_ + kControlReadChunk);
    }
    ssize_t n = ::recv(fd_, rx_.data() + rx_end_, rx_.size() - rx_end_, 0);
    if (n > 0) {
      rx_end_ += static_cast<size_t>(n);
      const int fault = ExtractFrames(messages);
      if (fault != 0) {
        *error = fault;
        return Io::kError;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && WouldBlock(errno)) return Io::kOk;
    *error = n < 0 ? errno : 0;
    return n == 0 ? Io::kClosed : Io::kError;
  }
  return Io::kOk;
}

}  // namespace tcp
}  // namespace horo
