#include "transport/tcp/socket_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <cstring>

namespace horo {

Status SocketAddress::SplitHostPort(const std::string& text, std::string* host, int* port) {
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return Status::InvalidArgument("malformed address '" + text + "': expected [ipv6]:port");
    }
    *host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) {
      return Status::InvalidArgument("malformed address '" + text + "': expected host:port");
    }
    *host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
    if (host->find(':') != std::string::npos) {
      return Status::InvalidArgument("malformed address '" + text + "': write IPv6 hosts as [host]:port");
    }
  }
  if (host->empty() || port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos) {
    return Status::InvalidArgument("malformed address '" + text + "': expected host:port");
  }
  *port = std::stoi(port_text);
  if (*port < 1 || *port > 65535) {
    return Status::InvalidArgument("malformed address '" + text + "': port out of range");
  }
  return Status::OK();
}

std::string SocketAddress::JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Status SocketAddress::Resolve(const std::string& host, int port, bool passive,
                              std::vector<SocketAddress>* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* list = nullptr;
  std::string service = std::to_string(port);
  int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    return Status::InvalidArgument("cannot resolve host '" + host + "': " + ::gai_strerror(rc));
  }
  out->clear();
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    SocketAddress address;
    std::memcpy(&address.storage_, ai->ai_addr, ai->ai_addrlen);
    address.length_ = ai->ai_addrlen;
    out->push_back(address);
  }
  ::freeaddrinfo(list);
  if (out->empty()) return Status::InvalidArgument("host '" + host + "' has no IPv4/IPv6 address");
  return Status::OK();
}

SocketAddress SocketAddress::OfSocket(int fd, bool peer) {
  SocketAddress address;
  address.length_ = sizeof(address.storage_);
  int rc = peer ? ::getpeername(fd, reinterpret_cast<sockaddr*>(&address.storage_), &address.length_)
                : ::getsockname(fd, reinterpret_cast<sockaddr*>(&address.storage_), &address.length_);
  if (rc != 0) address = SocketAddress();
  return address;
}

int SocketAddress::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage_)->sin_port);
  if (family() == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_port);
  return 0;
}

std::string SocketAddress::ToString() const {
  char text[INET6_ADDRSTRLEN] = "";
  if (family() == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage_)->sin_addr, text, sizeof(text));
  } else if (family() == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage_)->sin6_addr, text, sizeof(text));
  } else {
    return "(unknown address)";
  }
  return JoinHostPort(text, port());
}

}  // namespace horo
