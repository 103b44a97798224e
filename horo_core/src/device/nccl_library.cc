#include "device/nccl_library.h"

#include <dlfcn.h>

#include "common/symbols.h"

namespace horo {

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
  ResolveSymbol(library, "ncclGetVersion", &lib.ncclGetVersion, &missing);
  ResolveSymbol(library, "ncclGetUniqueId", &lib.ncclGetUniqueId, &missing);
  ResolveSymbol(library, "ncclCommInitRank", &lib.ncclCommInitRank, &missing);
  ResolveSymbol(library, "ncclCommAbort", &lib.ncclCommAbort, &missing);
  ResolveSymbol(library, "ncclCommGetAsyncError", &lib.ncclCommGetAsyncError, &missing);
  ResolveSymbol(library, "ncclAllReduce", &lib.ncclAllReduce, &missing);
  ResolveSymbol(library, "ncclBroadcast", &lib.ncclBroadcast, &missing);
  ResolveSymbol(library, "ncclGroupStart", &lib.ncclGroupStart, &missing);
  ResolveSymbol(library, "ncclGroupEnd", &lib.ncclGroupEnd, &missing);
  ResolveSymbol(library, "ncclGetErrorString", &lib.ncclGetErrorString, &missing);
  ResolveSymbol(library, "ncclGetLastError", &lib.ncclGetLastError, nullptr);
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
