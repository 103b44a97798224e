// ShmOptions: how ShmTransport chooses and runs shared-memory channels between ranks of one host.
#pragma once

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
  // Bytes of each inbound ring (one per same-host peer); a power of two >= 64 KiB. Small enough
  // that the rings of every pair stay in the cache: each byte of a ring is written again as soon
  // as the writer has gone around it once, and a 4 MiB ring (the earlier default) was out of the
  // cache by then, so every write first read the line back from memory (docs/benchmarks.md,
  // "A shared-memory ring that stays in the cache"). Two ring-allreduce slices fit.
  uint64_t ring_bytes = uint64_t{512} << 10;
  // A waiting rank spins this long before it sleeps on its doorbell (HORO_SPIN_MICROSECONDS).
  double spin_microseconds = 50;
};

}  // namespace horo
