// SpinRound: one round of a bounded busy wait, shared by every waiter that spins before it sleeps
// (the shared-memory transport, the control plane, a caller waiting on a handle).
//
// A round yields the rest of the time slice (sched_yield), so that on an oversubscribed host (more
// busy threads than cores) the thread being waited for gets the core rather than losing it to the
// spinner for a whole scheduler tick; with a core to itself, the system call returns at once and
// paces the loop. Measured on 2 cores (docs/benchmarks.md): yielding every round instead of every
// fourth (with CPU pause instructions in between) took a 4-byte allreduce from 13-14 us to 8-10 us
// on 2 ranks and from 52-87 us to 30-33 us on 4 ranks.
#pragma once

#include <sched.h>

namespace horo {

inline void SpinRound() { ::sched_yield(); }

// One step of a busy wait that keeps the core: tells the CPU this is a spin loop (x86 pause,
// ARM yield), which saves power and leaves the sibling hyperthread the pipeline.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

}  // namespace horo
