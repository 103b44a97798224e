#include "device/device_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "common/logging.h"

namespace horo {
namespace {

constexpr unsigned int kStreamNonBlocking = 1;     // CU_STREAM_NON_BLOCKING
constexpr unsigned int kHostAllocPortable = 1;     // CU_MEMHOSTALLOC_PORTABLE: pinned for every context

// What each member tells the others before the first device collective of a process set.
struct Probe {
  int32_t nccl_version;
  int32_t device;
  uint8_t uuid[16];
};

// Member 0's NCCL id, with whether ncclGetUniqueId worked, so that all members fail together.
struct IdMessage {
  int32_t ok;
  NcclUniqueId id;
};

// NCCL has no bool: bools travel as uint8, where or = max and and = min keep 0/1 values (the host
// collectives define Sum/Max on bool as or, Min/Product as and).
bool NcclTypeOf(DataType dtype, int* out) {
  switch (dtype) {
    case DataType::kUInt8: case DataType::kBool: *out = kNcclUint8; return true;
    case DataType::kInt8: *out = kNcclInt8; return true;
    case DataType::kInt32: *out = kNcclInt32; return true;
    case DataType::kInt64: *out = kNcclInt64; return true;
    case DataType::kFloat16: *out = kNcclFloat16; return true;
    case DataType::kBFloat16: *out = kNcclBfloat16; return true;
    case DataType::kFloat32: *out = kNcclFloat32; return true;
    case DataType::kFloat64: *out = kNcclFloat64; return true;
    default: return false;  // int16, uint16
  }
}

int NcclOpOf(ReduceOp op, DataType dtype) {
  const bool boolean = dtype == DataType::kBool;
  switch (op) {
    case ReduceOp::kMin: return kNcclMin;
    case ReduceOp::kMax: return kNcclMax;
    case ReduceOp::kProduct: return boolean ? kNcclMin : kNcclProd;
    default: return boolean ? kNcclMax : kNcclSum;  // Sum, and Average (the adapter divides)
  }
}

ReduceOp HostOpOf(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

CuDevicePtr DevicePtr(const void* p) { return static_cast<CuDevicePtr>(reinterpret_cast<uintptr_t>(p)); }

}  // namespace

Status DeviceExecutor::Create(int rank, const DeviceExecutorOptions& options, std::unique_ptr<DeviceExecutor>* out) {
  std::unique_ptr<DeviceExecutor> ex(new DeviceExecutor(rank, options));
  HORO_RETURN_IF_ERROR(CudaDriver::Load(options.driver_path, &ex->cuda_));
  const CuResult r = ex->cuda_.cuDeviceGetCount(&ex->device_count_);
  if (r != kCudaSuccess) return Status::Unsupported(ex->cuda_.Describe("cuDeviceGetCount", r));
  if (!options.nccl_path.empty()) {
    HORO_RETURN_IF_ERROR(NcclLibrary::Load(options.nccl_path, &ex->nccl_));
    ex->nccl_loaded_ = true;
  }
  HORO_LOG(kInfo, rank) << "CUDA tensors enabled: " << ex->device_count_ << " device(s), driver "
                        << options.driver_path << ", NCCL "
                        << (ex->nccl_loaded_ ? std::to_string(ex->nccl_.version()) + " from " + options.nccl_path
                                             : std::string("not loaded (CUDA tensors are staged through host memory)"));
  *out = std::move(ex);
  return Status::OK();
}

DeviceExecutor::~DeviceExecutor() {
  // Communicators are aborted rather than destroyed: destroy is collective and the peers may be
  // gone already at teardown.
  for (auto& kv : sets_) {
    if (kv.second.comm != nullptr) nccl_.ncclCommAbort(kv.second.comm);
  }
  if (pinned_ != nullptr) cuda_.cuMemFreeHost(pinned_);
}

std::string DeviceExecutor::Where(const std::string& tensor) const {
  return "tensor '" + tensor + "' on rank " + std::to_string(rank_);
}

Status DeviceExecutor::Activate(int device, DeviceState** out) {
  DeviceState& d = devices_[device];
  if (d.context == nullptr) {
    CuDevice dev = 0;
    CuResult r = cuda_.cuDeviceGet(&dev, device);
    if (r == kCudaSuccess) r = cuda_.cuDevicePrimaryCtxRetain(&d.context, dev);
    if (r != kCudaSuccess) {
      devices_.erase(device);
      return Status::Internal(cuda_.Describe("cuDevicePrimaryCtxRetain", r) + " for CUDA device " +
                              std::to_string(device) + " on rank " + std::to_string(rank_));
    }
  }
  CuResult r = cuda_.cuCtxSetCurrent(d.context);
  if (r == kCudaSuccess && d.stream == nullptr) r = cuda_.cuStreamCreate(&d.stream, kStreamNonBlocking);
  if (r != kCudaSuccess) return Status::Internal(cuda_.Describe("cuStreamCreate", r) + " on rank " + std::to_string(rank_));
  *out = &d;
  return Status::OK();
}

Status DeviceExecutor::Decide(const CommGroup& group, int device, SetState* state) {
  Probe mine{};
  mine.nccl_version = nccl_version();
  mine.device = device;
  CuDevice dev = 0;
  CuResult r = cuda_.cuDeviceGet(&dev, device);
  if (r == kCudaSuccess) r = cuda_.cuDeviceGetUuid(mine.uuid, dev);
  if (r != kCudaSuccess) return Status::Internal(cuda_.Describe("cuDeviceGetUuid", r) + " on rank " + std::to_string(rank_));
  const int n = group.size();
  std::vector<Probe> all(n);
  HORO_RETURN_IF_ERROR(Allgather(group, &mine, all.data(), std::vector<int64_t>(n, sizeof(Probe))));
  std::set<std::string> uuids;
  bool every_member_has_nccl = true;
  bool one_version = true;
  for (const Probe& p : all) {
    uuids.insert(std::string(reinterpret_cast<const char*>(p.uuid), sizeof(p.uuid)));
    every_member_has_nccl = every_member_has_nccl && p.nccl_version > 0;
    one_version = one_version && p.nccl_version == all.front().nccl_version;
  }
  const bool own_gpus = static_cast<int>(uuids.size()) == n;
  state->ranks = group.ranks;
  state->device = device;
  state->use_nccl = every_member_has_nccl && one_version && own_gpus;
  state->nccl_version = state->use_nccl ? all.front().nccl_version : 0;
  const char* why = !own_gpus                ? "members share a GPU"
                    : !every_member_has_nccl ? "NCCL is not loaded on every member"
                                             : "the members' NCCL versions differ";
  HORO_LOG(kInfo, rank_) << "CUDA collectives of a process set of " << n << " member(s) on device " << device << ": "
                         << (state->use_nccl ? std::string("NCCL") : std::string("staged through host memory (") + why + ")");
  if (!state->use_nccl) return Status::OK();

  IdMessage msg{};
  if (group.index == 0) {
    const NcclResult nr = nccl_.ncclGetUniqueId(&msg.id);
    msg.ok = nr == kNcclSuccess ? 1 : 0;
    if (nr != kNcclSuccess) {
      HORO_LOG(kError, rank_) << nccl_.Describe("ncclGetUniqueId", nr, nullptr);
    }
  }
  HORO_RETURN_IF_ERROR(Broadcast(group, &msg, sizeof(msg), 0));
  if (!msg.ok) {
    return Status::Internal("ncclGetUniqueId failed on rank " + std::to_string(group.ranks[0]) + " [library " +
                            nccl_.path() + "]");
  }
  const NcclResult nr = nccl_.ncclCommInitRank(&state->comm, n, msg.id, group.index);
  if (nr != kNcclSuccess) {
    state->comm = nullptr;
    return Status::Internal(nccl_.Describe("ncclCommInitRank", nr, nullptr) + " on rank " + std::to_string(rank_));
  }
  return Status::OK();
}

Status DeviceExecutor::Run(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
                           const AllreduceOptions& host_allreduce) {
  const int device = tensors.front().device;
  for (const DeviceTensor& t : tensors) {
    if (t.device != device) {
      return Status::InvalidArgument(Where(t.name) + " is on CUDA device " + std::to_string(t.device) +
                                     " but was fused with tensor '" + tensors.front().name + "' on device " +
                                     std::to_string(device) + "; one rank must use one GPU");
    }
  }
  // Device work may run in a user thread that waits on a handle (runtime/runtime_progress.cc):
  // give that thread its own current context back afterwards.
  CuContext callers_context = nullptr;
  const bool saved = cuda_.cuCtxGetCurrent(&callers_context) == kCudaSuccess;
  struct Restore {
    const CudaDriver& cuda;
    bool saved;
    CuContext context;
    ~Restore() {
      if (saved) cuda.cuCtxSetCurrent(context);
    }
  } restore{cuda_, saved, callers_context};
  DeviceState* dev = nullptr;
  HORO_RETURN_IF_ERROR(Activate(device, &dev));

  SetState& state = sets_[head.process_set_id];
  if (state.ranks != group.ranks) {  // first device collective of this set (or a new set of that id)
    if (state.comm != nullptr) nccl_.ncclCommAbort(state.comm);
    state = SetState();
    HORO_RETURN_IF_ERROR(Decide(group, device, &state));
  }
  if (state.device != device) {
    return Status::InvalidArgument(Where(tensors.front().name) + " is on CUDA device " + std::to_string(device) +
                                   " but process set " + std::to_string(head.process_set_id) +
                                   " ran its CUDA collectives on device " + std::to_string(state.device) +
                                   " of this rank; one rank must use one GPU");
  }

  std::vector<void*> waited;
  for (const DeviceTensor& t : tensors) {
    if (t.ready_event == nullptr || std::find(waited.begin(), waited.end(), t.ready_event) != waited.end()) continue;
    waited.push_back(t.ready_event);
    const CuResult r = cuda_.cuStreamWaitEvent(dev->stream, t.ready_event, 0);
    if (r != kCudaSuccess) return Status::Internal(cuda_.Describe("cuStreamWaitEvent", r) + " for " + Where(t.name));
  }
  int nccl_type = 0;
  const bool nccl_can =
      head.op_type == OpType::kBroadcast ||
      (NcclTypeOf(head.dtype, &nccl_type) &&
       (head.dtype != DataType::kBFloat16 || state.nccl_version >= kNcclFirstBfloat16Version));
  if (state.use_nccl && nccl_can) return RunNccl(group, head, tensors, state, dev->stream);
  return RunStaged(group, head, tensors, dev->stream, host_allreduce);
}

Status DeviceExecutor::RunNccl(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
                               SetState& state, CuStream stream) {
  Status st = LaunchNccl(group, head, tensors, state, stream);
  if (!st.ok()) {
    // After an error or a timeout nothing can be assumed about what is queued on the communicator
    // (NCCL's rule): abort it, so that no kernel of it stays on this executor's stream waiting for
    // a peer, which would block whatever synchronises the device afterwards (torch.cuda.synchronize,
    // the caching allocator's retry after running out of memory). The runtime stops after this
    // error; the state is forgotten so that the teardown does not abort the communicator again.
    nccl_.ncclCommAbort(state.comm);
    state = SetState();
  }
  return st;
}

Status DeviceExecutor::LaunchNccl(const CommGroup& group, const Response& head,
                                  const std::vector<DeviceTensor>& tensors, const SetState& state, CuStream stream) {
  const std::string& first = tensors.front().name;
  NcclResult r = kNcclSuccess;
  if (head.op_type == OpType::kBroadcast) {
    const DeviceTensor& t = tensors.front();
    const int root = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), head.root_rank) -
                                      group.ranks.begin());
    const size_t bytes = static_cast<size_t>(t.count) * DataTypeSize(head.dtype);
    if (bytes > 0) r = nccl_.ncclBroadcast(t.input, t.output, bytes, kNcclUint8, root, state.comm, stream);
    if (r != kNcclSuccess) return Status::Internal(nccl_.Describe("ncclBroadcast", r, state.comm) + " for " + Where(first));
  } else {
    int dtype = 0;
    NcclTypeOf(head.dtype, &dtype);
    const int op = NcclOpOf(head.reduce_op, head.dtype);
    // One group call: NCCL launches the fused tensors together, with no fusion-buffer copy.
    r = nccl_.ncclGroupStart();
    for (const DeviceTensor& t : tensors) {
      if (r != kNcclSuccess || t.count == 0) continue;
      r = nccl_.ncclAllReduce(t.input, t.output, static_cast<size_t>(t.count), dtype, op, state.comm, stream);
    }
    const NcclResult end = nccl_.ncclGroupEnd();
    if (r == kNcclSuccess) r = end;
    if (r != kNcclSuccess) return Status::Internal(nccl_.Describe("ncclAllReduce", r, state.comm) + " for " + Where(first));
  }
  return WaitForStream(stream, state.comm, "NCCL " + std::string(OpTypeName(head.op_type)) + " of " + Where(first));
}

Status DeviceExecutor::Pinned(size_t bytes, uint8_t** out) {
  if (bytes > pinned_bytes_) {
    if (pinned_ != nullptr) cuda_.cuMemFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    size_t grown = 1 << 20;
    while (grown < bytes) grown *= 2;
    void* p = nullptr;
    const CuResult r = cuda_.cuMemHostAlloc(&p, grown, kHostAllocPortable);
    if (r != kCudaSuccess) {
      return Status::Internal(cuda_.Describe("cuMemHostAlloc", r) + " (" + std::to_string(grown) +
                              " bytes of pinned staging memory) on rank " + std::to_string(rank_));
    }
    pinned_ = static_cast<uint8_t*>(p);
    pinned_bytes_ = grown;
  }
  *out = pinned_;
  return Status::OK();
}

Status DeviceExecutor::RunStaged(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
                                 CuStream stream,
                                 const AllreduceOptions& host_allreduce) {
  const std::string& first = tensors.front().name;
  const size_t esize = DataTypeSize(head.dtype);
  size_t total = 0;
  for (const DeviceTensor& t : tensors) total += static_cast<size_t>(t.count) * esize;
  uint8_t* host = nullptr;
  HORO_RETURN_IF_ERROR(Pinned(total, &host));
  const bool broadcast = head.op_type == OpType::kBroadcast;
  int root = 0;
  if (broadcast) {
    root = static_cast<int>(std::find(group.ranks.begin(), group.ranks.end(), head.root_rank) - group.ranks.begin());
  }
  // Device to host (only the root's input matters for a broadcast).
  size_t offset = 0;
  for (const DeviceTensor& t : tensors) {
    const size_t bytes = static_cast<size_t>(t.count) * esize;
    if (bytes > 0 && (!broadcast || group.index == root)) {
      const CuResult r = cuda_.cuMemcpyDtoHAsync(host + offset, DevicePtr(t.input), bytes, stream);
      if (r != kCudaSuccess) return Status::Internal(cuda_.Describe("cuMemcpyDtoHAsync", r) + " for " + Where(t.name));
    }
    offset += bytes;
  }
  HORO_RETURN_IF_ERROR(WaitForStream(stream, nullptr, "device-to-host copy of " + Where(first)));
  if (broadcast) {
    HORO_RETURN_IF_ERROR(Broadcast(group, host, static_cast<int64_t>(total), root));
  } else {
    HORO_RETURN_IF_ERROR(Allreduce(group, host, static_cast<int64_t>(total / esize), head.dtype,
                                   HostOpOf(head.reduce_op), host_allreduce));
  }
  offset = 0;
  for (const DeviceTensor& t : tensors) {
    const size_t bytes = static_cast<size_t>(t.count) * esize;
    if (bytes > 0) {
      const CuResult r = cuda_.cuMemcpyHtoDAsync(DevicePtr(t.output), host + offset, bytes, stream);
      if (r != kCudaSuccess) return Status::Internal(cuda_.Describe("cuMemcpyHtoDAsync", r) + " for " + Where(t.name));
    }
    offset += bytes;
  }
  return WaitForStream(stream, nullptr, "host-to-device copy of " + Where(first));
}

Status DeviceExecutor::WaitForStream(CuStream stream, NcclComm comm, const std::string& what) {
  // Polls instead of cuStreamSynchronize so that an NCCL failure (ncclCommGetAsyncError) or a
  // peer that never joins ends in an error naming the tensor rather than a hang.
  const auto start = std::chrono::steady_clock::now();
  const auto limit = std::chrono::duration<double>(options_.progress_timeout_seconds);
  for (int spins = 0;; ++spins) {
    const CuResult r = cuda_.cuStreamQuery(stream);
    if (r == kCudaSuccess) return Status::OK();
    if (r != kCudaErrorNotReady) return Status::Internal(cuda_.Describe("cuStreamQuery", r) + " during " + what);
    if (comm != nullptr) {
      NcclResult async = kNcclSuccess;
      nccl_.ncclCommGetAsyncError(comm, &async);
      if (async != kNcclSuccess && async != kNcclInProgress) {
        const std::string text = nccl_.Describe("NCCL", async, comm);
        return Status::Internal(text + " during " + what);
      }
    }
    if (std::chrono::steady_clock::now() - start > limit) {
      return Status::Timeout(what + " did not finish within " + std::to_string(options_.progress_timeout_seconds) +
                             " s (" + options_.progress_timeout_variable + "); a peer may have died or be stuck");
    }
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace horo
