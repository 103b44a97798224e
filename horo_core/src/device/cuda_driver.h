// CudaDriver: the few CUDA driver API entry points the core uses, loaded from libcuda.so.1 with
// dlopen at run time. Nothing is linked against CUDA and no CUDA header is needed at build time:
// the prototypes below are declared here, with the driver's own types reduced to what the ABI
// says they are (handles are pointers, CUdevice an int, CUdeviceptr a 64-bit integer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace horo {

using CuResult = int;
using CuDevice = int;
using CuContext = void*;
using CuStream = void*;
using CuEvent = void*;
using CuDevicePtr = unsigned long long;

constexpr CuResult kCudaSuccess = 0;
constexpr CuResult kCudaErrorNotReady = 600;

class CudaDriver {
 public:
  // Loads the library at path (e.g. "libcuda.so.1") and calls cuInit. The error names the path
  // and what dlopen or the driver said.
  static Status Load(const std::string& path, CudaDriver* out);

  // "cuXxx failed on device 0: CUDA_ERROR_... (message)"; used in every error the core reports.
  std::string Describe(const char* call, CuResult result) const;

  CuResult (*cuInit)(unsigned int flags) = nullptr;
  CuResult (*cuDeviceGet)(CuDevice* device, int ordinal) = nullptr;
  CuResult (*cuDeviceGetCount)(int* count) = nullptr;
  CuResult (*cuDeviceGetUuid)(uint8_t uuid[16], CuDevice device) = nullptr;
  CuResult (*cuDevicePrimaryCtxRetain)(CuContext* ctx, CuDevice device) = nullptr;
  CuResult (*cuCtxSetCurrent)(CuContext ctx) = nullptr;
  CuResult (*cuCtxGetCurrent)(CuContext* ctx) = nullptr;
  CuResult (*cuStreamCreate)(CuStream* stream, unsigned int flags) = nullptr;
  CuResult (*cuStreamWaitEvent)(CuStream stream, CuEvent event, unsigned int flags) = nullptr;
  CuResult (*cuStreamQuery)(CuStream stream) = nullptr;
  CuResult (*cuMemcpyDtoHAsync)(void* dst, CuDevicePtr src, size_t bytes, CuStream stream) = nullptr;
  CuResult (*cuMemcpyHtoDAsync)(CuDevicePtr dst, const void* src, size_t bytes, CuStream stream) = nullptr;
  CuResult (*cuMemHostAlloc)(void** ptr, size_t bytes, unsigned int flags) = nullptr;
  CuResult (*cuMemFreeHost)(void* ptr) = nullptr;
  CuResult (*cuGetErrorName)(CuResult result, const char** name) = nullptr;
  CuResult (*cuGetErrorString)(CuResult result, const char** text) = nullptr;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace horo
