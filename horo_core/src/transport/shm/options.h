// ShmOptions: how ShmTransport chooses and runs shared-memory channels between ranks of one host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace horo {

struct ShmOptions {
  // false: every peer uses TCP (the setting HORO_SHM_DISABLE). A rank with shared memory disabled
  // still answers its peers' setup messages, so that ranks may disagree on this setting.
  bool enabled = true;
  // This rank's host name for same-host detection (HORO_HOSTNAME); empty: gethostname(). The
  // identity compared between ranks is this name together with the kernel's boot id, and a peer
  // only counts as local once it has mapped this rank's segment and proven its token.
  std::string host;
  // Bytes of each inbound ring (one per same-host peer); a power of two >= 64 KiB, or 0 (the
  // default) for DefaultRingBytes.
  uint64_t ring_bytes = 0;
  // A waiting rank spins this long before it sleeps on its doorbell (HORO_SPIN_MICROSECONDS).
  double spin_microseconds = 50;
};

// The ring size when none is set, for a rank with this many same-host peers on a CPU whose core
// cache (level 2) holds core_cache_bytes (0: unknown): the core cache shared out among the
// peers' rings, as a power of two, at least 512 KiB and at most 4 MiB.
//
// Small enough that the rings stay in the cache: each byte of a ring is written again as soon as
// the writer has gone around it once, and a 4 MiB ring (the first default) was out of the cache by
// then, so every write first read the line back from memory (docs/benchmarks.md, "A shared-memory
// ring that stays in the cache": 512 KiB was best on a core with a 512 KiB L2, 1 MiB and 4 MiB
// slower). Large enough that a ring holds several ring-allreduce slices: on a core with a 1 MiB L2,
// 2 ranks ran 256 KB to 4 MB allreduces 25-30 % faster through 1 MiB rings than through 512 KiB
// ones, while 4 ranks (three peers each, two ranks per core) were 10-30 % slower with them
// ("Rings sized by the core's cache"); on a core with a 2 MiB L2, 2 ranks ran 256 KB to 256 MB
// through the 2 MiB rings this gives at least as fast as through 1 MiB or 512 KiB ones, within 2 %
// ("A 2 MiB-L2 host").
constexpr uint64_t kLeastDefaultRingBytes = uint64_t{512} << 10;
constexpr uint64_t kMostDefaultRingBytes = uint64_t{4} << 20;
inline uint64_t DefaultRingBytes(size_t same_host_peers, int64_t core_cache_bytes) {
  if (same_host_peers == 0 || core_cache_bytes <= 0) return kLeastDefaultRingBytes;
  const uint64_t share = static_cast<uint64_t>(core_cache_bytes) / same_host_peers;
  uint64_t bytes = kLeastDefaultRingBytes;
  while (bytes < kMostDefaultRingBytes && bytes * 2 <= share) bytes *= 2;
  return bytes;
}

}  // namespace horo
