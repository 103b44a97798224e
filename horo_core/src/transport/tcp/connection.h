// Connection: one authenticated, non-blocking TCP socket to one peer rank, either a data channel
// (raw bytes, no framing) or a control channel (frames of an 8-byte little-endian length, the
// payload, and a 32-byte MAC). It offers non-blocking primitives only; TcpTransport owns every
// blocking loop, its deadlines, and the Status messages that name ranks.
//
// A control frame's MAC is HMAC-SHA256(key, sequence | length | payload): the key is this
// direction's of the connection (FrameKeys, made by the handshake from the job's secret and both
// sides' fresh nonces) and the sequence number counts the frames sent in that direction from 0,
// 8 bytes little-endian, known to both ends and never sent. So a frame that someone on the path
// forges, alters, replays (from this connection, another one or another job), reorders or drops
// fails the check at the receiver, which then treats the connection as lost. The data channels
// carry raw collective bytes, unauthenticated after the handshake (docs/architecture.md).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/hmac.h"
#include "common/status.h"
#include "transport/transport.h"

namespace horo {
namespace tcp {

enum class ChannelKind : uint32_t { kData = 1, kControl = 2 };

const char* ChannelName(ChannelKind kind);

// The keys of one connection's control frames, as seen from one end.
struct FrameKeys {
  std::string send;
  std::string receive;
};

class Connection {
 public:
  // Result of a non-blocking primitive. kOk with *moved == 0 means "would block".
  enum class Io { kOk, kClosed, kError };

  // Largest control frame accepted from a peer; a larger length means a corrupt stream.
  static constexpr uint64_t kMaxControlFrame = uint64_t{1} << 31;
  static constexpr size_t kControlHeaderSize = 8;
  static constexpr size_t kControlMacSize = 32;
  // ReadFrames' *error when a frame, not the socket, is at fault.
  static constexpr int kCorruptLength = -1;  // a header announced an impossible length
  static constexpr int kForgedFrame = -2;    // a frame's MAC did not verify
  static const char* FrameFault(int error);

  // Takes ownership of fd (already non-blocking and authenticated); keys: the handshake's, which
  // a control channel needs.
  Connection(int fd, int peer, ChannelKind kind, std::string peer_address, const FrameKeys& keys = {});
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Socket options for every authenticated socket: TCP_NODELAY and keepalive. Buffer sizes are
  // left to the kernel's autotuning: a fixed SO_SNDBUF/SO_RCVBUF is capped by net.core.*mem_max
  // (often 4 MB) and measured slower on loopback (2.9 vs 4.5 GB/s) than autotuned buffers.
  static void TuneEstablished(int fd);

  int fd() const { return fd_; }
  int peer() const { return peer_; }
  ChannelKind kind() const { return kind_; }
  const std::string& peer_address() const { return peer_address_; }

  // Thread-safe: shuts the socket down in both directions so that any blocked poll() on it
  // returns. The descriptor itself stays open until destruction (no fd-reuse races).
  void Shutdown();
  // Stops reading only: the peer can still be sent a last message.
  void ShutdownRead();

  // Moves bytes until len is done or the socket would block; *moved gets the count. kClosed: the
  // peer closed the connection; kError: *error gets errno.
  Io SendSome(const char* data, size_t len, size_t* moved, int* error);
  Io RecvSome(char* data, size_t len, size_t* moved, int* error);

  // Control plane, sending side. Seal writes the MAC of the next frame (header + payload) into mac
  // and counts the frame sent: call it once per frame, under send_mutex(), before SendFrameSome.
  void Seal(const uint8_t* header, const std::string& payload, uint8_t* mac);
  // Writes from byte *offset of the frame (header, payload, MAC) until the frame is done or the
  // socket would block, advancing *offset.
  Io SendFrameSome(const uint8_t* header, const std::string& payload, const uint8_t* mac, size_t* offset,
                   int* error);
  // Control plane, receiving side: reads everything available and appends every complete frame
  // whose MAC verifies to *messages (frames that arrived before a close are still delivered).
  // kError with *error kCorruptLength or kForgedFrame: a frame is at fault (FrameFault says how),
  // and nothing after it is delivered.
  Io ReadFrames(std::vector<ControlMessage>* messages, int* error);

  // Serializes SendControl callers on this connection.
  std::mutex& send_mutex() { return send_mutex_; }

  // Once the byte stream is unusable (peer lost, timeout mid-message), every later call returns
  // this Status. Only the thread that uses the channel reads or writes it.
  bool broken() const { return !broken_.ok(); }
  const Status& broken_status() const { return broken_; }
  void MarkBroken(const Status& status) {
    if (broken_.ok()) broken_ = status;
  }

 private:
  // Moves every complete frame out of rx_; 0, or the fault (kCorruptLength, kForgedFrame) that
  // stopped it.
  int ExtractFrames(std::vector<ControlMessage>* messages);
  // The MAC of a frame under key (a copy of send_mac_ or receive_mac_) and sequence number.
  static void FrameMac(HmacSha256 key, uint64_t sequence, const char* header, const char* payload, size_t length,
                       uint8_t* mac);

  int fd_;
  int peer_;
  ChannelKind kind_;
  std::string peer_address_;
  std::mutex send_mutex_;
  Status broken_;
  // Keyed HMAC states, copied per frame, and the sequence numbers of the next frame each way
  // (sent: under send_mutex_; received: by the reading thread).
  HmacSha256 send_mac_;
  HmacSha256 receive_mac_;
  uint64_t send_sequence_ = 0;
  uint64_t receive_sequence_ = 0;
  // Control receive buffer: bytes [rx_begin_, rx_end_) are an incomplete frame kept across calls.
  std::vector<char> rx_;
  size_t rx_begin_ = 0;
  size_t rx_end_ = 0;
};

}  // namespace tcp
}  // namespace horo
