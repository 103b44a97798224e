// NcclLibrary: NCCL loaded with dlopen at run time (libnccl.so.2 from the nvidia-nccl-cu12/cu13
// wheels, HORO_NCCL_LIBRARY, or the system), never linked at build time. The prototypes and enum
// values below are NCCL's public ABI (nccl.h, stable since NCCL 2.0; bfloat16 since 2.10),
// declared here so that no NCCL header is needed to build.
#pragma once

#include <string>

#include "common/status.h"

namespace horo {

using NcclResult = int;
using NcclComm = void*;
struct NcclUniqueId {
  char internal[128];
};

enum NcclDataType : int {
  kNcclInt8 = 0,
  kNcclUint8 = 1,
  kNcclInt32 = 2,
  kNcclUint32 = 3,
  kNcclInt64 = 4,
  kNcclUint64 = 5,
  kNcclFloat16 = 6,
  kNcclFloat32 = 7,
  kNcclFloat64 = 8,
  kNcclBfloat16 = 9,
};

enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3 };

constexpr NcclResult kNcclSuccess = 0;
constexpr NcclResult kNcclInProgress = 7;
// ncclBfloat16 exists from NCCL 2.10 (version codes are major * 10000 + minor * 100 + patch from
// 2.9 on, major * 1000 + minor * 100 + patch before: either way older versions compare lower).
constexpr int kNcclFirstBfloat16Version = 21000;

class NcclLibrary {
 public:
  // Loads the library at path (a path, or a bare name the dynamic linker searches) and reads its
  // version. The error names the path and what dlopen said, or the missing symbol when the file
  // is a shared library but not NCCL.
  static Status Load(const std::string& path, NcclLibrary* out);

  int version() const { return version_; }
  const std::string& path() const { return path_; }
  // "ncclAllReduce failed: unhandled cuda error (...) [library /path, NCCL 22907]".
  std::string Describe(const char* call, NcclResult result, NcclComm comm) const;

  NcclResult (*ncclGetVersion)(int* version) = nullptr;
  NcclResult (*ncclGetUniqueId)(NcclUniqueId* id) = nullptr;
  NcclResult (*ncclCommInitRank)(NcclComm* comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  NcclResult (*ncclCommAbort)(NcclComm comm) = nullptr;
  NcclResult (*ncclCommGetAsyncError)(NcclComm comm, NcclResult* result) = nullptr;
  NcclResult (*ncclAllReduce)(const void* send, void* recv, size_t count, int dtype, int op, NcclComm comm,
                              void* stream) = nullptr;
  NcclResult (*ncclBroadcast)(const void* send, void* recv, size_t count, int dtype, int root, NcclComm comm,
                              void* stream) = nullptr;
  NcclResult (*ncclGroupStart)() = nullptr;
  NcclResult (*ncclGroupEnd)() = nullptr;
  const char* (*ncclGetErrorString)(NcclResult result) = nullptr;
  const char* (*ncclGetLastError)(NcclComm comm) = nullptr;  // NCCL >= 2.13; may be null

 private:
  std::string path_;
  int version_ = 0;
};

}  // namespace horo
