// CoarseNanos: a monotonic clock for checks that run on every pass of a hot loop but only need to
// happen every millisecond or so (looking at TCP for lost peers, the stall inspector).
//
// CLOCK_MONOTONIC_COARSE is the time of the last scheduler tick: reading it costs a few
// nanoseconds, against 20-40 ns for the precise clock on the 2-core VM of docs/benchmarks.md,
// where a loop of small collectives read the precise clock about a dozen times per call (7 % of
// its CPU time). It advances in steps of one tick (1-4 ms), so it must not time spins.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

namespace horo {

inline int64_t CoarseNanos() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The precise steady clock in the same unit, for what is timed in microseconds.
inline int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace horo
