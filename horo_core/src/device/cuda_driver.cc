#include "device/cuda_driver.h"

#include <dlfcn.h>

#include "common/symbols.h"

namespace horo {

Status CudaDriver::Load(const std::string& path, CudaDriver* out) {
  dlerror();
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return Status::Unsupported("cannot load the CUDA driver library " + path + ": " + (why ? why : "unknown error"));
  }
  CudaDriver d;
  d.path_ = path;
  // Versioned names (cuMemcpyDtoHAsync_v2) are the ABI the driver keeps for the unversioned
  // prototypes of today's headers.
  std::string missing;
  ResolveSymbol(library, "cuInit", &d.cuInit, &missing);
  ResolveSymbol(library, "cuDeviceGet", &d.cuDeviceGet, &missing);
  ResolveSymbol(library, "cuDeviceGetCount", &d.cuDeviceGetCount, &missing);
  ResolveSymbol(library, "cuDeviceGetUuid", &d.cuDeviceGetUuid, &missing);
  ResolveSymbol(library, "cuDevicePrimaryCtxRetain", &d.cuDevicePrimaryCtxRetain, &missing);
  ResolveSymbol(library, "cuCtxSetCurrent", &d.cuCtxSetCurrent, &missing);
  ResolveSymbol(library, "cuCtxGetCurrent", &d.cuCtxGetCurrent, &missing);
  ResolveSymbol(library, "cuStreamCreate", &d.cuStreamCreate, &missing);
  ResolveSymbol(library, "cuStreamWaitEvent", &d.cuStreamWaitEvent, &missing);
  ResolveSymbol(library, "cuStreamQuery", &d.cuStreamQuery, &missing);
  ResolveSymbol(library, "cuMemcpyDtoHAsync_v2", &d.cuMemcpyDtoHAsync, &missing);
  ResolveSymbol(library, "cuMemcpyHtoDAsync_v2", &d.cuMemcpyHtoDAsync, &missing);
  ResolveSymbol(library, "cuMemHostAlloc", &d.cuMemHostAlloc, &missing);
  ResolveSymbol(library, "cuMemFreeHost", &d.cuMemFreeHost, &missing);
  ResolveSymbol(library, "cuGetErrorName", &d.cuGetErrorName, &missing);
  ResolveSymbol(library, "cuGetErrorString", &d.cuGetErrorString, &missing);
  if (!missing.empty()) {
    dlclose(library);
    return Status::Unsupported(path + " is not a usable CUDA driver library: symbol " + missing + " is missing");
  }
  // The library stays loaded for the life of the process: the driver is never unloaded safely
  // while contexts exist, and the handle is shared with the framework's own copy.
  const CuResult init = d.cuInit(0);
  if (init != kCudaSuccess) return Status::Unsupported(d.Describe("cuInit", init));
  *out = d;
  return Status::OK();
}

std::string CudaDriver::Describe(const char* call, CuResult result) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName == nullptr || cuGetErrorName(result, &name) != kCudaSuccess) name = nullptr;
  if (cuGetErrorString == nullptr || cuGetErrorString(result, &text) != kCudaSuccess) text = nullptr;
  std::string out = std::string(call) + " failed with CUDA error " + std::to_string(result);
  if (name != nullptr) out += std::string(" ") + name;
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out + " [driver " + path_ + "]";
}

}  // namespace horo
