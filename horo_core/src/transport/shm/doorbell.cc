#include "transport/shm/doorbell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace horo {
namespace shm {
namespace {

// Shared (not FUTEX_PRIVATE) operations: the word lives in a mapping of several processes.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_ns) {
  timespec timeout;
  timeout.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
  timeout.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace

uint32_t Doorbell::Arm() {
  uint32_t armed = shared_->sequence.load(std::memory_order_acquire);
  shared_->sleeping.fetch_add(1, std::memory_order_seq_cst);
  return armed;
}

void Doorbell::Disarm() { shared_->sleeping.fetch_sub(1, std::memory_order_relaxed); }

void Doorbell::Wait(uint32_t armed, int64_t timeout_ns) {
  if (timeout_ns > 0) FutexWait(&shared_->sequence, armed, timeout_ns);
  shared_->sleeping.fetch_sub(1, std::memory_order_relaxed);
}

void Doorbell::Ring() {
  // The fence orders the caller's publish before the look at sleeping; while nobody sleeps (the
  // common case: the owner spins or works) the shared words are only read, so the line is not
  // pulled away from the owner's core on every ring.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (shared_->sleeping.load(std::memory_order_seq_cst) == 0) return;
  shared_->sequence.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&shared_->sequence);
}

void Doorbell::RingAlways() {
  shared_->sequence.fetch_add(1, std::memory_order_seq_cst);
  FutexWakeAll(&shared_->sequence);
}

}  // namespace shm
}  // namespace horo
