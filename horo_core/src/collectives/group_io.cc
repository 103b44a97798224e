#include "collectives/group_io.h"

#include <string>

#include "collectives/reduce_kernels.h"

namespace horo {

Status CheckGroup(const CommGroup& group, const char* collective) {
  if (group.transport == nullptr) return Status::InvalidArgument(std::string(collective) + ": group has no transport");
  if (group.size() < 1) return Status::InvalidArgument(std::string(collective) + ": group has no members");
  if (group.index < 0 || group.index >= group.size()) {
    return Status::InvalidArgument(std::string(collective) + ": member index " + std::to_string(group.index) +
                                   " is outside a group of " + std::to_string(group.size()));
  }
  for (int member = 0; member < group.size(); ++member) {
    const int rank = group.ranks[member];
    if (rank < 0 || rank >= group.transport->size()) {
      return Status::InvalidArgument(std::string(collective) + ": member " + std::to_string(member) + " has rank " +
                                     std::to_string(rank) + ", outside a world of " +
                                     std::to_string(group.transport->size()));
    }
  }
  if (group.ranks[group.index] != group.transport->rank()) {
    return Status::InvalidArgument(std::string(collective) + ": member " + std::to_string(group.index) +
                                   " is rank " + std::to_string(group.ranks[group.index]) +
                                   " but the transport is rank " + std::to_string(group.transport->rank()));
  }
  return Status::OK();
}

Status CheckMemberSizes(const std::vector<int64_t>& sizes, int members, const char* collective, const char* what) {
  if (static_cast<int>(sizes.size()) != members) {
    return Status::InvalidArgument(std::string(collective) + ": " + std::to_string(sizes.size()) + " entries of " +
                                   what + " for a group of " + std::to_string(members));
  }
  for (int member = 0; member < members; ++member) {
    if (sizes[member] < 0) {
      return Status::InvalidArgument(std::string(collective) + ": negative " + what + " " +
                                     std::to_string(sizes[member]) + " for member " + std::to_string(member));
    }
  }
  return Status::OK();
}

Status CheckReduceOp(ReduceOp op, const char* collective) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kProduct:
      return Status::OK();
    default:
      return Status::InvalidArgument(std::string(collective) + ": reduce op " + ReduceOpName(op) +
                                     " is not one of Sum, Min, Max, Product");
  }
}

namespace {

struct ReduceSpec {
  DataType dtype;
  ReduceOp op;
};

void ReduceReceived(void* dst, const void* src, size_t count, const void* context) {
  const ReduceSpec* spec = static_cast<const ReduceSpec*>(context);
  ReduceInto(dst, src, static_cast<int64_t>(count), spec->dtype, spec->op);
}

Status WithStep(const Status& status, const char* phase, int step) {
  if (status.ok()) return status;
  return Status(status.code(), std::string(phase) + " step " + std::to_string(step) + ": " + status.message());
}

}  // namespace

Status ExchangeReduceWithMembers(const CommGroup& group, int send_index, const void* send_data, int64_t send_bytes,
                                 int recv_index, void* recv_data, int64_t recv_bytes, DataType dtype, ReduceOp op,
                                 std::vector<uint8_t>* scratch, const char* phase, int step) {
  const int send_peer = (send_index >= 0 && send_bytes > 0) ? group.peer(send_index) : -1;
  const int recv_peer = (recv_index >= 0 && recv_bytes > 0) ? group.peer(recv_index) : -1;
  if (recv_peer != -1) {
    const ReduceSpec spec{dtype, op};
    ReceiveReducer reducer;
    reducer.element_size = DataTypeSize(dtype);
    reducer.reduce = ReduceReceived;
    reducer.context = &spec;
    Status status = group.transport->SendRecvReduce(send_peer, send_data, send_peer == -1 ? 0 : send_bytes, recv_peer,
                                                    recv_data, static_cast<size_t>(recv_bytes), reducer);
    if (status.code() != HORO_ERR_UNSUPPORTED) return WithStep(status, phase, step);
  }
  if (recv_peer != -1 && static_cast<int64_t>(scratch->size()) < recv_bytes) scratch->resize(recv_bytes);
  HORO_RETURN_IF_ERROR(ExchangeWithMembers(group, send_index, send_data, send_bytes, recv_index, scratch->data(),
                                           recv_bytes, phase, step));
  if (recv_peer != -1) {
    ReduceInto(recv_data, scratch->data(), recv_bytes / static_cast<int64_t>(DataTypeSize(dtype)), dtype, op);
  }
  return Status::OK();
}

Status ExchangeWithMembers(const CommGroup& group, int send_index, const void* send_data, int64_t send_bytes,
                           int recv_index, void* recv_data, int64_t recv_bytes, const char* phase, int step,
                           bool uncached) {
  const int send_peer = (send_index >= 0 && send_bytes > 0) ? group.peer(send_index) : -1;
  const int recv_peer = (recv_index >= 0 && recv_bytes > 0) ? group.peer(recv_index) : -1;
  if (send_peer == -1 && recv_peer == -1) return Status::OK();
  const size_t send_len = send_peer == -1 ? 0 : static_cast<size_t>(send_bytes);
  const size_t recv_len = recv_peer == -1 ? 0 : static_cast<size_t>(recv_bytes);
  Transport* transport = group.transport;
  return WithStep(uncached ? transport->SendRecvUncached(send_peer, send_data, send_len, recv_peer, recv_data, recv_len)
                           : transport->SendRecv(send_peer, send_data, send_len, recv_peer, recv_data, recv_len),
                  phase, step);
}

}  // namespace horo
