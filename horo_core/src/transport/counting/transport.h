// CountingTransport: forwards every call to another transport and counts the data-plane bytes this
// rank sends, split into bytes for peers on its own host and bytes for peers on other hosts (by the
// inner transport's host map). The executor hands it to the collectives, so the counts say where a
// collective's traffic went: a hierarchical allreduce must send across hosts only the shards of the
// members that talk between hosts. The counters may be read from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace horo {

struct SentBytes {
  int64_t same_host = 0;
  int64_t other_hosts = 0;  // also every peer when the inner transport cannot tell hosts apart
};

class CountingTransport : public Transport {
 public:
  // inner must outlive this transport.
  explicit CountingTransport(Transport* inner) : inner_(inner) {}

  SentBytes sent() const;

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status Send(int peer, const void* data, size_t len) override;
  Status Recv(int peer, void* data, size_t len) override { return inner_->Recv(peer, data, len); }
  Status SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                  size_t recv_len) override;
  Status SendRecvReduce(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                        size_t recv_len, const ReceiveReducer& reducer) override;
  Status SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                          size_t recv_len) override;
  Status SendControl(int peer, const std::string& payload) override { return inner_->SendControl(peer, payload); }
  Status PollControl(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) override {
    return inner_->PollControl(timeout_ms, messages, lost_peers);
  }
  void Wake() override { inner_->Wake(); }
  void Close() override { inner_->Close(); }
  std::vector<int> HostIds() const override { return inner_->HostIds(); }
  std::string LostReason(int peer) const override { return inner_->LostReason(peer); }

 private:
  void Count(int peer, size_t len);

  Transport* inner_;
  // The inner host map, fetched on the first data-plane call: the data plane is used only after
  // connecting, when the map is valid. Only the data-plane thread touches it.
  std::vector<int> host_ids_;
  bool host_ids_fetched_ = false;
  std::atomic<int64_t> same_host_{0};
  std::atomic<int64_t> other_hosts_{0};
};

}  // namespace horo
