// Request: one rank's announcement that a named tensor is ready for a collective, with everything
// the coordinator needs to check that all ranks agree. RequestList: what a rank sends per round.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace horo {

enum class RequestKind : int32_t {
  kTensor = 0,            // a collective on a tensor (or barrier / join, which carry no data)
  kProcessSetAdd = 1,     // ranks = members of the new set
  kProcessSetRemove = 2,  // process_set_id = the set to remove
};

struct Request {
  RequestKind kind = RequestKind::kTensor;
  int32_t rank = 0;  // global rank of the sender
  int32_t process_set_id = 0;
  OpType op_type = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale_factor = 1.0;
  double postscale_factor = 1.0;
  int32_t root_rank = 0;
  std::vector<int64_t> splits;  // alltoall
  std::string group_leader;     // name of the first tensor of a grouped call; empty if none
  int32_t group_size = 1;
  std::vector<int32_t> ranks;   // process set add
  int32_t device = 0;           // where the tensor lives: 0 host, d + 1 CUDA device d
  // Non-empty: this rank cannot take part, for this reason (an argument only it could check, such
  // as a dtype its binding cannot pass). The coordinator fails the tensor on every member with it.
  std::string refusal;
  // This rank's input bytes, for announcing a small cached allreduce with its data
  // (coordinator/peer_agreement.h). Local only: never on the wire.
  const void* input = nullptr;

  int64_t NumElements() const;
};

struct RequestList {
  std::vector<Request> requests;
  bool shutdown = false;  // this rank is shutting down
  std::string failure;    // non-empty: this rank failed with this message and is closing
  std::string timeline;   // non-empty: timeline events of this rank (timeline/event_batch.h)
};

class WireWriter;
// Appends one request to w, in the wire format of request lists.
void WriteRequest(WireWriter& w, const Request& r);

std::string SerializeRequestList(const RequestList& list);
Status ParseRequestList(const std::string& bytes, RequestList* out);

}  // namespace horo
