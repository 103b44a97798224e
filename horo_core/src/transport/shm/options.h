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
  // Bytes of each inbound ring (one per same-host peer); a power of two >= 64 KiB.
  uint64_t ring_bytes = uint64_t{4} << 20;
  // A waiting rank spins this long before it sleeps on its doorbell (HORO_SPIN_MICROSECONDS).
  double spin_microseconds = 50;
};

}  // namespace horo
