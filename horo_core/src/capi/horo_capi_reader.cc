// The tensor reader of horo/horo.h (capi/tensor_reader.h) and the run whose tensors it reads.
#include <string>

#include "capi/api_call.h"
#include "capi/tensor_reader.h"

using horo_capi::Fail;
using horo_capi::SetError;

extern "C" {

horo_status_t horo_tensor_reader_open(const char* library_path, horo_tensor_reader_t** out) {
  HORO_API_BEGIN();
  if (library_path == nullptr || out == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null argument");
  auto reader = std::make_unique<horo_tensor_reader>();
  horo::Status st = horo::TensorReader::Load(library_path, &reader->reader);
  if (!st.ok()) return SetError(st);
  *out = reader.release();
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_tensor_reader_free(horo_tensor_reader_t* reader) {
  delete reader;
  return HORO_OK;
}

horo_status_t horo_tensor_reader_read(const horo_tensor_reader_t* reader, uintptr_t tensor, horo_tensor_facts_t* out) {
  HORO_API_BEGIN();
  if (reader == nullptr || out == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null argument");
  if (!reader->reader.Read(tensor, out)) {
    return Fail(HORO_ERR_UNSUPPORTED, "torch cannot describe this tensor (no storage or strides, or more than " +
                                          std::to_string(HORO_MAX_DIMS) + " dimensions)");
  }
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_run_read(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                            const horo_op_options_t* options, const horo_tensor_reader_t* reader,
                            const horo_tensor_facts_t* expected, uintptr_t input, uintptr_t output) {
  HORO_API_BEGIN();
  if (reader == nullptr || expected == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null reader or expected");
  uintptr_t input_data = 0;
  uintptr_t output_data = 0;
  if (!reader->reader.Matches(input, *expected, &input_data) ||
      (output != input && !reader->reader.Matches(output, *expected, &output_data))) {
    return Fail(HORO_ERR_TENSOR_CHANGED, "the tensor no longer matches its description");
  }
  return horo_run_at(rt, op_type, tensor, options, input_data, output == input ? input_data : output_data);
  HORO_API_END();
}

}  // extern "C"
