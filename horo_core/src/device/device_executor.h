// DeviceExecutor: runs the collectives whose tensors live in CUDA memory (horo_tensor_t.device
// != 0), on the background thread, in the order the coordinator gave, like every other response.
//
// Per process set, the first such response decides how: the members exchange (NCCL loaded?, GPU
// UUID) over Horo's own transport; when every member has NCCL and its own GPU, the set gets an
// NCCL communicator (member 0 calls ncclGetUniqueId and broadcasts the id over the transport),
// otherwise (two ranks on one GPU, NCCL missing anywhere) the core stages through a reused pinned
// host buffer and runs its own host collective. Members with different NCCL versions stage too
// (NCCL does not support mixing them), and so do dtypes NCCL lacks (int16; bfloat16 before NCCL
// 2.10). The decision depends only on what every member saw, so all members take the same path.
// A communicator that reports an error or does not finish in time is aborted at once (NCCL's rule
// after an error), so that no kernel of it stays queued on the device.
//
// Ordering with the caller: the work waits on the caller's ready event (recorded on the stream
// that produced the inputs), runs on this executor's own stream, and the handle completes only
// once that stream has finished, so the output is valid for any stream and the host when
// synchronize() returns. Scale factors and Average's division are the adapter's job on this path
// (it has the device kernels); the core reduces with Sum (for Average too), Min, Max or Product.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "coordinator/response.h"
#include "device/cuda_driver.h"
#include "device/nccl_library.h"

namespace horo {

// One CUDA tensor of a response on this rank.
struct DeviceTensor {
  std::string name;
  const void* input = nullptr;
  void* output = nullptr;
  int64_t count = 0;
  int device = 0;              // CUDA ordinal
  void* ready_event = nullptr; // CUevent to wait on before reading input; may be null
};

struct DeviceExecutorOptions {
  std::string driver_path = "libcuda.so.1";
  std::string nccl_path;                 // empty: no NCCL, every CUDA collective is staged
  double progress_timeout_seconds = 30;  // a device collective that does not finish in this long fails
  std::string progress_timeout_variable = "HORO_PEER_TIMEOUT_SECONDS";  // named in that failure
};

class DeviceExecutor {
 public:
  static Status Create(int rank, const DeviceExecutorOptions& options, std::unique_ptr<DeviceExecutor>* out);
  ~DeviceExecutor();

  int nccl_version() const { return nccl_loaded_ ? nccl_.version() : 0; }
  // Whether an ordinal names a device of this process; used to validate tensors at enqueue.
  bool HasDevice(int ordinal) const { return ordinal >= 0 && ordinal < device_count_; }

  // Runs a fused allreduce or a broadcast of CUDA tensors; every member of group calls it for the
  // same response. host_allreduce: the algorithm settings for a staged allreduce, which the caller
  // derives from the response, so that every member stages alike. A non-OK status means the device
  // or the communicator failed.
  Status Run(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
             const AllreduceOptions& host_allreduce);

 private:
  struct SetState {
    std::vector<int> ranks;
    bool use_nccl = false;
    int nccl_version = 0;  // with use_nccl: every member's (they are equal)
    int device = -1;
    NcclComm comm = nullptr;
  };
  struct DeviceState {
    CuContext context = nullptr;
    CuStream stream = nullptr;
  };

  DeviceExecutor(int rank, const DeviceExecutorOptions& options) : rank_(rank), options_(options) {}

  Status Activate(int device, DeviceState** out);
  Status Decide(const CommGroup& group, int device, SetState* state);
  Status RunNccl(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
                 SetState& state, CuStream stream);
  Status LaunchNccl(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
                    const SetState& state, CuStream stream);
  Status RunStaged(const CommGroup& group, const Response& head, const std::vector<DeviceTensor>& tensors,
                   CuStream stream, const AllreduceOptions& host_allreduce);
  Status WaitForStream(CuStream stream, NcclComm comm, const std::string& what);
  Status Pinned(size_t bytes, uint8_t** out);
  std::string Where(const std::string& tensor) const;

  int rank_;
  DeviceExecutorOptions options_;
  CudaDriver cuda_;
  NcclLibrary nccl_;
  bool nccl_loaded_ = false;
  int device_count_ = 0;
  std::map<int, DeviceState> devices_;
  std::map<int32_t, SetState> sets_;
  uint8_t* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
};

}  // namespace horo
