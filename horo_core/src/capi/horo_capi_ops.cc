// The collectives of horo/horo.h and their handles: enqueue, the calls that wait at once (run,
// run_at, run_result_at), and poll, wait, result and release.
#include <algorithm>
#include <string>
#include <vector>

#include "capi/api_call.h"

using horo_capi::Fail;
using horo_capi::SetError;

extern "C" {

void horo_op_options_init(horo_op_options_t* options) {
  options->process_set_id = HORO_GLOBAL_PROCESS_SET;
  options->reduce_op = HORO_OP_SUM;
  options->prescale_factor = 1.0;
  options->postscale_factor = 1.0;
  options->root_rank = 0;
  options->splits = nullptr;
  options->num_splits = 0;
  options->ready_event = nullptr;
  options->caller_waits = 0;
}

horo_status_t horo_enqueue(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensors, int32_t count,
                           const horo_op_options_t* options, horo_handle_t* handles) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (!horo::IsValidOpType(op_type)) return Fail(HORO_ERR_INVALID_ARGUMENT, "unknown operation " + std::to_string(op_type));
  horo_op_options_t defaults;
  horo_op_options_init(&defaults);
  return SetError(rt->impl->Enqueue(static_cast<horo::OpType>(op_type), tensors, count,
                                    options ? *options : defaults, handles));
  HORO_API_END();
}

horo_status_t horo_refuse(horo_runtime_t* rt, int32_t op_type, const char* const* names, int32_t count,
                          int32_t process_set_id, const char* reason, horo_handle_t* handles) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (!horo::IsValidOpType(op_type)) return Fail(HORO_ERR_INVALID_ARGUMENT, "unknown operation " + std::to_string(op_type));
  if (reason == nullptr || handles == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "refuse: reason or handles is null");
  return SetError(rt->impl->Refuse(static_cast<horo::OpType>(op_type), names, count, process_set_id, reason, handles));
  HORO_API_END();
}

namespace {

// The options of a call that waits at once (horo_run and horo_run_result_at): the caller's, or
// the defaults, with caller_waits set.
horo_op_options_t WaitingOptions(const horo_op_options_t* options) {
  horo_op_options_t waiting;
  if (options) {
    waiting = *options;
  } else {
    horo_op_options_init(&waiting);
  }
  waiting.caller_waits = 1;
  return waiting;
}

// A prepared description (the *_at entry points) with this call's addresses.
horo_tensor_t AtAddresses(const horo_tensor_t& tensor, uintptr_t input, uintptr_t output) {
  horo_tensor_t t = tensor;
  t.input = reinterpret_cast<const void*>(input);
  t.output = reinterpret_cast<void*>(output);
  return t;
}

}  // namespace

horo_status_t horo_run(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensors, int32_t count,
                       const horo_op_options_t* options) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (!horo::IsValidOpType(op_type)) return Fail(HORO_ERR_INVALID_ARGUMENT, "unknown operation " + std::to_string(op_type));
  const horo_op_options_t run_options = WaitingOptions(options);
  const horo::OpType op = static_cast<horo::OpType>(op_type);
  if (op != horo::OpType::kAllreduce && op != horo::OpType::kBroadcast && op != horo::OpType::kBarrier) {
    // The others produce results the core allocates (or a value), which only a handle can hand back.
    return Fail(HORO_ERR_INVALID_ARGUMENT, std::string("horo_run takes allreduce, broadcast and barrier; use "
                                                       "horo_enqueue and horo_handle_result for ") +
                                               horo::OpTypeName(op));
  }
  if (op != horo::OpType::kBarrier && count == 1 && tensors != nullptr) {  // an allreduce or a broadcast
    horo::Status express;
    if (rt->impl->RunExpress(op, tensors[0], run_options, &express)) return SetError(express);
  }
  const int32_t handle_count = op == horo::OpType::kBarrier || op == horo::OpType::kJoin ? 1 : std::max(count, 1);
  horo_handle_t one = 0;
  std::vector<horo_handle_t> many(handle_count > 1 ? handle_count : 0);
  horo_handle_t* handles = handle_count > 1 ? many.data() : &one;
  horo::Status st = rt->impl->Enqueue(op, tensors, count, run_options, handles);
  if (!st.ok()) return SetError(st);
  horo::Status first;
  for (int32_t i = 0; i < handle_count; ++i) {
    horo::Status done = rt->impl->Wait(handles[i], -1);
    rt->impl->handles().Release(handles[i]);
    if (first.ok() && !done.ok()) first = done;
  }
  return SetError(first);
  HORO_API_END();
}

horo_status_t horo_run_at(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                          const horo_op_options_t* options, uintptr_t input, uintptr_t output) {
  if (tensor == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null tensor");
  const horo_tensor_t t = AtAddresses(*tensor, input, output);
  return horo_run(rt, op_type, &t, 1, options);
}

horo_status_t horo_enqueue_at(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                              const horo_op_options_t* options, uintptr_t input, uintptr_t output,
                              horo_handle_t* handle) {
  if (tensor == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null tensor");
  const horo_tensor_t t = AtAddresses(*tensor, input, output);
  return horo_enqueue(rt, op_type, &t, 1, options, handle);
}

namespace {

void DescribeResult(const horo::HandleResult& r, horo_result_t* out) {
  out->data = r.allocated ? r.data.data() : nullptr;
  out->nbytes = r.nbytes;
  out->ndim = static_cast<int32_t>(r.shape.size());
  for (size_t i = 0; i < r.shape.size() && i < HORO_MAX_DIMS; ++i) out->shape[i] = r.shape[i];
  out->received_splits = r.received_splits.empty() ? nullptr : r.received_splits.data();
  out->num_received_splits = static_cast<int32_t>(r.received_splits.size());
  out->join_last_rank = r.value;
}

}  // namespace

horo_status_t horo_run_result_at(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                                 const horo_op_options_t* options, uintptr_t input, uintptr_t output,
                                 int64_t output_bytes, horo_result_t* result, horo_handle_t* handle) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (tensor == nullptr || result == nullptr || handle == nullptr) {
    return Fail(HORO_ERR_INVALID_ARGUMENT, "horo_run_result_at: null tensor, result or handle");
  }
  *handle = 0;
  const horo::OpType op = static_cast<horo::OpType>(op_type);
  if (!horo::IsValidOpType(op_type) ||
      (op != horo::OpType::kAllgather && op != horo::OpType::kAlltoall && op != horo::OpType::kReducescatter)) {
    return Fail(HORO_ERR_INVALID_ARGUMENT, "horo_run_result_at takes allgather, alltoall and reducescatter, got "
                                           "operation " + std::to_string(op_type));
  }
  const horo_op_options_t run_options = WaitingOptions(options);
  horo_tensor_t t = AtAddresses(*tensor, input, output);
  t.output_bytes = output_bytes;
  horo_handle_t h = 0;
  horo::Status st = rt->impl->Enqueue(op, &t, 1, run_options, &h);
  if (!st.ok()) return SetError(st);
  st = rt->impl->Wait(h, -1);
  const horo::HandleResult* r = st.ok() ? rt->impl->handles().Result(h) : nullptr;
  if (st.ok() && r == nullptr) st = horo::Status::Internal("horo_run_result_at: a completed operation has no result");
  if (!st.ok()) {
    rt->impl->handles().Release(h);
    return SetError(st);
  }
  DescribeResult(*r, result);
  // An alltoall's received splits outlive the handle in this thread's copy, so that a result
  // written to the guess leaves nothing to release.
  thread_local std::vector<int64_t> received_splits;
  received_splits.assign(r->received_splits.begin(), r->received_splits.end());
  result->received_splits = received_splits.empty() ? nullptr : received_splits.data();
  if (r->allocated) {
    *handle = h;  // the caller copies the result out, then releases
  } else {
    rt->impl->handles().Release(h);
  }
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_poll(horo_runtime_t* rt, horo_handle_t handle, int32_t* done) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  bool d = false;
  horo::Status st = rt->impl->handles().Poll(handle, &d);
  *done = d ? 1 : 0;
  return SetError(st);
  HORO_API_END();
}

horo_status_t horo_poll_driving(horo_runtime_t* rt, horo_handle_t handle, int32_t* done) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  bool d = false;
  horo::Status st = rt->impl->PollDriving(handle, &d);
  *done = d ? 1 : 0;
  return SetError(st);
  HORO_API_END();
}

horo_status_t horo_wait(horo_runtime_t* rt, horo_handle_t handle, double timeout_seconds) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  return SetError(rt->impl->Wait(handle, timeout_seconds));
  HORO_API_END();
}

horo_status_t horo_handle_result(horo_runtime_t* rt, horo_handle_t handle, horo_result_t* out) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  const horo::HandleResult* r = rt->impl->handles().Result(handle);
  if (r == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "handle is unknown or not complete");
  DescribeResult(*r, out);
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_release(horo_runtime_t* rt, horo_handle_t handle) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  return SetError(rt->impl->handles().Release(handle));
  HORO_API_END();
}

}  // extern "C"
