// TensorReader: reads a PyTorch tensor's description (dtype, device, shape, strides, data pointer)
// in the core, through the C interface that libtorch exports for ahead-of-time compiled code (the
// AOTInductor shim: aoti_torch_get_dtype, aoti_torch_get_sizes, ...), loaded with dlopen at run
// time. Nothing is compiled or linked against PyTorch.
//
// Why: a binding that calls the same small collective step after step would otherwise read those
// five facts through five Python attribute calls per call, each a trip through torch's Python
// layer; with more ranks than cores that was a quarter of a 4-byte allreduce's latency
// (docs/benchmarks.md, "The core reads the tensor"). Here each is a call of a few instructions.
//
// A shim handle is the address of an at::Tensor, and an at::Tensor is one pointer, to the
// tensor's TensorImpl (what Python's `tensor._cdata` gives): so the address of a word holding
// that pointer is a handle. The binding checks this once against a handle torch itself made
// (horo_torch/_reading.py) before it uses the reader.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "horo/horo.h"

namespace horo {

class TensorReader {
 public:
  // Loads the shim from library_path (libtorch_cpu.so, already loaded by torch). Unsupported
  // names the path and what dlopen said, or the missing symbol.
  static Status Load(const std::string& library_path, TensorReader* out);

  // Reads the tensor whose TensorImpl is at impl. False when torch refuses one of the reads (a
  // tensor without storage or strides: sparse, a wrapper subclass) or it has more than
  // HORO_MAX_DIMS dimensions.
  bool Read(uintptr_t impl, horo_tensor_facts_t* out) const;
  // Reads impl and compares it with expected (dtype, device type, shape; contiguous): true with
  // *data set when it matches.
  bool Matches(uintptr_t impl, const horo_tensor_facts_t& expected, uintptr_t* data) const;

 private:
  using Handle = void*;  // AtenTensorHandle: the address of an at::Tensor
  using GetInt32 = int32_t (*)(Handle, int32_t*);
  using GetInt64 = int32_t (*)(Handle, int64_t*);
  using GetInt64s = int32_t (*)(Handle, int64_t**);
  using GetPointer = int32_t (*)(Handle, void**);

  GetInt32 get_dtype_ = nullptr;
  GetInt32 get_device_type_ = nullptr;
  GetInt64 get_dim_ = nullptr;
  GetInt64s get_sizes_ = nullptr;
  GetInt64s get_strides_ = nullptr;
  GetPointer get_data_ptr_ = nullptr;
};

}  // namespace horo

// The C ABI's opaque reader.
struct horo_tensor_reader {
  horo::TensorReader reader;
};
