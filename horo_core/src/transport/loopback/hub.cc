#include "transport/loopback/hub.h"

#include <stdexcept>
#include <string>
#include <utility>

namespace horo {

LoopbackHub::LoopbackHub(int size, std::vector<int> host_ids)
    : size_(size), host_ids_(host_ids.empty() ? std::vector<int>(size > 0 ? size : 0, 0) : std::move(host_ids)) {
  if (size < 1) throw std::invalid_argument("loopback hub size must be at least 1, got " + std::to_string(size));
  if (static_cast<int>(host_ids_.size()) != size) {
    throw std::invalid_argument("loopback hub of " + std::to_string(size) + " ranks given " +
                                std::to_string(host_ids_.size()) + " host ids");
  }
  connections_.resize(static_cast<size_t>(size) * size);
  for (int src = 0; src < size; ++src) {
    for (int dst = 0; dst < size; ++dst) {
      if (src != dst) connections_[src * size + dst] = std::make_unique<loopback::Connection>(src, dst);
    }
  }
  for (int rank = 0; rank < size; ++rank) mailboxes_.push_back(std::make_unique<Mailbox>(rank));
  closed_.assign(size, false);
}

void LoopbackHub::CloseRank(int rank) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_[rank]) return;
    closed_[rank] = true;
  }
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank) continue;
    connection(rank, peer).CloseWriter();
    connection(peer, rank).CloseReader();
  }
  mailbox(rank).Close();
  for (int peer = 0; peer < size_; ++peer) {
    if (peer != rank) mailbox(peer).ReportLostPeer(rank);
  }
}

bool LoopbackHub::IsClosed(int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_[rank];
}

}  // namespace horo
