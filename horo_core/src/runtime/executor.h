// Executor: runs the responses of one negotiation round on this rank, in the agreed order: packs
// fused allreduces into the fusion buffer, applies scale factors, calls the collective
// algorithms, copies results out and completes the handles.
//
// Per-tensor problems (a mismatch the coordinator found) complete only the handles concerned; a
// failure of the data plane is returned, because after it the ranks no longer agree on what was
// sent, and the runtime must stop.
//
// executor.cc runs the fused responses on the data plane; executor_contributions.cc the small steps
// whose data came with the peers' announcements; executor_device.cc hands CUDA tensors to the
// device executor.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/host_topology.h"
#include "common/config.h"
#include "coordinator/process_set_table.h"
#include "coordinator/response.h"
#include "coordinator/tensor_queue.h"
#include "device/device_executor.h"
#include "runtime/handle_manager.h"
#include "transport/counting/transport.h"
#include "timeline/execution_trace.h"
#include "timeline/timeline.h"
#include "transport/transport.h"

namespace horo {

// What this rank's executor has done so far, for tests and monitoring.
struct ExecutorStats {
  int64_t allreduce_runs[kAllreduceAlgorithmCount] = {};  // collectives run, indexed by AllreduceAlgorithm
  int64_t allgather_runs[kAllgatherAlgorithmCount] = {};  // indexed by AllgatherAlgorithm
  SentBytes sent;                         // data-plane bytes this rank sent
  int64_t allreduce_from_announcements = 0;  // reduced from the peers' announcements (RunFromContributions)
  int64_t allgather_from_announcements = 0;  // gathered from them
  int64_t reducescatter_from_announcements = 0;  // this rank's part reduced from them
  int64_t alltoall_from_announcements = 0;  // this rank's rows taken from them
  int64_t broadcast_from_announcements = 0;  // the root's tensor copied from them
};

class Executor {
 public:
  Executor(const Config& config, int rank, Transport* transport, ProcessSetTable* sets, TensorQueue* queue,
           HandleManager* handles, Timeline* timeline);

  ~Executor();

  Status Execute(const FusedResponse& fused);
  // A small allreduce, reducescatter, allgather, alltoall or broadcast whose every member's input
  // bytes arrived with the ranks' announcements (coordinator/peer_agreement.h), in member order:
  // reduced here, in that order, so that every member computes the same bytes (a reducescatter
  // only its own part), laid end to end (an alltoall only the rows each member sent this one) or
  // the root's copied; no data-plane step.
  Status RunFromContributions(const Response& response, const std::vector<std::string>& contributions);
  // The same for an allreduce or a broadcast of every member's contribution (checked by the
  // caller) that no queued entry waits for: reduced, or the root's copied, into out
  // (Runtime::RunExpress).
  void RunAnnounced(const Response& response, const std::vector<const char*>& contributions, void* out);
  // Safe to call from any thread.
  ExecutorStats Stats() const;

  // CUDA tensors (horo_tensor_t.device != 0), see device/device_executor.h; defined in
  // runtime/executor_device.cc. EnableCuda runs on a user thread, once; later calls report the
  // NCCL version already loaded.
  Status EnableCuda(const std::string& nccl_path, int32_t* nccl_version);
  Status CheckDeviceTensor(OpType op, const horo_tensor_t& tensor, const std::string& label) const;

  // Autotune: the allreduce crossover changes between response lists, identically on every rank.
  // Once set, it replaces the crossover each response carries (the coordinator's setting when the
  // response was first built; cached responses keep it).
  void set_small_message_bytes(int64_t bytes) {
    allreduce_options_.small_message_bytes = bytes;
    small_message_bytes_tuned_ = true;
  }

 private:
  // One tensor of a response as this rank sees it. A rank that joined the set and never
  // submitted the tensor takes part with a neutral stand-in (owned below).
  struct Slot {
    const Response* response = nullptr;
    TensorEntry entry;
    bool present = false;
    std::vector<uint8_t> stand_in;
  };

  bool GroupOf(int32_t set_id, CommGroup* group);
  // The hosts of a set's members, computed once per set from the transport's host map.
  Status TopologyOf(int32_t set_id, const CommGroup& group, const HostTopology** topology);
  // Allreduce with the algorithm settings of the response, counted in the stats, and its postscale
  // (Average's division included) applied. The prescale is the caller's.
  Status ReduceAcrossGroup(const CommGroup& group, const Response& head, void* buffer, int64_t count);
  // The allreduce settings every member uses for head: the coordinator's (stamped in the response)
  // or the autotuner's crossover, and the set's host topology.
  Status AllreduceOptionsFor(const CommGroup& group, const Response& head, AllreduceOptions* options);
  Status TakeSlot(const Response& response, Slot* slot);
  void Finish(Slot& slot, const Status& status, HandleResult* result = nullptr);

  Status RunAllreduce(const CommGroup& group, std::vector<Slot>& slots);
  // RunFromContributions of an allreduce, a reducescatter and an alltoall (member_index: this
  // rank's place in the set) and an allgather (contributions checked by the caller).
  Status ReduceContributions(const Response& r, const std::vector<std::string>& contributions, int group_size);
  void ReduceAll(const Response& r, const std::vector<const char*>& contributions, int group_size, void* out);
  // The contributions' bytes, in contribution_bytes_ (kept for its storage).
  const std::vector<const char*>& BytesOf(const std::vector<std::string>& contributions);
  Status ScatterContributions(const Response& r, const std::vector<std::string>& contributions, int group_size,
                              int member_index);
  Status GatherContributions(const Response& r, const std::vector<std::string>& contributions);
  Status ExchangeContributions(const Response& r, const std::vector<std::string>& contributions, int group_size,
                               int member_index);
  Status BroadcastContributions(const Response& r, const std::vector<std::string>& contributions,
                                const std::vector<int32_t>& members);
  // Copies the root's contribution of a broadcast into out (members: the set, sorted).
  void CopyRoot(const Response& r, const std::vector<const char*>& contributions, const std::vector<int32_t>& members,
                void* out);
  // Reduces elements [first, first + count) of every contribution into out, in member order, each
  // prescaled first (no postscale).
  void ReduceFrom(const std::vector<const char*>& contributions, size_t first, int64_t count, const Response& r,
                  void* out);
  // Reduces one tensor in its output buffer (no fusion copy) and completes it.
  Status ReduceInPlace(const CommGroup& group, Slot& slot);
  // Adasum of one tensor: the members' vectors are allgathered and combined on every member alike.
  Status RunAdasum(const CommGroup& group, Slot& slot);
  Status RunAllgather(const CommGroup& group, Slot& slot);
  Status RunBroadcast(const CommGroup& group, Slot& slot);
  Status RunAlltoall(const CommGroup& group, Slot& slot);
  Status RunReducescatter(const CommGroup& group, Slot& slot);

  Status RunOnDevice(const CommGroup& group, std::vector<Slot>& slots);

  uint8_t* FusionBuffer(int64_t bytes);
  // Where a result of bytes bytes (allgather, alltoall, reducescatter) is written: the caller's
  // output when it holds exactly that many (horo_tensor_t.output_bytes), else result->data.
  static uint8_t* ResultBuffer(const Slot& slot, int64_t bytes, HandleResult* result);

  struct SetTopology {
    std::vector<int> ranks;  // the members it was computed for
    HostTopology topology;
  };

  Config config_;
  int rank_;
  CountingTransport transport_;  // the collectives' view of the transport
  ProcessSetTable* sets_;
  MembersView members_view_;  // RunFromContributions' and RunAnnounced's set, read in place
  TensorQueue* queue_;
  HandleManager* handles_;
  AllreduceOptions allreduce_options_;
  bool small_message_bytes_tuned_ = false;  // the autotuner has set allreduce_options_.small_message_bytes
  std::vector<uint8_t> fusion_buffer_;
  std::mutex device_mutex_;                  // serialises EnableCuda
  std::unique_ptr<DeviceExecutor> device_owner_;
  std::atomic<DeviceExecutor*> device_{nullptr};  // published once enabled; read by both threads
  std::vector<int> host_ids_;  // the transport's host map, fetched before the first topology
  bool host_ids_fetched_ = false;
  std::map<int32_t, SetTopology> topologies_;
  std::atomic<int64_t> allreduce_runs_[kAllreduceAlgorithmCount] = {};
  std::atomic<int64_t> allgather_runs_[kAllgatherAlgorithmCount] = {};
  std::atomic<int64_t> allreduce_from_announcements_{0};
  std::atomic<int64_t> allgather_from_announcements_{0};
  std::atomic<int64_t> reducescatter_from_announcements_{0};
  std::atomic<int64_t> alltoall_from_announcements_{0};
  std::atomic<int64_t> broadcast_from_announcements_{0};
  std::vector<uint8_t> contribution_;  // ReduceContributions: one prescaled contribution
  std::vector<const char*> contribution_bytes_;
  std::vector<uint8_t> adasum_vectors_;  // every member's vector of one Adasum
  ExecutionTrace trace_;
};

}  // namespace horo
