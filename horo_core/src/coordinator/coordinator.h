// Coordinator: runs on global rank 0 and decides, for every process set, which named tensors are
// ready on all of the set's members, checks that the members agree (op, dtype, shape, reduce op,
// scale factors, root, splits), and emits one globally ordered list of responses that every rank
// executes in the same order. One sequence for all process sets is what keeps ranks that belong
// to overlapping sets from waiting on each other in different orders; each set still has its own
// table of pending tensors, joined ranks and stall tracking.
//
// Repeated tensors are answered from the response cache; consecutive compatible allreduces are
// fused up to the fusion threshold.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "coordinator/process_set_table.h"
#include "coordinator/request.h"
#include "coordinator/response.h"
#include "coordinator/response_cache.h"
#include "coordinator/stall_inspector.h"
#include "timeline/timeline.h"

namespace horo {

class Coordinator {
 public:
  Coordinator(const Config& config, int world_size, ProcessSetTable* sets, ResponseCache* cache, Timeline* timeline);

  // Records the requests of one rank (rank 0's own included).
  void AddRequests(int rank, const RequestList& list);
  // A rank whose control connection closed, or (reason not empty) that this rank stopped reading
  // (Transport::LostReason).
  void PeerLost(int rank, const std::string& reason = "");
  // Describes the ranks lost without shutting down: those that died ("exited or lost its
  // connection"), then those cut off (their reason) or that reported a failure. Empty if there
  // are none.
  std::string DescribeUnexpectedLosses() const;
  bool HasDeadRank() const;

  // Builds the responses of everything that became ready. Returns false if there is nothing to
  // send. A shutdown (requested, peer lost, or stall) is emitted as a kShutdown response and is
  // the last response ever built.
  bool BuildResponses(ResponseList* out);
  // Only the shutdown response, when a failure (a lost rank, a stall) calls for one: for a rank 0 in
  // the middle of a round of peer agreement (coordinator/peer_agreement.h), which must not send
  // other responses yet, and whose round may never complete. False if none is due.
  bool BuildFailureShutdown(ResponseList* out);
  // Checks for stalled tensors: logs a warning past the stall time, and arranges a shutdown past
  // the shutdown time. waiting: tensors waiting elsewhere (cached steps that only some members
  // announced, coordinator/peer_agreement.h). Returns the milliseconds until the next check is due.
  int CheckStalls(std::vector<StalledTensor> waiting = {});

  // Autotune: responses built from now on are fused up to this many bytes.
  void set_fusion_threshold_bytes(int64_t bytes) { fusion_threshold_bytes_ = bytes; }

  bool shut_down() const { return shut_down_; }
  // Process sets with state here (pending tensors, joined ranks): the live ones, and removed ones
  // whose last tensors are still to be answered.
  size_t tracked_set_count() const { return states_.size(); }
  int lost_count() const { return static_cast<int>(lost_.size()); }

 private:
  struct Pending {
    std::map<int32_t, Request> by_rank;
    std::chrono::steady_clock::time_point first_seen;
    bool queued_ready = false;
  };
  struct SetState {
    std::map<std::string, Pending> pending;
    std::vector<int32_t> joined;  // in join order
  };

  void AddTensorRequest(const Request& request);
  void AddSetChange(const Request& request);
  void MarkReadyIfComplete(int32_t set_id, const std::string& name);
  Response Construct(int32_t set_id, const std::string& name, const Pending& pending,
                     const std::vector<int32_t>& members, const std::vector<int32_t>& joined);
  Response ConstructSetChange(const std::string& name, const Pending& pending);
  std::string Signature(const Pending& pending, const std::vector<int32_t>& joined) const;
  // A grouped call whose members differ between ranks (another count or another first tensor):
  // every pending tensor of the groups involved gets the error on every rank, instead of waiting
  // for members that some ranks never submit.
  void FailMismatchedGroups(int32_t set_id, const std::string& name, const std::string& message,
                            std::vector<ResponsePart>* parts, std::vector<Response>* resolved);
  void ResolveRemovedSet(int32_t set_id, std::vector<ResponsePart>* parts, std::vector<Response>* resolved,
                         std::vector<std::pair<int32_t, std::string>>* deferred);
  void Fuse(std::vector<ResponsePart> parts, const std::vector<Response>& resolved, ResponseList* out);
  void EmitShutdown(horo_status_t code, const std::string& message, ResponseList* out);
  bool AppendShutdownIfDue(ResponseList* out);

  Config config_;
  int64_t fusion_threshold_bytes_;
  int world_size_;
  ProcessSetTable* sets_;
  ResponseCache* cache_;
  Timeline* timeline_;
  StallInspector stall_inspector_;
  std::map<int32_t, SetState> states_;
  std::vector<std::pair<int32_t, std::string>> ready_;  // readiness order
  std::set<int32_t> shutdown_requested_;
  std::map<int32_t, std::string> failures_;  // ranks that reported their own failure
  std::map<int32_t, std::string> cut_off_;   // ranks lost with a reason (PeerLost)
  std::vector<int32_t> lost_;
  bool stall_shutdown_ = false;
  std::string stall_message_;
  bool shut_down_ = false;
  bool changed_ = false;  // requests, losses or a stall since BuildResponses last ran
};

}  // namespace horo
