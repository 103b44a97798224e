// Status: the one error value of the core. Background and I/O threads never throw; every failure
// becomes a Status delivered to each affected handle.
#pragma once

#include <string>
#include <utility>

#include "horo/horo.h"

namespace horo {

class Status {
 public:
  Status() = default;
  Status(horo_status_t code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return Status(HORO_ERR_INVALID_ARGUMENT, std::move(m)); }
  static Status Mismatch(std::string m) { return Status(HORO_ERR_MISMATCH, std::move(m)); }
  static Status ShutDown(std::string m) { return Status(HORO_ERR_SHUT_DOWN, std::move(m)); }
  static Status PeerLost(std::string m) { return Status(HORO_ERR_PEER_LOST, std::move(m)); }
  static Status Timeout(std::string m) { return Status(HORO_ERR_TIMEOUT, std::move(m)); }
  static Status Internal(std::string m) { return Status(HORO_ERR_INTERNAL, std::move(m)); }
  static Status Auth(std::string m) { return Status(HORO_ERR_AUTH, std::move(m)); }
  static Status Unsupported(std::string m) { return Status(HORO_ERR_UNSUPPORTED, std::move(m)); }

  bool ok() const { return code_ == HORO_OK; }
  horo_status_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  horo_status_t code_ = HORO_OK;
  std::string message_;
};

// Returns early from the enclosing function when expr yields a non-OK Status.
#define HORO_RETURN_IF_ERROR(expr)        \
  do {                                    \
    ::horo::Status _horo_st = (expr);     \
    if (!_horo_st.ok()) return _horo_st;  \
  } while (0)

}  // namespace horo
