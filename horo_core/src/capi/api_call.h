// What every extern "C" entry point of horo/horo.h shares: the runtime handle with its count of
// calls in progress, the guard that registers a call on it, the calling thread's last error, and
// the macros that keep C++ exceptions from crossing the boundary (HORO_API_BEGIN/END) and refuse a
// missing or closing runtime (HORO_REQUIRE_RUNTIME). The entry points themselves are in
// horo_capi.cc (library, runtime, process sets, timeline) and horo_capi_ops.cc (collectives and
// their handles).
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "horo/horo.h"
#include "runtime/runtime.h"

// The runtime plus a count of API calls in progress on it: horo_runtime_destroy must not free it
// while another thread is still inside horo_wait or horo_poll (it shuts down first, which
// completes every handle, then waits for those calls to return).
struct horo_runtime {
  std::unique_ptr<horo::Runtime> impl;
  std::mutex mutex;
  std::condition_variable idle;
  int in_flight = 0;
  bool closing = false;
};

namespace horo_capi {

// Registers one API call on a runtime for its duration; refused once the runtime is closing.
class CallGuard {
 public:
  explicit CallGuard(horo_runtime* rt) : rt_(rt) {
    std::lock_guard<std::mutex> lock(rt_->mutex);
    admitted_ = !rt_->closing;
    if (admitted_) ++rt_->in_flight;
  }
  ~CallGuard() {
    if (!admitted_) return;
    std::lock_guard<std::mutex> lock(rt_->mutex);
    if (--rt_->in_flight == 0) rt_->idle.notify_all();
  }
  bool admitted() const { return admitted_; }

 private:
  horo_runtime* rt_;
  bool admitted_ = false;
};

// The calling thread's last failure, for horo_last_error().
inline thread_local std::string t_last_error;

inline horo_status_t SetError(const horo::Status& status) {
  // horo_last_error() keeps the last failure's message: a success leaves it (and the thread-local
  // lookup a write would cost on every call) alone.
  if (status.ok()) return HORO_OK;
  t_last_error = status.message();
  return status.code();
}

inline horo_status_t Fail(horo_status_t code, const std::string& message) {
  t_last_error = message;
  return code;
}

}  // namespace horo_capi

#define HORO_API_BEGIN() try {
#define HORO_API_END()                                                                     \
  }                                                                                        \
  catch (const std::exception& e) {                                                        \
    return horo_capi::Fail(HORO_ERR_INTERNAL, std::string("internal error: ") + e.what()); \
  }                                                                                        \
  catch (...) {                                                                            \
    return horo_capi::Fail(HORO_ERR_INTERNAL, "internal error: unknown exception");        \
  }

#define HORO_REQUIRE_RUNTIME(rt)                                                                       \
  if ((rt) == nullptr || !(rt)->impl)                                                                  \
    return horo_capi::Fail(HORO_ERR_NOT_INITIALIZED, "Horo runtime is not initialized");               \
  horo_capi::CallGuard call_guard(rt);                                                                 \
  if (!call_guard.admitted())                                                                          \
    return horo_capi::Fail(HORO_ERR_SHUT_DOWN, "Horo has been shut down: the runtime is being destroyed")
