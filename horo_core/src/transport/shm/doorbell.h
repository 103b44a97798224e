// Doorbell: the futex word on which one rank's waiting thread sleeps while it waits for any of its
// same-host peers, and which those peers ring after they make progress the rank may need. Two
// threads of the rank may sleep on it at once (the background thread waiting for control messages
// and a caller running a collective), so "sleeping" counts sleepers and a ring wakes them all.
//
// One doorbell per rank, in that rank's segment, so that a rank waiting for two peers at once (a
// ring step receives from one and sends to another) sleeps on one word. The protocol avoids both
// lost wake-ups and needless system calls:
//
//   owner (waiter)                          anyone (ringer)
//   v = sequence (acquire)                  publish ring progress (release)
//   sleeping += 1 (seq_cst)                 fence (seq_cst)
//   re-check the rings; if ready: Disarm    if sleeping: sequence += 1, FUTEX_WAKE (all)
//   FUTEX_WAIT(sequence, v, timeout)
//   sleeping -= 1
//
// The increment of sleeping and the fence order the two sides: a ringer that reads sleeping == 0
// comes before the owner's increment, so the owner's re-check sees the progress and it does not
// sleep; one that reads it set increments sequence after the owner read v, so FUTEX_WAIT returns at
// once or is woken.
// Waits always carry a timeout, because a peer that dies never rings.
#pragma once

#include <atomic>
#include <cstdint>

namespace horo {
namespace shm {

// Lives in shared memory; zero-initialised by the segment's creator.
struct DoorbellShared {
  alignas(64) std::atomic<uint32_t> sequence;
  alignas(64) std::atomic<uint32_t> sleeping;
  char padding[60];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be lock-free");

class Doorbell {
 public:
  Doorbell() = default;
  explicit Doorbell(DoorbellShared* shared) : shared_(shared) {}
  bool valid() const { return shared_ != nullptr; }

  // Owner: announces the intent to sleep and returns the value to pass to Wait().
  uint32_t Arm();
  // Owner: the re-check after Arm() found work; do not sleep.
  void Disarm();
  // Owner: sleeps until rung or timeout_ns passes (spurious returns are allowed), then disarms.
  void Wait(uint32_t armed, int64_t timeout_ns);

  // Anyone: wakes the owner if it sleeps. Call after the progress is published.
  void Ring();
  // Anyone: wakes the owner unconditionally (Close()).
  void RingAlways();

 private:
  DoorbellShared* shared_ = nullptr;
};

}  // namespace shm
}  // namespace horo
