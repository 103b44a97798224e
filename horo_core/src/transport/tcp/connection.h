// Connection: one authenticated, non-blocking TCP socket to one peer rank, either a data channel
// (raw bytes, no framing) or a control channel (frames of an 8-byte little-endian length followed
// by the payload). It offers non-blocking primitives only; TcpTransport owns every blocking loop,
// its deadlines, and the Status messages that name ranks.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/transport.h"

namespace horo {
namespace tcp {

enum class ChannelKind : uint32_t { kData = 1, kControl = 2 };

const char* ChannelName(ChannelKind kind);

class Connection {
 public:
  // Result of a non-blocking primitive. kOk with *moved == 0 means "would block".
  enum class Io { kOk, kClosed, kError };

  // Largest control frame accepted from a peer; a larger length means a corrupt stream.
  static constexpr uint64_t kMaxControlFrame = uint64_t{1} << 31;
  static constexpr size_t kControlHeaderSize = 8;

  // Takes ownership of fd (already non-blocking and authenticated).
  Connection(int fd, int peer, ChannelKind kind, std::string peer_address);
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

  // Moves bytes until len is done or the socket would block; *moved gets the count. kClosed: the
  // peer closed the connection; kError: *error gets errno.
  Io SendSome(const char* data, size_t len, size_t* moved, int* error);
  Io RecvSome(char* data, size_t len, size_t* moved, int* error);

  // Control plane, sending side: writes from byte *offset of the frame (header + payload) until
  // the frame is done or the socket would block, advancing *offset.
  Io SendFrameSome(const uint8_t* header, const std::string& payload, size_t* offset, int* error);
  // Control plane, receiving side: reads everything available and appends every complete frame
  // to *messages (frames that arrived before a close are still delivered). kError with
  // *error == 0 means a frame header announced an impossible length (corrupt stream).
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
  // Moves every complete frame out of rx_; false when a header announces an impossible length.
  bool ExtractFrames(std::vector<ControlMessage>* messages);

  int fd_;
  int peer_;
  ChannelKind kind_;
  std::string peer_address_;
  std::mutex send_mutex_;
  Status broken_;
  // Control receive buffer: bytes [rx_begin_, rx_end_) are an incomplete frame kept across calls.
  std::vector<char> rx_;
  size_t rx_begin_ = 0;
  size_t rx_end_ = 0;
};

}  // namespace tcp
}  // namespace horo
