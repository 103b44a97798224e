// Executor: runs the responses of one negotiation round on this rank, in the agreed order: packs
// fused allreduces into the fusion buffer, applies scale factors, calls the collective
// algorithms, copies results out and completes the handles.
//
// Per-tensor problems (a mismatch the coordinator found) complete only the handles concerned; a
// failure of the data plane is returned, because after it the ranks no longer agree on what was
// sent, and the runtime must stop.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/collectives.h"
#include "common/config.h"
#include "coordinator/process_set_table.h"
#include "coordinator/response.h"
#include "coordinator/tensor_queue.h"
#include "runtime/handle_manager.h"
#include "transport/transport.h"

namespace horo {

class Executor {
 public:
  Executor(const Config& config, int rank, Transport* transport, ProcessSetTable* sets, TensorQueue* queue,
           HandleManager* handles);

  Status Execute(const FusedResponse& fused);
  // Autotune: the allreduce crossover changes between response lists, identically on every rank.
  void set_small_message_bytes(int64_t bytes) { allreduce_options_.small_message_bytes = bytes; }

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
  Status TakeSlot(const Response& response, Slot* slot);
  void Finish(Slot& slot, const Status& status, HandleResult* result = nullptr);

  Status RunAllreduce(const CommGroup& group, std::vector<Slot>& slots);
  Status RunAllgather(const CommGroup& group, Slot& slot);
  Status RunBroadcast(const CommGroup& group, Slot& slot);
  Status RunAlltoall(const CommGroup& group, Slot& slot);
  Status RunReducescatter(const CommGroup& group, Slot& slot);

  uint8_t* FusionBuffer(int64_t bytes);

  Config config_;
  int rank_;
  Transport* transport_;
  ProcessSetTable* sets_;
  TensorQueue* queue_;
  HandleManager* handles_;
  AllreduceOptions allreduce_options_;
  std::vector<uint8_t> fusion_buffer_;
};

}  // namespace horo
