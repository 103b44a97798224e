// Response: the coordinator's decision about one tensor (or a barrier, join, error, process-set
// change, shutdown). FusedResponse: consecutive compatible responses executed as one collective.
// ResponseList: what the coordinator sends to every rank per round, in the one global order that
// every rank executes. Responses the ranks have seen before travel as response-cache ids.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"
#include "tuning/tuned_parameters.h"

namespace horo {

enum class ResponseKind : int32_t {
  kOp = 0,
  kError = 1,
  kProcessSetAdd = 2,
  kProcessSetRemove = 3,
  kShutdown = 4,
};

struct Response {
  ResponseKind kind = ResponseKind::kOp;
  OpType op_type = OpType::kAllreduce;
  int32_t process_set_id = 0;
  std::string name;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t root_rank = 0;
  std::vector<int64_t> shape;  // the agreed shape (allgather/alltoall: of the first member)
  // allgather: first dimension of every member; alltoall: the splits of every member, flattened
  // row-major (member m sends member_dims[m * n + j] rows to member j).
  std::vector<int64_t> member_dims;
  horo_status_t error_code = 0;
  std::string error_message;
  int32_t last_joined_rank = -1;
  std::vector<int32_t> ranks;  // process set add: the members
  std::vector<int32_t> joined_ranks;  // global ranks that had joined when this response was made
  bool on_device = false;  // the tensors live in CUDA memory on every member (device/device_executor.h)
  // Allreduce: the coordinator's algorithm settings. Every rank chooses the algorithm from these
  // rather than from its own environment, so that all members choose alike.
  Toggle hierarchical_allreduce = Toggle::kAuto;
  int64_t small_message_bytes = 64 * 1024;
  // The same-host ring allreduce runs slice by slice (collectives/allreduce_ring.cc): ranks that
  // cut different slices would pair the wrong bytes. 0: whole phases (shared memory is off).
  int64_t slice_bytes = 256 << 10;
  // Allgather: the coordinator's setting, for the same reason.
  Toggle hierarchical_allgather = Toggle::kAuto;
  // The coordinator's fusion threshold when it built this response: ranks that fuse cached steps
  // themselves (coordinator/peer_agreement.h) fuse up to this, whatever their own setting.
  int64_t fusion_threshold_bytes = 0;

  int64_t NumElements() const;
};

using FusedResponse = std::vector<Response>;

// Whether r may join the fused allreduce that head started (same set, dtype, reduce op, scale
// factors, joined ranks, device and algorithm settings); the byte budget is the caller's.
bool Fusable(const Response& head, const Response& r);

// One part of a fused response on the wire: either a cache id or a whole response, which the
// receiver stores under assign_id when that is >= 0.
struct ResponsePart {
  int64_t cache_id = -1;
  int64_t assign_id = -1;
  Response response;
};

struct ResponseList {
  // Autotune: parameters every rank applies before executing this list's responses.
  bool has_parameters = false;
  TunedParameters parameters;
  // Cache ids to drop once every part is read (ids are never reused, so a part may still name an
  // entry that this same list evicts).
  std::vector<int64_t> evicted_ids;
  std::vector<std::vector<ResponsePart>> fused;
  // With peer agreement (coordinator/peer_agreement.h): every rank applies this list right after
  // the round of that number, so that lists and cached steps interleave alike everywhere; -1: at
  // once (a failure shuts every rank down, whatever round it is in).
  int64_t after_round = 0;
};

std::string SerializeResponseList(const ResponseList& list);
Status ParseResponseList(const std::string& bytes, ResponseList* out);

// Whether list carries the coordinator's last word, a shutdown (never cached); *reason gets why.
bool ShutdownIn(const ResponseList& list, Status* reason);

}  // namespace horo
