// SpinRound: one round of a bounded busy wait, shared by every waiter that spins before it sleeps
// (the shared-memory transport, the control plane, a caller waiting on a handle).
//
// A round is a few CPU pause instructions; every few rounds it yields the rest of the time slice
// instead, so that on an oversubscribed host (more busy threads than cores) the thread being
// waited for gets the core rather than losing it to the spinner for a whole scheduler tick.
#pragma once

#include <sched.h>

namespace horo {

inline void SpinRound(int* round) {
  constexpr int kPausesPerRound = 16;
  constexpr int kRoundsPerYield = 4;
  if (++*round % kRoundsPerYield == 0) {
    ::sched_yield();
    return;
  }
  for (int i = 0; i < kPausesPerRound; ++i) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
  }
}

}  // namespace horo
