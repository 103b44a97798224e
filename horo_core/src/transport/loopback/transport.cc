#include "transport/loopback/transport.h"

#include <chrono>
#include <stdexcept>
#include <utility>

namespace horo {

LoopbackTransport::LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank, double data_timeout_seconds)
    : hub_(std::move(hub)), rank_(rank), data_timeout_seconds_(data_timeout_seconds) {
  if (!hub_) throw std::invalid_argument("loopback transport needs a hub");
  if (rank < 0 || rank >= hub_->size()) {
    throw std::invalid_argument("loopback rank " + std::to_string(rank) + " is outside a hub of size " +
                                std::to_string(hub_->size()));
  }
}

LoopbackTransport::~LoopbackTransport() { Close(); }

Status LoopbackTransport::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size() || peer == rank_) {
    return Status::InvalidArgument(std::string(what) + ": invalid peer rank " + std::to_string(peer) + " on rank " +
                                   std::to_string(rank_) + " of " + std::to_string(size()));
  }
  return Status::OK();
}

Status LoopbackTransport::Send(int peer, const void* data, size_t len) {
  HORO_RETURN_IF_ERROR(CheckPeer(peer, "loopback send"));
  return hub_->connection(rank_, peer).Write(data, len);
}

Status LoopbackTransport::Recv(int peer, void* data, size_t len) {
  HORO_RETURN_IF_ERROR(CheckPeer(peer, "loopback receive"));
  return hub_->connection(peer, rank_).Read(data, len, std::chrono::duration<double>(data_timeout_seconds_));
}

Status LoopbackTransport::SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                   void* recv_data, size_t recv_len) {
  // Sends never block here, so sending first and then receiving cannot deadlock a ring.
  if (send_peer != -1) HORO_RETURN_IF_ERROR(Send(send_peer, send_data, send_len));
  if (recv_peer != -1) HORO_RETURN_IF_ERROR(Recv(recv_peer, recv_data, recv_len));
  return Status::OK();
}

Status LoopbackTransport::SendControl(int peer, const std::string& payload) {
  HORO_RETURN_IF_ERROR(CheckPeer(peer, "loopback control send"));
  if (hub_->IsClosed(rank_)) {
    return Status::ShutDown("loopback transport of rank " + std::to_string(rank_) +
                            " is closed; cannot send a control message to rank " + std::to_string(peer));
  }
  ControlMessage message;
  message.peer = rank_;
  message.payload = payload;
  return hub_->mailbox(peer).Deliver(std::move(message));
}

Status LoopbackTransport::PollControl(int timeout_ms, std::vector<ControlMessage>* messages,
                                      std::vector<int>* lost_peers) {
  return hub_->mailbox(rank_).Poll(timeout_ms, messages, lost_peers);
}

void LoopbackTransport::Wake() { hub_->mailbox(rank_).Wake(); }

void LoopbackTransport::WaitControl(int timeout_ms) { hub_->mailbox(rank_).WaitReady(timeout_ms); }

bool LoopbackTransport::ControlPending() { return hub_->mailbox(rank_).Ready(); }

void LoopbackTransport::Close() { hub_->CloseRank(rank_); }

}  // namespace horo
