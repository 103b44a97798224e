// LoopbackHub: the shared medium of the ranks (threads) of one process that talk over loopback.
//
// It owns one loopback::Connection for every ordered pair of ranks (the data plane) and one Mailbox per rank
// (the control plane). Closing a rank closes every connection that touches it and tells each other
// rank's mailbox, once, that the rank was lost. All ranks are on one host unless the hub is given
// a host map, which lets tests emulate ranks spread over several hosts.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "transport/loopback/connection.h"
#include "transport/loopback/mailbox.h"

namespace horo {

class LoopbackHub {
 public:
  // size must be at least 1, and host_ids empty (one host) or holding one entry per rank, ranks
  // with equal entries sharing a host (std::invalid_argument otherwise).
  explicit LoopbackHub(int size, std::vector<int> host_ids = {});
  LoopbackHub(const LoopbackHub&) = delete;
  LoopbackHub& operator=(const LoopbackHub&) = delete;

  int size() const { return size_; }
  const std::vector<int>& host_ids() const { return host_ids_; }
  // src != dst, both in [0, size).
  loopback::Connection& connection(int src, int dst) { return *connections_[src * size_ + dst]; }
  Mailbox& mailbox(int rank) { return *mailboxes_[rank]; }

  // Idempotent and thread-safe.
  void CloseRank(int rank);
  bool IsClosed(int rank) const;

 private:
  const int size_;
  const std::vector<int> host_ids_;
  std::vector<std::unique_ptr<loopback::Connection>> connections_;  // [src * size + dst], null on the diagonal
  std::vector<std::unique_ptr<Mailbox>> mailboxes_;
  mutable std::mutex mutex_;
  std::vector<bool> closed_;
};

}  // namespace horo
