// MeshBuilder: the Connect() phase of TcpTransport, as one poll() loop over the listening socket,
// the sockets this rank dials and the sockets it accepted, so that no peer, slow or hostile, can
// stall the others.
//
// Who connects to whom: the higher rank dials the lower one, for the data channel of every pair,
// and every rank r > 0 dials rank 0 once more for its control channel. A rank therefore accepts
// data connections from every higher rank (and rank 0 control connections from everyone).
//
// Dialing retries (refused, unreachable, dropped before the greeting) with a capped backoff until
// connect_timeout_seconds. Accepted sockets are strangers until their handshake proves the secret;
// a stranger that fails, stalls or sends garbage is dropped (at most kMaxPendingAccepts are kept,
// oldest dropped first) and accepting goes on. A dialed peer that rejects our credentials or fails
// to prove its own ends Connect() at once with Status::Auth; an acceptor that saw only failed
// attempts reports the last of them (Status::Auth) when the deadline passes.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/tcp/connection.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket_address.h"
#include "transport/tcp/transport.h"

namespace horo {

class MeshBuilder {
 public:
  static constexpr size_t kMaxPendingAccepts = 64;

  // listen_fd: the non-blocking listening socket. close_fd: becomes readable on Close().
  MeshBuilder(const TcpOptions& options, int listen_fd, int close_fd);
  ~MeshBuilder();

  // On success data[p] (p != rank) and control[p] (p != 0 on rank 0, p == 0 elsewhere) hold
  // authenticated connections; both vectors have size() entries.
  Status Run(const std::vector<std::string>& addresses, std::vector<std::unique_ptr<tcp::Connection>>* data,
             std::vector<std::unique_ptr<tcp::Connection>>* control);

 private:
  using Clock = std::chrono::steady_clock;
  enum class SlotState { kNotExpected, kWaiting, kClaimed, kDone };

  // One connection this rank dials.
  struct Dial {
    int peer = -1;
    tcp::ChannelKind channel = tcp::ChannelKind::kData;
    std::string address_text;
    std::vector<SocketAddress> addresses;
    size_t attempts = 0;
    int fd = -1;  // while connect() is in progress
    std::unique_ptr<Handshake> handshake;
    Clock::time_point retry_at;
    int backoff_ms = 10;
    std::string last_error = "no attempt yet";
    bool done = false;
  };

  Status ResolveDials(const std::vector<std::string>& addresses);
  Status StartDial(Dial* dial);
  Status AdvanceDial(Dial* dial);
  void ScheduleRetry(Dial* dial, const std::string& error);
  Status AcceptNew();
  void AdvanceAccepted(std::unique_ptr<Handshake>* handshake);
  std::string Admit(int peer, tcp::ChannelKind channel);
  void Install(const Handshake& done, int fd, int peer, tcp::ChannelKind channel);
  bool Complete() const;
  Status DeadlineFailure() const;
  SlotState& Slot(int peer, tcp::ChannelKind channel);

  const TcpOptions& options_;
  const int listen_fd_;
  const int close_fd_;
  Handshake::Identity identity_;
  std::vector<Dial> dials_;
  std::vector<std::unique_ptr<Handshake>> accepted_;  // unauthenticated yet
  std::vector<SlotState> data_slots_;                 // incoming data connection from rank p
  std::vector<SlotState> control_slots_;              // incoming control connection from rank p
  std::vector<std::unique_ptr<tcp::Connection>>* data_ = nullptr;
  std::vector<std::unique_ptr<tcp::Connection>>* control_ = nullptr;
  Status last_rejection_;  // the latest accepted socket that failed authentication or was refused
};

}  // namespace horo
