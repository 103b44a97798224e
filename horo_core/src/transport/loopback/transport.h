// LoopbackTransport: the Transport of ranks that are threads of one process, all attached to one
// LoopbackHub. It is the reference implementation and the test double of every other transport:
// sends copy into the destination's byte stream and never block, receives wait for the bytes,
// control messages land in the destination's mailbox, and Close() of a rank makes every peer see
// PeerLost on the data plane and, once, in PollControl's lost_peers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/loopback/hub.h"
#include "transport/transport.h"

namespace horo {

class LoopbackTransport : public Transport {
 public:
  // rank must be in [0, hub->size()) (std::invalid_argument otherwise) and attached at most once.
  // A receive that gets no byte for data_timeout_seconds fails with Timeout (<= 0: no limit).
  LoopbackTransport(std::shared_ptr<LoopbackHub> hub, int rank, double data_timeout_seconds = 30.0);
  // Closes, so that peers see this rank as lost.
  ~LoopbackTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return hub_->size(); }

  Status Send(int peer, const void* data, size_t len) override;
  Status Recv(int peer, void* data, size_t len) override;
  Status SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                  size_t recv_len) override;

  Status SendControl(int peer, const std::string& payload) override;
  Status PollControl(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) override;
  void Wake() override;
  bool CanWaitControl() const override { return true; }
  bool ControlToEveryPeer() const override { return true; }
  void WaitControl(int timeout_ms) override;
  bool ControlPending() override;
  void Close() override;
  std::vector<int> HostIds() const override { return hub_->host_ids(); }

 private:
  Status CheckPeer(int peer, const char* what) const;

  const std::shared_ptr<LoopbackHub> hub_;
  const int rank_;
  const double data_timeout_seconds_;
};

}  // namespace horo
