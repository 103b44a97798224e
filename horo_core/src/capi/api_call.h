// What every extern "C" entry point of horo/horo.h shares: the runtime handle with its count of
// calls in progress, the guard that registers a call on it, the calling thread's last error, and
// the macros that keep C++ exceptions from crossing the boundary (HORO_API_BEGIN/END) and refuse a
// missing or closing runtime (HORO_REQUIRE_RUNTIME). The entry points themselves are in
// horo_capi.cc (library, runtime, process sets, timeline) and horo_capi_ops.cc (collectives and
// their handles).
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "horo/horo.h"
#include "runtime/runtime.h"

// The runtime plus a count of API calls in progress on it. horo_runtime_close must not free the
// runtime while another thread is still inside horo_wait or horo_poll: it refuses new calls first,
// shuts down (which completes every handle, so those calls return), then waits for the count to
// fall to zero. The handle itself outlives the runtime until horo_runtime_release or
// horo_runtime_destroy: a binding may keep it in prepared calls, which are then refused.
struct horo_runtime {
  std::unique_ptr<horo::Runtime> impl;
  std::atomic<int> in_flight{0};
  std::atomic<bool> closing{false};  // refuse new calls: closing, closed, or forsaken (a forked child's copy)
  std::atomic<bool> freed{false};    // horo_runtime_close freed impl: horo_runtime_release may free the handle
  bool closed = false;               // a horo_runtime_close began (under mutex)
  std::mutex mutex;                  // with idle: horo_runtime_close waits for in_flight to reach zero
  std::condition_variable idle;
};

namespace horo_capi {

// Registers one API call on a runtime for its duration; refused once the runtime is closing. Two
// atomic operations per call, no lock (the per-step path of every collective comes through here);
// the count and the flag are sequentially consistent, so a call that saw no closing flag is
// counted before horo_runtime_close reads the count.
class CallGuard {
 public:
  explicit CallGuard(horo_runtime* rt) : rt_(rt) {
    rt_->in_flight.fetch_add(1);
    admitted_ = !rt_->closing.load();
    if (!admitted_) Leave();
  }
  ~CallGuard() {
    if (admitted_) Leave();
  }
  bool admitted() const { return admitted_; }

 private:
  void Leave() {
    if (rt_->in_flight.fetch_sub(1) == 1 && rt_->closing.load()) {
      std::lock_guard<std::mutex> lock(rt_->mutex);  // the closer checks the count under it, then waits
      rt_->idle.notify_all();
    }
  }

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

#define HORO_REQUIRE_RUNTIME(rt)                                                          \
  if ((rt) == nullptr)                                                                    \
    return horo_capi::Fail(HORO_ERR_NOT_INITIALIZED, "Horo runtime is not initialized");  \
  horo_capi::CallGuard call_guard(rt);                                                    \
  if (!call_guard.admitted())                                                             \
    return horo_capi::Fail(HORO_ERR_SHUT_DOWN, "Horo has been shut down: the runtime is closed")
