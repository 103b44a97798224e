// HandleManager: integer handles for asynchronous operations. A user thread waits until the
// runtime's loop (the background thread or a driving caller, runtime_progress.cc) completes the handle with
// a Status and, for outputs the core allocates, the result bytes and shape: it spins for
// spin_microseconds first (yielding its core, common/spin.h), because a small collective often
// completes within that, then sleeps on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"

namespace horo {

// A vector whose resize leaves new bytes uninitialised: a result is written over whole before anyone
// reads it, and zeroing it first was one more pass over the memory.
template <typename T>
struct UninitialisedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitialisedAllocator<U>;
  };
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

struct HandleResult {
  std::vector<uint8_t, UninitialisedAllocator<uint8_t>> data;  // empty when written to the caller's output
  bool allocated = false;
  int64_t nbytes = 0;  // of the result, in data or in the caller's output
  std::vector<int64_t> shape;
  std::vector<int64_t> received_splits;
  int32_t value = -1;  // join: last rank to join; process set add: the new id
};

class HandleManager {
 public:
  explicit HandleManager(double spin_microseconds = 0) : spin_ns_(static_cast<int64_t>(spin_microseconds * 1e3)) {}

  int64_t Allocate();
  // Completes the handle; result may be null. Completing twice keeps the first outcome.
  void Complete(int64_t handle, const Status& status, HandleResult* result = nullptr);
  // Fails every incomplete handle with status (runtime shutdown or failure).
  void FailAll(const Status& status);

  Status Poll(int64_t handle, bool* done);
  // Blocks until done or timeout_seconds (< 0: forever); returns the operation's status, or
  // HORO_ERR_IN_PROGRESS on timeout. spin: spin first, as described above.
  Status Wait(int64_t handle, double timeout_seconds, bool spin = true);
  // The handle's completion flag, readable without a lock for as long as the pointer is held
  // (even after Release); null for an unknown handle.
  std::shared_ptr<const std::atomic<bool>> DoneFlag(int64_t handle);
  // The result of a completed handle, or null. Valid until Release.
  const HandleResult* Result(int64_t handle);
  Status Release(int64_t handle);

 private:
  struct State {
    std::atomic<bool> done{false};  // written under mutex_; read without it by a spinning waiter
    Status status;
    HandleResult result;
  };
  const int64_t spin_ns_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  int64_t next_handle_ = 1;
  // Shared so that a waiter keeps its state alive while it spins or sleeps unlocked, even if
  // another thread releases the handle meanwhile.
  std::unordered_map<int64_t, std::shared_ptr<State>> states_;
  // Released handles' nodes whose state nobody else held, reset for reuse: a loop of synchronous
  // collectives then allocates neither a node nor a state per call.
  std::vector<std::unordered_map<int64_t, std::shared_ptr<State>>::node_type> spare_;
};

}  // namespace horo
