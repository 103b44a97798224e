#include "transport/tcp/handshake.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "common/hmac.h"

namespace horo {
namespace {

constexpr char kMagic[8] = {'H', 'O', 'R', 'O', 'T', 'C', 'P', '1'};
constexpr char kConnectorLabel[] = "horo-tcp-v1/connector";
constexpr char kAcceptorLabel[] = "horo-tcp-v1/acceptor";
constexpr char kConnectorFramesLabel[] = "horo-tcp-v1/frames-from-connector";
constexpr char kAcceptorFramesLabel[] = "horo-tcp-v1/frames-from-acceptor";

void StoreBigEndian32(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

uint32_t LoadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

std::unique_ptr<Handshake> Handshake::ForAcceptor(int fd, std::string peer_address, const Identity& self,
                                                  AdmitFn admit) {
  std::unique_ptr<Handshake> handshake(new Handshake());
  handshake->fd_ = fd;
  handshake->acceptor_ = true;
  handshake->peer_address_ = std::move(peer_address);
  handshake->self_ = self;
  handshake->admit_ = std::move(admit);
  return handshake;
}

std::unique_ptr<Handshake> Handshake::ForConnector(int fd, std::string peer_address, const Identity& self,
                                                   int peer_rank, tcp::ChannelKind channel) {
  std::unique_ptr<Handshake> handshake(new Handshake());
  handshake->fd_ = fd;
  handshake->acceptor_ = false;
  handshake->peer_address_ = std::move(peer_address);
  handshake->self_ = self;
  handshake->peer_rank_ = peer_rank;
  handshake->channel_ = channel;
  return handshake;
}

Handshake::~Handshake() {
  if (fd_ >= 0) ::close(fd_);
}

int Handshake::ReleaseFd() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

Status Handshake::Start() {
  if (acceptor_) {
    HORO_RETURN_IF_ERROR(SecureRandomBytes(nonce_acceptor_, kNonceSize));
    uint8_t greeting[kGreetingSize];
    std::memcpy(greeting, kMagic, sizeof(kMagic));
    std::memcpy(greeting + sizeof(kMagic), nonce_acceptor_, kNonceSize);
    Queue(greeting, sizeof(greeting));
    stage_ = Stage::kSendGreeting;
  } else {
    HORO_RETURN_IF_ERROR(SecureRandomBytes(nonce_connector_, kNonceSize));
    Expect(kGreetingSize);
    stage_ = Stage::kRecvGreeting;
  }
  return Status::OK();
}

void Handshake::Expect(size_t bytes) {
  in_need_ = bytes;
  in_have_ = 0;
}

void Handshake::Queue(const uint8_t* data, size_t bytes) {
  std::memcpy(out_, data, bytes);
  out_len_ = bytes;
  out_sent_ = 0;
}

short Handshake::events() const {
  switch (stage_) {
    case Stage::kSendGreeting:
    case Stage::kSendHello:
    case Stage::kSendConfirm:
      return POLLOUT;
    default:
      return POLLIN;
  }
}

std::string Handshake::Describe() const {
  if (acceptor_) {
    std::string text = "connection from " + peer_address_;
    if (peer_rank_ >= 0) text += " (rank " + std::to_string(peer_rank_) + ", " + ChannelName(channel_) + ")";
    return text;
  }
  return "rank " + std::to_string(peer_rank_) + " at " + peer_address_ + " (" + ChannelName(channel_) +
         " channel)";
}

Handshake::Outcome Handshake::Fail(Status status) {
  failure_ = std::move(status);
  stage_ = Stage::kDone;
  return Outcome::kFailed;
}

Handshake::Outcome Handshake::OnPeerClosed(const std::string& what) {
  if (acceptor_) {
    return Fail(Status::PeerLost(Describe() + " closed before authenticating: " + what));
  }
  if (stage_ == Stage::kRecvGreeting) {
    // Dropped before the acceptor said anything (it may have been shedding load): dial again.
    failure_ = Status::PeerLost(Describe() + " closed the connection before greeting: " + what);
    stage_ = Stage::kDone;
    return Outcome::kRetry;
  }
  // A rank that rejects the credentials closes without a word, as one that dies does.
  return Fail(Status::Auth(Describe() + " closed the connection during authentication (" + what +
                           "): it rejected our credentials (wrong secret, or a rank/world-size mismatch: see "
                           "that rank's log), or it exited"));
}

void Handshake::ComputeMac(const char* label, const uint8_t* header, uint8_t* mac) const {
  HmacSha256 hmac(*self_.secret);
  hmac.Update(label, std::strlen(label));
  hmac.Update(nonce_acceptor_, kNonceSize);
  hmac.Update(header, kHeaderSize);
  hmac.Update(nonce_connector_, kNonceSize);
  Sha256Digest digest = hmac.Final();
  std::memcpy(mac, digest.data(), kMacSize);
}

tcp::FrameKeys Handshake::frame_keys() const {
  uint8_t from_connector[kMacSize], from_acceptor[kMacSize];
  ComputeMac(kConnectorFramesLabel, header_, from_connector);
  ComputeMac(kAcceptorFramesLabel, header_, from_acceptor);
  std::string connector_key(reinterpret_cast<const char*>(from_connector), kMacSize);
  std::string acceptor_key(reinterpret_cast<const char*>(from_acceptor), kMacSize);
  if (acceptor_) return {std::move(acceptor_key), std::move(connector_key)};
  return {std::move(connector_key), std::move(acceptor_key)};
}

Handshake::Outcome Handshake::OnGreeting() {
  if (std::memcmp(in_, kMagic, sizeof(kMagic)) != 0) {
    return Fail(Status::Auth(Describe() + " did not answer with a horo greeting: is that address a rank of "
                             "this job?"));
  }
  std::memcpy(nonce_acceptor_, in_ + sizeof(kMagic), kNonceSize);
  StoreBigEndian32(static_cast<uint32_t>(self_.rank), header_);
  StoreBigEndian32(static_cast<uint32_t>(peer_rank_), header_ + 4);
  StoreBigEndian32(static_cast<uint32_t>(channel_), header_ + 8);
  StoreBigEndian32(static_cast<uint32_t>(self_.size), header_ + 12);
  uint8_t hello[kHelloSize];
  std::memcpy(hello, header_, kHeaderSize);
  std::memcpy(hello + kHeaderSize, nonce_connector_, kNonceSize);
  ComputeMac(kConnectorLabel, header_, hello + kHeaderSize + kNonceSize);
  Queue(hello, sizeof(hello));
  stage_ = Stage::kSendHello;
  return Outcome::kInProgress;
}

Handshake::Outcome Handshake::OnHello() {
  std::memcpy(header_, in_, kHeaderSize);
  std::memcpy(nonce_connector_, in_ + kHeaderSize, kNonceSize);
  uint8_t expected[kMacSize];
  ComputeMac(kConnectorLabel, header_, expected);
  if (!ConstantTimeEqual(expected, in_ + kHeaderSize + kNonceSize, kMacSize)) {
    return Fail(Status::Auth(Describe() + " failed authentication: wrong secret?"));
  }
  // Authenticated: the header fields can be trusted to come from a holder of the secret.
  uint32_t connector_rank = LoadBigEndian32(header_);
  uint32_t acceptor_rank = LoadBigEndian32(header_ + 4);
  uint32_t channel = LoadBigEndian32(header_ + 8);
  uint32_t world_size = LoadBigEndian32(header_ + 12);
  std::string prefix = Describe() + " (claims rank " + std::to_string(connector_rank) + ")";
  if (world_size != static_cast<uint32_t>(self_.size)) {
    return Fail(Status::Mismatch(prefix + " has world size " + std::to_string(world_size) + ", this job has " +
                                 std::to_string(self_.size)));
  }
  if (acceptor_rank != static_cast<uint32_t>(self_.rank)) {
    return Fail(Status::Mismatch(prefix + " meant to reach rank " + std::to_string(acceptor_rank) +
                                 " but this is rank " + std::to_string(self_.rank) +
                                 ": are the published addresses in rank order?"));
  }
  if (connector_rank >= static_cast<uint32_t>(self_.size) ||
      (channel != static_cast<uint32_t>(tcp::ChannelKind::kData) && channel != static_cast<uint32_t>(tcp::ChannelKind::kControl))) {
    return Fail(Status::Mismatch(prefix + " sent an invalid rank or channel kind " + std::to_string(channel)));
  }
  peer_rank_ = static_cast<int>(connector_rank);
  channel_ = static_cast<tcp::ChannelKind>(channel);
  std::string refusal = admit_(peer_rank_, channel_);
  if (!refusal.empty()) return Fail(Status::Mismatch(Describe() + " refused: " + refusal));
  admitted_ = true;
  uint8_t confirm[kConfirmSize];
  ComputeMac(kAcceptorLabel, header_, confirm);
  Queue(confirm, sizeof(confirm));
  stage_ = Stage::kSendConfirm;
  return Outcome::kInProgress;
}

Handshake::Outcome Handshake::OnConfirm() {
  uint8_t expected[kMacSize];
  ComputeMac(kAcceptorLabel, header_, expected);
  if (!ConstantTimeEqual(expected, in_, kMacSize)) {
    return Fail(Status::Auth(Describe() + " failed authentication: its answer does not match our secret "
                             "(wrong secret?)"));
  }
  stage_ = Stage::kDone;
  return Outcome::kDone;
}

Handshake::Outcome Handshake::Step() {
  while (true) {
    switch (stage_) {
      case Stage::kSendGreeting:
      case Stage::kSendHello:
      case Stage::kSendConfirm: {
        while (out_sent_ < out_len_) {
          ssize_t n = ::send(fd_, out_ + out_sent_, out_len_ - out_sent_, MSG_NOSIGNAL);
          if (n > 0) {
            out_sent_ += static_cast<size_t>(n);
          } else if (n < 0 && errno == EINTR) {
            continue;
          } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return Outcome::kInProgress;
          } else {
            return OnPeerClosed(n < 0 ? std::strerror(errno) : "send returned 0");
          }
        }
        if (stage_ == Stage::kSendGreeting) {
          Expect(kHelloSize);
          stage_ = Stage::kRecvHello;
        } else if (stage_ == Stage::kSendHello) {
          Expect(kConfirmSize);
          stage_ = Stage::kRecvConfirm;
        } else {
          stage_ = Stage::kDone;
          return Outcome::kDone;
        }
        break;
      }
      case Stage::kRecvGreeting:
      case Stage::kRecvHello:
      case Stage::kRecvConfirm: {
        // Never read past the fixed message size: an unauthenticated peer gets no say in how much.
        while (in_have_ < in_need_) {
          ssize_t n = ::recv(fd_, in_ + in_have_, in_need_ - in_have_, 0);
          if (n > 0) {
            in_have_ += static_cast<size_t>(n);
          } else if (n < 0 && errno == EINTR) {
            continue;
          } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            return Outcome::kInProgress;
          } else {
            return OnPeerClosed(n == 0 ? "peer closed the connection" : std::strerror(errno));
          }
        }
        Outcome outcome = stage_ == Stage::kRecvGreeting ? OnGreeting()
                          : stage_ == Stage::kRecvHello  ? OnHello()
                                                         : OnConfirm();
        if (outcome != Outcome::kInProgress) return outcome;
        break;
      }
      case Stage::kDone:
        return failure_.ok() ? Outcome::kDone : Outcome::kFailed;
    }
  }
}

}  // namespace horo
