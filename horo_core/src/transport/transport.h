// Transport: moves bytes between two ranks, nothing else.
//
// Two planes share one Transport:
//  * the data plane carries raw bytes of collectives. Only the thread running the runtime's pass
//    (the background thread or a caller driving it, one at a time) uses it, always in the globally
//    agreed order of responses, and both sides know every size in advance, so there is no framing.
//    Sender and receiver cut the stream into the same messages (one Send, Recv or direction of a
//    SendRecv each), except at boundaries that lie a multiple of kDataMessageAlignment (64) bytes
//    into a message: the shared-memory transport starts every message at such a boundary of its
//    ring, so that an odd-length message leaves the ones after it aligned.
//    A peer that closes its connection yields HORO_ERR_PEER_LOST at once; a peer that makes no
//    progress for data_timeout_seconds yields HORO_ERR_TIMEOUT.
//  * the control plane carries framed negotiation messages between rank 0 (the coordinator) and
//    every other rank, in both directions, and, where ControlToEveryPeer() says so, between any two
//    ranks (the round messages of coordinator/peer_agreement.h).
//
// Every implementation lives in its own folder with the same file names (loopback/, tcp/, shm/),
// so that a reader who knows one knows them all.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace horo {

// The data plane's message alignment (see above): the shared-memory transport starts every message
// at a multiple of this many bytes of its ring's stream, and a message may be cut differently on
// the two sides only at multiples of it.
constexpr size_t kDataMessageAlignment = 64;

// How SendRecvReduce combines received bytes: reduce(dst, src, count, context) must compute
// dst[i] = dst[i] op src[i] for count elements of element_size bytes (at most 16). The transport
// calls it with element-aligned src and any split of the message into runs of whole elements.
struct ReceiveReducer {
  size_t element_size = 1;
  void (*reduce)(void* dst, const void* src, size_t count, const void* context) = nullptr;
  const void* context = nullptr;
};

struct ControlMessage {
  int peer = -1;        // the rank that sent it
  std::string payload;  // one complete framed message, frame header removed
};

class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Data plane. peer != rank().
  virtual Status Send(int peer, const void* data, size_t len) = 0;
  virtual Status Recv(int peer, void* data, size_t len) = 0;
  // Sends send_len bytes to send_peer while receiving recv_len bytes from recv_peer, progressing
  // both at once so that a ring step never deadlocks on full socket buffers. Either peer may be -1
  // to skip that direction; send_peer may equal recv_peer.
  virtual Status SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                          void* recv_data, size_t recv_len) = 0;
  // SendRecv whose received bytes are combined into recv_data by reducer instead of overwriting
  // it, straight from where they arrive, for the scatter-reduce of ring algorithms: it saves the
  // copy into a scratch buffer. recv_len is a whole number of reducer.element_size elements, and
  // recv_data holds whole elements from its start. A transport that cannot do this for recv_peer
  // returns Unsupported before moving any byte, and the caller receives into scratch instead
  // (collectives/group_io.h); that is the default.
  virtual Status SendRecvReduce(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                void* recv_data, size_t recv_len, const ReceiveReducer& reducer) {
    return Status::Unsupported("this transport does not reduce on receive");
  }

  // SendRecv for a destination that nobody reads again soon (the result of an allreduce larger
  // than the caches, which would be evicted first): a transport may write the received bytes past
  // the caches (non-temporal stores, over shared memory), so that memory need not read every
  // destination line before it is overwritten. The same bytes arrive either way; the default is
  // SendRecv.
  virtual Status SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                  void* recv_data, size_t recv_len) {
    return SendRecv(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  }

  // Control plane. Sends one message (framing is the transport's business).
  virtual Status SendControl(int peer, const std::string& payload) = 0;
  // Waits until at least one control message is available, Wake() is called, or timeout_ms passes
  // (timeout_ms < 0: no limit). Appends every complete message received to *messages and the rank
  // of every peer whose control connection closed (once per peer) to *lost_peers.
  virtual Status PollControl(int timeout_ms, std::vector<ControlMessage>* messages,
                             std::vector<int>* lost_peers) = 0;
  // Thread-safe: makes a PollControl in progress (or the next one) return promptly.
  virtual void Wake() = 0;
  // Empties *messages, which PollControl filled and the caller has read: a transport may keep the
  // payloads' storage for the messages it reads next, so that a steady stream of small messages
  // allocates nothing.
  virtual void RecycleControl(std::vector<ControlMessage>* messages) { messages->clear(); }

  // Waiting without reading, so that the thread that waits need not be the one that reads (see
  // runtime/runtime_progress.cc). True when WaitControl is available; valid once
  // connected.
  virtual bool CanWaitControl() const { return false; }
  // Thread-safe: sleeps until a control message may be available, Wake() is called, the transport
  // closes, or about timeout_ms passes (spurious returns are allowed); reads nothing.
  virtual void WaitControl(int timeout_ms) { (void)timeout_ms; }
  // Thread-safe and cheap: a control message may be available, Wake() was called or the transport
  // closed, i.e. PollControl(0) may return something. False only when it surely would not.
  virtual bool ControlPending() { return true; }
  // True when SendControl reaches every peer, not only rank 0 (and rank 0 every worker). Valid once
  // connected.
  virtual bool ControlToEveryPeer() const { return false; }
  // Thread-safe: closes every connection; blocked calls return an error. Idempotent.
  virtual void Close() = 0;
  // Why PollControl reported peer lost when the peer did not go away (it sent a control frame
  // that failed authentication), for the error that every rank sees; "" otherwise.
  virtual std::string LostReason(int peer) const {
    (void)peer;
    return "";
  }

  // Which host every rank runs on, for algorithms that treat same-host peers differently:
  // host_ids[r] == host_ids[s] exactly when ranks r and s share a host, and every rank gets the same
  // vector. Empty when the transport cannot tell. Valid once the transport is connected.
  virtual std::vector<int> HostIds() const { return {}; }
};

}  // namespace horo
