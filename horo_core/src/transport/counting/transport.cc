#include "transport/counting/transport.h"

namespace horo {

SentBytes CountingTransport::sent() const {
  SentBytes bytes;
  bytes.same_host = same_host_.load(std::memory_order_relaxed);
  bytes.other_hosts = other_hosts_.load(std::memory_order_relaxed);
  return bytes;
}

void CountingTransport::Count(int peer, size_t len) {
  if (peer < 0 || len == 0) return;
  if (!host_ids_fetched_) {
    host_ids_ = inner_->HostIds();
    host_ids_fetched_ = true;
  }
  const int me = inner_->rank();
  const bool same_host = peer < static_cast<int>(host_ids_.size()) && me < static_cast<int>(host_ids_.size()) &&
                         host_ids_[peer] == host_ids_[me];
  (same_host ? same_host_ : other_hosts_).fetch_add(static_cast<int64_t>(len), std::memory_order_relaxed);
}

Status CountingTransport::Send(int peer, const void* data, size_t len) {
  Status status = inner_->Send(peer, data, len);
  if (status.ok()) Count(peer, len);
  return status;
}

Status CountingTransport::SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                   void* recv_data, size_t recv_len) {
  Status status = inner_->SendRecv(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  if (status.ok()) Count(send_peer, send_len);
  return status;
}

Status CountingTransport::SendRecvReduce(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                         void* recv_data, size_t recv_len, const ReceiveReducer& reducer) {
  Status status = inner_->SendRecvReduce(send_peer, send_data, send_len, recv_peer, recv_data, recv_len, reducer);
  if (status.ok()) Count(send_peer, send_len);
  return status;
}

Status CountingTransport::SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer,
                                           void* recv_data, size_t recv_len) {
  Status status = inner_->SendRecvUncached(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  if (status.ok()) Count(send_peer, send_len);
  return status;
}

}  // namespace horo
