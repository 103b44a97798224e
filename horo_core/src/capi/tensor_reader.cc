#include "capi/tensor_reader.h"

#include <dlfcn.h>

#include "common/symbols.h"

namespace horo {
namespace {

constexpr int32_t kShimSuccess = 0;  // AOTI_TORCH_SUCCESS

// Row-major contiguity as torch defines it: no elements, or every dimension longer than one
// strided by the product of the sizes after it.
bool Contiguous(int64_t ndim, const int64_t* sizes, const int64_t* strides) {
  int64_t expected = 1;
  for (int64_t d = ndim - 1; d >= 0; --d) {
    if (sizes[d] == 0) return true;
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

}  // namespace

Status TensorReader::Load(const std::string& library_path, TensorReader* out) {
  dlerror();
  // RTLD_NOLOAD: only the copy torch has loaded, never a second one.
  void* library = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (library == nullptr) {
    const char* why = dlerror();
    return Status::Unsupported("cannot read tensors through " + library_path + " (not loaded by this process?): " +
                               (why ? why : "unknown error"));
  }
  TensorReader r;
  std::string missing;
  ResolveSymbol(library, "aoti_torch_get_dtype", &r.get_dtype_, &missing);
  ResolveSymbol(library, "aoti_torch_get_device_type", &r.get_device_type_, &missing);
  ResolveSymbol(library, "aoti_torch_get_dim", &r.get_dim_, &missing);
  ResolveSymbol(library, "aoti_torch_get_sizes", &r.get_sizes_, &missing);
  ResolveSymbol(library, "aoti_torch_get_strides", &r.get_strides_, &missing);
  ResolveSymbol(library, "aoti_torch_get_data_ptr", &r.get_data_ptr_, &missing);
  if (!missing.empty()) {
    dlclose(library);
    return Status::Unsupported(library_path + " does not export " + missing);
  }
  // The reference dlopen took is kept: torch's library stays loaded for the life of the process.
  *out = r;
  return Status::OK();
}

bool TensorReader::Read(uintptr_t impl, horo_tensor_facts_t* out) const {
  if (impl == 0) return false;
  Handle handle = &impl;  // the address of a word holding the TensorImpl's address: an at::Tensor
  int64_t ndim = 0;
  int64_t* sizes = nullptr;
  int64_t* strides = nullptr;
  void* data = nullptr;
  if (get_dim_(handle, &ndim) != kShimSuccess || ndim < 0 || ndim > HORO_MAX_DIMS ||
      get_dtype_(handle, &out->dtype) != kShimSuccess || get_device_type_(handle, &out->device_type) != kShimSuccess ||
      get_sizes_(handle, &sizes) != kShimSuccess || get_strides_(handle, &strides) != kShimSuccess ||
      get_data_ptr_(handle, &data) != kShimSuccess) {
    return false;
  }
  out->ndim = static_cast<int32_t>(ndim);
  for (int64_t d = 0; d < ndim; ++d) out->shape[d] = sizes[d];
  out->contiguous = Contiguous(ndim, sizes, strides) ? 1 : 0;
  out->data = reinterpret_cast<uintptr_t>(data);
  return true;
}

bool TensorReader::Matches(uintptr_t impl, const horo_tensor_facts_t& expected, uintptr_t* data) const {
  horo_tensor_facts_t facts;
  if (!Read(impl, &facts) || facts.dtype != expected.dtype || facts.device_type != expected.device_type ||
      facts.ndim != expected.ndim || facts.contiguous != 1) {
    return false;
  }
  for (int32_t d = 0; d < facts.ndim; ++d) {
    if (facts.shape[d] != expected.shape[d]) return false;
  }
  *data = facts.data;
  return true;
}

}  // namespace horo
