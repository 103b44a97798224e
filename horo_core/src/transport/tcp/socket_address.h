// SocketAddress: one resolved IPv4/IPv6 socket address, and the "host:port" text form ranks
// publish through the rendezvous ("10.0.0.7:41234", "[fe80::1]:41234", "node3:41234").
#pragma once

#include <sys/socket.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace horo {

class SocketAddress {
 public:
  SocketAddress() = default;

  // Splits "host:port" / "[v6host]:port" into its parts; InvalidArgument when malformed.
  static Status SplitHostPort(const std::string& text, std::string* host, int* port);
  // Joins host and port, bracketing IPv6 literals.
  static std::string JoinHostPort(const std::string& host, int port);
  // Resolves host (name or literal) and port into every address getaddrinfo returns, in order.
  // passive: for bind() (an empty host then means every interface).
  static Status Resolve(const std::string& host, int port, bool passive, std::vector<SocketAddress>* out);
  // The local (peer = false) or remote (peer = true) address of a connected socket.
  static SocketAddress OfSocket(int fd, bool peer);

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage_); }
  socklen_t length() const { return length_; }
  int family() const { return storage_.ss_family; }
  int port() const;
  // Numeric "ip:port" ("[ip]:port" for IPv6), for messages.
  std::string ToString() const;

 private:
  sockaddr_storage storage_{};
  socklen_t length_ = 0;
};

}  // namespace horo
