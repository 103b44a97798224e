#include "device/nccl_library.h"

#include <dlfcn.h>

namespace horo {
namespace {

template <typename Fn>
void Resolve(void* library, const char* symbol, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  if (*out == nullptr && missing != nullptr && missing->empty()) *missing = symbol;
}

}  // namespace

Status NcclLibrary::Load(const std::string& path, NcclLibrary* out) {
  if (path.empty()) return Status::InvalidArgument("NCCL library path is empty");
  dlerror();
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace. A bare soname that the
  // framework already loaded (torch loads libnccl.so.2) returns that same copy.
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return Status::Unsupported("cannot load NCCL from " + path + ": " + (why ? why : "unknown error"));
  }
  NcclLibrary lib;
  lib.path_ = path;
  std::string missing;
  Resolve(library, "ncclGetVersion", &lib.ncclGetVersion, &missing);
  Resolve(library, "ncclGetUniqueId", &lib.ncclGetUniqueId, &missing);
  Resolve(library, "ncclCommInitRank", &lib.ncclCommInitRank, &missing);
  Resolve(library, "ncclCommAbort", &lib.ncclCommAbort, &missing);
  Resolve(library, "ncclCommGetAsyncError", &lib.ncclCommGetAsyncError, &missing);
  Resolve(library, "ncclAllReduce", &lib.ncclAllReduce, &missing);
  Resolve(library, "ncclBroadcast", &lib.ncclBroadcast, &missing);
  Resolve(library, "ncclGroupStart", &lib.ncclGroupStart, &missing);
  Resolve(library, "ncclGroupEnd", &lib.ncclGroupEnd, &missing);
  Resolve(library, "ncclGetErrorString", &lib.ncclGetErrorString, &missing);
  Resolve(library, "ncclGetLastError", &lib.ncclGetLastError, nullptr);
  if (!missing.empty()) {
    dlclose(library);
    return Status::Unsupported(path + " is not an NCCL library: symbol " + missing + " is missing");
  }
  const NcclResult r = lib.ncclGetVersion(&lib.version_);
  if (r != kNcclSuccess) {
    dlclose(library);
    return Status::Unsupported("ncclGetVersion failed in " + path + " (NCCL error " + std::to_string(r) + ")");
  }
  // Kept loaded for the life of the process: communicators and their proxy threads outlive any
  // one runtime's teardown order, and unloading NCCL under them is unsafe.
  *out = lib;
  return Status::OK();
}

std::string NcclLibrary::Describe(const char* call, NcclResult result, NcclComm comm) const {
  std::string out = std::string(call) + " failed: ";
  out += ncclGetErrorString != nullptr ? ncclGetErrorString(result) : ("NCCL error " + std::to_string(result));
  if (ncclGetLastError != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') out += std::string(" (") + last + ")";
  }
  return out + " [library " + path_ + ", NCCL " + std::to_string(version_) + "]";
}

}  // namespace horo
