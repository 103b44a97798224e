// TcpTransport: the Transport over authenticated TCP sockets.
//
// Listen() opens an ephemeral port on one interface; the caller publishes address() through its
// rendezvous; Connect() builds the mesh (see mesh_builder.h): one data connection between every pair
// of ranks, plus one control connection between rank 0 and every other rank, so that control frames
// never interleave with raw data. Every connection is mutually authenticated with the per-job
// secret (see handshake.h); there is no unauthenticated mode.
//
// Threading: the data plane (Send/Recv/SendRecv) is used by one thread at a time. SendControl may
// be called from any thread (serialized per connection); PollControl from one thread at a time.
//
// A control send never waits on a peer that is itself waiting to send: while SendControl waits for
// socket space it keeps reading every control connection, buffering complete frames (and peers
// found closed) in a pending queue that PollControl returns before anything it reads later. Rank 0
// sending a large response list to a worker while that worker sends it a large request list would
// otherwise stall both until the data timeout (test/cpp/test_tcp_control.cc).
// Wake() and Close() are safe from any thread at any time. Close() shuts every socket down, so
// blocked calls return Status::ShutDown at once; descriptors are released by the destructor.
#pragma once

#include <poll.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/tcp/connection.h"
#include "transport/transport.h"

namespace horo {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  std::string bind_host = "127.0.0.1";  // listen only on this interface, never 0.0.0.0 by default
  std::string secret;                   // per-job key (raw bytes); empty = refuse to run
  double connect_timeout_seconds = 30;  // the whole mesh must be up within this
  double data_timeout_seconds = 30;     // a data-plane or control send with no progress this long
                                        // yields Status::Timeout
};

class TcpTransport : public Transport {
 public:
  // Validates options, binds bind_host:0 (an ephemeral port) and listens.
  static Status Listen(const TcpOptions& options, std::unique_ptr<TcpTransport>* out);
  ~TcpTransport() override;

  // "host:port" to publish through the rendezvous. A wildcard bind_host publishes the hostname.
  const std::string& address() const { return address_; }
  // addresses[r] is rank r's address(). Builds the whole mesh or fails: Status::Auth when a peer
  // failed authentication, Status::Timeout when the mesh was not up within connect_timeout_seconds,
  // Status::ShutDown when Close() interrupted it. Call once.
  Status Connect(const std::vector<std::string>& addresses);

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  const TcpOptions& options() const { return options_; }
  // For a transport layered on top (shm/): the data connection to peer (null for peer == rank or
  // before Connect succeeded). Its user must follow the threading rule of the data plane.
  tcp::Connection* DataConnection(int peer) const {
    return connected_ && peer >= 0 && peer < options_.size ? data_[peer].get() : nullptr;
  }

  Status Send(int peer, const void* data, size_t len) override;
  Status Recv(int peer, void* data, size_t len) override;
  Status SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                  size_t recv_len) override;

  Status SendControl(int peer, const std::string& payload) override;
  Status PollControl(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) override;
  void Wake() override;
  void Close() override;
  std::string LostReason(int peer) const override;

 private:
  explicit TcpTransport(const TcpOptions& options);

  Status CheckDataPeer(int peer, const char* what) const;
  // The one data-plane loop: moves send_len bytes to send_conn and recv_len bytes from recv_conn
  // (either may be null) until both are done, polling both sockets together.
  Status Transfer(tcp::Connection* send_conn, const char* send_data, size_t send_len, tcp::Connection* recv_conn,
                  char* recv_data, size_t recv_len);
  Status IoFailure(tcp::Connection* conn, const char* direction, tcp::Connection::Io io, int error, size_t done,
                   size_t total);
  Status TimeoutFailure(tcp::Connection* send_conn, size_t sent, size_t send_len, tcp::Connection* recv_conn,
                        size_t received, size_t recv_len);
  tcp::Connection* ControlConnection(int peer) const;
  // Waits (up to wait_ms) until conn can take more bytes, reading meanwhile whatever arrives on
  // the control connections into the pending queue (waking a PollControl on another thread if it
  // buffered something).
  Status WaitControlSpace(tcp::Connection* conn, int wait_ms);
  // Reads what control_[peer] has into *messages; a closed or corrupt connection is shut down,
  // marked lost and appended to *lost_peers (one with a forged frame only for reading, so that
  // rank 0 can still tell that peer why the job stops). Caller holds inbound_mutex_.
  void ReadControl(int peer, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers);
  // Moves the pending queue to the caller's vectors; false if it was empty. Caller holds inbound_mutex_.
  bool TakePending(std::vector<ControlMessage>* messages, std::vector<int>* lost_peers);
  std::string Who() const { return "rank " + std::to_string(options_.rank); }

  const TcpOptions options_;
  std::string address_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;   // eventfd: Wake() -> PollControl; drained by PollControl
  int close_fd_ = -1;  // eventfd: Close() -> everyone; never drained
  std::atomic<bool> closed_{false};
  std::atomic<bool> connected_{false};
  bool connect_called_ = false;
  std::mutex close_mutex_;  // guards listen_fd_ and installing connections against Close()

  // data_[p]: data connection to rank p (null for p == rank). control_[p]: control connection
  // to rank p (rank 0 holds size - 1 of them, others only control_[0]).
  std::vector<std::unique_ptr<tcp::Connection>> data_;
  std::vector<std::unique_ptr<tcp::Connection>> control_;

  std::mutex poll_mutex_;           // one PollControl at a time
  std::vector<pollfd> poll_fds_;    // reused by PollControl
  std::vector<int> poll_peers_;     // rank of poll_fds_[i], -1 for the wake/close fds

  // Reading control connections, from PollControl or from a waiting SendControl, happens under
  // inbound_mutex_, which also guards the three members below.
  mutable std::mutex inbound_mutex_;
  std::vector<bool> control_lost_;               // reported (or queued to be reported) in lost_peers
  std::vector<ControlMessage> pending_control_;  // read by a waiting SendControl, not yet returned
  std::vector<int> pending_lost_;                // control connections found closed meanwhile
  std::map<int, std::string> lost_reasons_;      // LostReason's, by peer
};

}  // namespace horo
