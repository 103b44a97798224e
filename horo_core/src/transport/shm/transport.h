// ShmTransport: the data plane through shared memory between ranks of one host, TCP for the rest.
//
// It wraps a TcpTransport. The control plane, and the data plane to peers on other hosts, go to
// TCP unchanged. Connect() builds the TCP mesh and then the shared-memory links (link_builder.h);
// a Send/Recv/SendRecv that involves a linked peer moves its bytes through that pair's rings
// (ring.h), and a SendRecv that mixes a linked and a TCP peer progresses both in one loop.
//
// Waiting: a transfer that cannot move spins for spin_microseconds (common/spin.h), then sleeps on
// this rank's doorbell (doorbell.h) with a timeout of 1 ms doubling to 8 ms; a peer that moves the
// ring rings it. While a TCP direction is pending too, it sleeps in ppoll() on the socket for at
// most 200 us instead. So an oversubscribed host never loses a core to a waiting rank.
//
// Control plane: between rank 0 and a worker that share a host, control messages travel through
// the pair's control rings (control.cc) instead of the TCP control connection, and the waiting
// thread spins (yielding the core) before it sleeps on the same doorbell, so that a request and its
// response cost microseconds. Every wait of the thread running a pass (PollControl, a blocked
// SendControl, a data transfer) drains the inbound control rings into a queue, so that two ranks
// sending to each other never wait for each other. Peers without a link use TCP as before; the
// idle TCP control connection of a linked peer still reports its process's death.
//
// Failures are those of TCP, with the peer named: a peer that called Close() (closed flag in its
// rings) or whose process died (its TCP data connection, idle since setup, reports a hang-up; it is
// checked each time the waiter wakes) yields PeerLost; no progress for data_timeout_seconds yields
// Timeout; both leave the link broken. Close() sets the closed flags of every ring, rings every
// doorbell and closes TCP, so waiters here and on every peer return at once.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/link_builder.h"
#include "transport/shm/options.h"
#include "transport/tcp/transport.h"
#include "transport/transport.h"

namespace horo {

class ShmTransport : public Transport {
 public:
  ShmTransport(std::unique_ptr<TcpTransport> tcp, const ShmOptions& options);
  ~ShmTransport() override;

  const std::string& address() const { return tcp_->address(); }
  // Builds the TCP mesh (see TcpTransport::Connect), then the shared-memory links. Call once.
  Status Connect(const std::vector<std::string>& addresses);
  // True when the data plane to peer runs through shared memory.
  bool SharedMemoryPeer(int peer) const;
  // Bytes of each ring in which same-host peers write to this rank (its segment's, ShmOptions::
  // ring_bytes or DefaultRingBytes); 0 without a segment. Valid after Connect.
  uint64_t InboundRingBytes() const { return links_.own ? links_.own->ring_bytes() : 0; }

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }

  Status Send(int peer, const void* data, size_t len) override;
  Status Recv(int peer, void* data, size_t len) override;
  Status SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                  size_t recv_len) override;
  // Reduces straight from the ring when recv_peer is linked; Unsupported for a TCP recv_peer.
  Status SendRecvReduce(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                        size_t recv_len, const ReceiveReducer& reducer) override;
  // Writes what arrives from a linked recv_peer with non-temporal stores (Ring::ReadUncached).
  Status SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                          size_t recv_len) override;

  Status SendControl(int peer, const std::string& payload) override;
  Status PollControl(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) override;
  void Wake() override;
  // Keeps up to kSpareFrames payloads of at most kSpareFrameBytes (their storage) for the next
  // frames read from the control rings.
  void RecycleControl(std::vector<ControlMessage>* messages) override;
  // Available when no control peer is on TCP: every source of news then rings one doorbell.
  bool CanWaitControl() const override { return connected_ && !tcp_control_peers_; }
  // When every peer shares this rank's host and memory: control rings join every pair then.
  bool ControlToEveryPeer() const override { return connected_ && every_peer_linked_; }
  void WaitControl(int timeout_ms) override;
  bool ControlPending() override { return !CanWaitControl() || ControlReady(); }
  void Close() override;
  // From the host digests exchanged while connecting (link_builder.h).
  std::vector<int> HostIds() const override;
  std::string LostReason(int peer) const override { return tcp_->LostReason(peer); }

 private:
  using Clock = std::chrono::steady_clock;

  // One direction of a transfer: through link (shared memory) or conn (TCP), or idle.
  struct Direction {
    int peer = -1;
    shm::Link* link = nullptr;
    tcp::Connection* conn = nullptr;
    char* data = nullptr;
    size_t len = 0;
    size_t done = 0;
    const ReceiveReducer* reducer = nullptr;  // recv only: reduce into data instead of copying
    bool uncached = false;                    // recv only: write data past the caches
    shm::Ring::Carry carry;
    bool aligned = false;  // linked: the ring's stream is at the message's 64-byte boundary
    bool pending() const { return done < len; }
  };

  // SendRecv and SendRecvUncached: uncached receives from a linked peer with Ring::ReadUncached.
  Status Exchange(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                  size_t recv_len, bool uncached);
  Status CheckDataPeer(int peer, const char* what) const;
  Status Prepare(int peer, const void* data, size_t len, const char* what, Direction* direction) const;
  Status Transfer(Direction* send, Direction* recv);
  // Moves what can move now; false with *status set on failure.
  bool Step(Direction* direction, bool sending, bool* progress, Status* status);
  // After a pass without progress: closed transport, closed rings.
  Status CheckClosed(Direction* send, Direction* recv);
  // Sleeps until something may have changed (or for at most timeout).
  void Block(Direction* send, Direction* recv, std::chrono::microseconds timeout, int64_t doorbell_ns);
  // After a sleep: did a linked peer's process go away?
  Status CheckHangUps(Direction* send, Direction* recv);
  Status Lost(Direction* direction, const std::string& reason, bool sending);
  Status TimeoutFailure(Direction* send, Direction* recv);

  int64_t SpinNanos() const { return static_cast<int64_t>(options_.spin_microseconds * 1e3); }

  // Control plane (control.cc).
  // The link carrying control messages to or from peer, or null (TCP).
  shm::Link* ControlLink(int peer) const;
  // Moves every complete inbound control frame into *out; an error names a corrupt frame.
  Status DrainControlLocked(std::vector<ControlMessage>* out);
  // From a wait that is not PollControl: drains into pending_control_ unless another thread reads.
  void DrainControlWhileWaiting();
  Status WaitControlSpace(shm::Link* link, int peer, size_t done, size_t total, Clock::time_point* last_progress);
  std::string Who() const { return "rank " + std::to_string(rank()); }

  std::unique_ptr<TcpTransport> tcp_;
  const ShmOptions options_;
  std::mutex close_mutex_;  // guards installing links_ against Close()
  std::atomic<bool> closed_{false};
  std::atomic<bool> connected_{false};
  bool connect_called_ = false;
  shm::LinkSet links_;

  // The doorbell this rank's control waits sleep on: its segment's, or a private word when no
  // same-host peer maps a segment of this rank (then only Wake() and Close() ring it).
  shm::Doorbell ControlDoorbell() { return links_.own ? links_.own->doorbell() : shm::Doorbell(&private_bell_); }
  // A control message is waiting in a ring or in pending_control_, or a wake-up was asked for.
  bool ControlReady();

  // Control plane state (control.cc).
  shm::DoorbellShared private_bell_{};
  bool control_links_ = false;      // some control peer uses shared memory
  bool tcp_control_peers_ = false;  // some control peer uses TCP
  bool every_peer_linked_ = false;  // every peer has a link: every pair of ranks has control rings
  std::vector<shm::Link*> control_link_of_;  // by peer: ControlLink's answer, set once connected
  std::atomic<bool> wake_requested_{false};
  std::mutex control_read_mutex_;                // the one reader of the inbound control rings
  std::vector<ControlMessage> pending_control_;  // drained outside PollControl, returned by it
  // Payloads handed back by RecycleControl, emptied with their storage kept (under spare_mutex_);
  // the reader takes them all over when its own spares run out (reader_spares_, under
  // control_read_mutex_), and a frame being read takes one.
  static constexpr size_t kSpareFrames = 64;
  static constexpr size_t kSpareFrameBytes = 64 << 10;  // larger payloads are freed, not kept
  std::mutex spare_mutex_;
  std::vector<std::string> spare_frames_;
  std::vector<std::string> reader_spares_;
  std::mutex control_send_mutex_;                // senders of control frames, one at a time
  int64_t last_tcp_check_ns_ = 0;                // PollControl's last look at the TCP control plane (CoarseNanos)
};

}  // namespace horo
