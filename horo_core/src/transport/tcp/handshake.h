// Handshake: mutual authentication of one freshly opened TCP socket with the job's shared secret,
// run as a non-blocking state machine so that one thread can authenticate many sockets at once
// while strangers that stall or send garbage cost nothing but a slot.
//
// The acceptor (lower rank, the listening side) speaks first; every message has a fixed size, so
// an unauthenticated peer can never make us read more than 80 bytes:
//
//   A -> C  greeting (40 B): "HOROTCP1" | nonce_a[32]
//   C -> A  hello    (80 B): header[16] | nonce_c[32] | HMAC(secret, "horo-tcp-v1/connector" |
//                            nonce_a | header | nonce_c)
//           header = connector_rank | acceptor_rank | channel_kind | world_size (u32 big-endian)
//   A -> C  confirm  (32 B): HMAC(secret, "horo-tcp-v1/acceptor" | nonce_a | header | nonce_c)
//
// Each side's MAC covers the other side's fresh random nonce (no replay) and a direction label (no
// reflection); the header binds the ranks, the channel and the world size. MACs are compared in
// constant time. The acceptor checks the MAC before looking at any header field. The keys of the
// connection's control frames come from the same inputs under two more labels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/tcp/connection.h"

namespace horo {

class Handshake {
 public:
  enum class Outcome {
    kInProgress,  // wants events() on fd()
    kDone,        // authenticated: take the socket with ReleaseFd()
    kRetry,       // connector only: the acceptor dropped us before greeting; dial again
    kFailed,      // see failure(); code kAuth when credentials were wrong or rejected
  };
  // Acceptor only: asked once the hello's MAC is valid; returns "" to admit (and reserve the
  // slot of) peer_rank's channel, else why the connection is refused.
  using AdmitFn = std::function<std::string(int peer_rank, tcp::ChannelKind channel)>;

  struct Identity {
    const std::string* secret = nullptr;
    int rank = 0;
    int size = 1;
  };

  // Takes ownership of fd. peer_address is the socket's remote address, for messages.
  static std::unique_ptr<Handshake> ForAcceptor(int fd, std::string peer_address, const Identity& self,
                                                AdmitFn admit);
  // peer_rank / channel: whom the connector believes it dialed and what for.
  static std::unique_ptr<Handshake> ForConnector(int fd, std::string peer_address, const Identity& self,
                                                 int peer_rank, tcp::ChannelKind channel);
  ~Handshake();
  Handshake(const Handshake&) = delete;
  Handshake& operator=(const Handshake&) = delete;

  // Creates the nonce and queues the first message. Call once before Step().
  Status Start();
  // Moves whatever bytes the socket allows now and advances the protocol.
  Outcome Step();
  // poll() events the state machine waits for.
  short events() const;

  int fd() const { return fd_; }
  int ReleaseFd();
  int peer_rank() const { return peer_rank_; }
  tcp::ChannelKind channel() const { return channel_; }
  const std::string& peer_address() const { return peer_address_; }
  bool admitted() const { return admitted_; }
  const Status& failure() const { return failure_; }
  // After kDone: this end's keys of the connection's control frames (connection.h), MACs of both
  // nonces and the header under the secret, one label per sending side.
  tcp::FrameKeys frame_keys() const;

  static constexpr size_t kNonceSize = 32;
  static constexpr size_t kMacSize = 32;
  static constexpr size_t kHeaderSize = 16;
  static constexpr size_t kGreetingSize = 8 + kNonceSize;
  static constexpr size_t kHelloSize = kHeaderSize + kNonceSize + kMacSize;
  static constexpr size_t kConfirmSize = kMacSize;

 private:
  enum class Stage { kSendGreeting, kRecvGreeting, kSendHello, kRecvHello, kSendConfirm, kRecvConfirm, kDone };

  Handshake() = default;
  void Expect(size_t bytes);
  void Queue(const uint8_t* data, size_t bytes);
  Outcome Fail(Status status);
  Outcome OnPeerClosed(const std::string& what);
  Outcome OnGreeting();
  Outcome OnHello();
  Outcome OnConfirm();
  void ComputeMac(const char* label, const uint8_t* header, uint8_t* mac) const;
  std::string Describe() const;

  int fd_ = -1;
  bool acceptor_ = false;
  std::string peer_address_;
  Identity self_;
  AdmitFn admit_;
  int peer_rank_ = -1;
  tcp::ChannelKind channel_ = tcp::ChannelKind::kData;
  bool admitted_ = false;
  Stage stage_ = Stage::kDone;
  Status failure_;

  uint8_t nonce_acceptor_[kNonceSize] = {};
  uint8_t nonce_connector_[kNonceSize] = {};
  uint8_t header_[kHeaderSize] = {};
  uint8_t out_[kHelloSize] = {};
  size_t out_len_ = 0;
  size_t out_sent_ = 0;
  uint8_t in_[kHelloSize] = {};
  size_t in_need_ = 0;
  size_t in_have_ = 0;
};

}  // namespace horo
