// The Executor's side of CUDA tensors: enabling the device executor, validating CUDA tensors at
// enqueue, and handing device responses to it. Kept apart from executor.cc so that the host path
// reads without any of this.
#include "runtime/executor.h"

namespace horo {

Executor::~Executor() = default;

Status Executor::EnableCuda(const std::string& nccl_path, int32_t* nccl_version) {
  std::lock_guard<std::mutex> lock(device_mutex_);
  if (device_owner_ == nullptr) {
    DeviceExecutorOptions options;
    options.nccl_path = nccl_path;
    options.progress_timeout_seconds = config_.peer_timeout_seconds;
    options.progress_timeout_variable = config_.VariableName("PEER_TIMEOUT_SECONDS");
    HORO_RETURN_IF_ERROR(DeviceExecutor::Create(rank_, options, &device_owner_));
    device_.store(device_owner_.get(), std::memory_order_release);
  }
  *nccl_version = device_owner_->nccl_version();
  return Status::OK();
}

Status Executor::CheckDeviceTensor(OpType op, const horo_tensor_t& tensor, const std::string& label) const {
  if (tensor.device < 0) {
    return Status::InvalidArgument(label + ": device must be HORO_DEVICE_HOST (0) or HORO_DEVICE_CUDA_BASE + a CUDA "
                                           "ordinal, got " + std::to_string(tensor.device));
  }
  const DeviceExecutor* device = device_.load(std::memory_order_acquire);
  const int ordinal = tensor.device - HORO_DEVICE_CUDA_BASE;
  if (device == nullptr) {
    return Status::Unsupported(label + ": tensor is in CUDA device " + std::to_string(ordinal) +
                               " memory but CUDA is not enabled on rank " + std::to_string(rank_) +
                               " (horo_cuda_enable was not called or failed)");
  }
  if (op != OpType::kAllreduce && op != OpType::kBroadcast) {
    return Status::Unsupported(label + ": the core takes CUDA memory for allreduce and broadcast only; stage " +
                               OpTypeName(op) + " through host memory");
  }
  if (!device->HasDevice(ordinal)) {
    return Status::InvalidArgument(label + ": CUDA device " + std::to_string(ordinal) + " does not exist on rank " +
                                   std::to_string(rank_));
  }
  return Status::OK();
}

Status Executor::RunOnDevice(const CommGroup& group, std::vector<Slot>& slots) {
  DeviceExecutor* device = device_.load(std::memory_order_acquire);
  const Response& head = *slots.front().response;
  if (device == nullptr) {  // unreachable: enqueue refuses CUDA tensors until enabled
    return Status::Internal("CUDA response for tensor '" + head.name + "' but CUDA is not enabled on rank " +
                            std::to_string(rank_));
  }
  std::vector<DeviceTensor> tensors;
  for (const Slot& s : slots) {
    DeviceTensor t;
    t.name = s.response->name;
    t.input = s.entry.input;
    t.output = s.entry.output;
    t.count = s.response->NumElements();
    t.device = s.entry.request.device - HORO_DEVICE_CUDA_BASE;
    t.ready_event = s.entry.ready_event;
    tensors.push_back(std::move(t));
  }
  AllreduceOptions host_allreduce;
  HORO_RETURN_IF_ERROR(AllreduceOptionsFor(group, head, &host_allreduce));
  HORO_RETURN_IF_ERROR(device->Run(group, head, tensors, host_allreduce));
  for (Slot& s : slots) Finish(s, Status::OK());
  return Status::OK();
}

}  // namespace horo
