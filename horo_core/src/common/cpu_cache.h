// The sizes of this CPU's caches: the last-level cache, which decides when a ring allreduce writes
// its result past the caches (AllreduceOptions::uncached_result_bytes), and a core's own (level 2)
// cache, which sizes the shared-memory rings (shm/options.h, DefaultRingBytes).
//
// Non-temporal stores pay off only for a result that leaves the caches before anyone reads it. On
// a host with a 32 MB L3 that is true from about 32 MB (docs/benchmarks.md, "Results written past
// the caches"); on one with a 260 MB L3 the same stores made 16 MB to 256 MB allreduces 12-35 %
// slower, and were even at 512 MB ("Results written past the caches on a large cache"). So the
// threshold is the last-level cache, and never below 16 MiB.
#pragma once

#include <cstdint>
#include <string>

namespace horo {

// "266240K", "32M", "1G" or a plain number of bytes, as in sysfs' cache/index*/size; 0 if unreadable.
int64_t ParseCacheSize(const std::string& text);

// The largest data or unified cache of CPU 0 in bytes (sysfs, else sysconf), 0 if unknown. Read
// once per process.
int64_t LastLevelCacheBytes();

// max(16 MiB, LastLevelCacheBytes()): the default AllreduceOptions::uncached_result_bytes.
int64_t DefaultUncachedResultBytes();

// The level-2 data or unified cache of CPU 0 in bytes (sysfs, else sysconf), 0 if unknown. Read
// once per process.
int64_t CoreCacheBytes();

}  // namespace horo
