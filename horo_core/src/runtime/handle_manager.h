// HandleManager: integer handles for asynchronous operations. A user thread waits on a condition
// variable (never spinning) until the background thread completes the handle with a Status and,
// for outputs the core allocates, the result bytes and shape.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace horo {

struct HandleResult {
  std::vector<uint8_t> data;  // empty when the caller supplied the output
  bool allocated = false;
  std::vector<int64_t> shape;
  std::vector<int64_t> received_splits;
  int32_t value = -1;  // join: last rank to join; process set add: the new id
};

class HandleManager {
 public:
  int64_t Allocate();
  // Completes the handle; result may be null. Completing twice keeps the first outcome.
  void Complete(int64_t handle, const Status& status, HandleResult* result = nullptr);
  // Fails every incomplete handle with status (runtime shutdown or failure).
  void FailAll(const Status& status);

  Status Poll(int64_t handle, bool* done);
  // Blocks until done or timeout_seconds (< 0: forever); returns the operation's status, or
  // HORO_ERR_IN_PROGRESS on timeout.
  Status Wait(int64_t handle, double timeout_seconds);
  // The result of a completed handle, or null. Valid until Release.
  const HandleResult* Result(int64_t handle);
  Status Release(int64_t handle);

 private:
  struct State {
    bool done = false;
    Status status;
    HandleResult result;
  };
  std::mutex mutex_;
  std::condition_variable done_cv_;
  int64_t next_handle_ = 1;
  std::unordered_map<int64_t, std::unique_ptr<State>> states_;
};

}  // namespace horo
