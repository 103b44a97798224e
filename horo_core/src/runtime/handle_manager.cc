#include "runtime/handle_manager.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "common/spin.h"

namespace horo {

int64_t HandleManager::Allocate() {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t h = next_handle_++;
  if (spare_.empty()) {
    states_.emplace(h, std::make_shared<State>());
  } else {
    auto node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = h;
    states_.insert(std::move(node));
  }
  return h;
}

void HandleManager::Complete(int64_t handle, const Status& status, HandleResult* result) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = states_.find(handle);
    if (it == states_.end() || it->second->done) return;
    it->second->status = status;
    if (result != nullptr) it->second->result = std::move(*result);
    it->second->done.store(true, std::memory_order_release);
  }
  done_cv_.notify_all();
}

void HandleManager::FailAll(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& kv : states_) {
      if (!kv.second->done) {
        kv.second->status = status;
        kv.second->done.store(true, std::memory_order_release);
      }
    }
  }
  done_cv_.notify_all();
}

Status HandleManager::Poll(int64_t handle, bool* done) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Status::InvalidArgument("unknown handle " + std::to_string(handle));
  *done = it->second->done;
  return Status::OK();
}

std::shared_ptr<const std::atomic<bool>> HandleManager::DoneFlag(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  if (it == states_.end()) return nullptr;
  return std::shared_ptr<const std::atomic<bool>>(it->second, &it->second->done);
}

Status HandleManager::Wait(int64_t handle, double timeout_seconds, bool spin) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Status::InvalidArgument("unknown handle " + std::to_string(handle));
  const std::shared_ptr<State> state = it->second;
  if (!state->done && spin && spin_ns_ > 0 && timeout_seconds != 0) {
    lock.unlock();
    const auto spin = std::chrono::nanoseconds(timeout_seconds < 0 ? spin_ns_
                                                                    : std::min<int64_t>(spin_ns_, timeout_seconds * 1e9));
    const auto until = std::chrono::steady_clock::now() + spin;
    while (!state->done.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
      SpinRound();
    }
    lock.lock();
  }
  if (timeout_seconds < 0) {
    done_cv_.wait(lock, [&state] { return state->done.load(); });
  } else if (!done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                                [&state] { return state->done.load(); })) {
    return Status(HORO_ERR_IN_PROGRESS, "operation still in progress");
  }
  return state->status;
}

const HandleResult* HandleManager::Result(int64_t handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  if (it == states_.end() || !it->second->done) return nullptr;
  return &it->second->result;
}

Status HandleManager::Release(int64_t handle) {
  constexpr size_t kMostSpare = 64;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = states_.find(handle);
  if (it == states_.end()) return Status::InvalidArgument("unknown handle " + std::to_string(handle));
  // Copies are made only under mutex_ while the handle is listed: a count of one stays one.
  if (it->second.use_count() != 1 || spare_.size() >= kMostSpare) {
    states_.erase(it);
    return Status::OK();
  }
  auto node = states_.extract(it);
  State& state = *node.mapped();
  state.done.store(false, std::memory_order_relaxed);
  state.status = Status::OK();
  state.result = HandleResult();
  spare_.push_back(std::move(node));
  return Status::OK();
}

}  // namespace horo
