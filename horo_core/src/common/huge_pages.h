// AdviseHugePages: lets the kernel back the whole 2 MiB pages of a buffer with transparent huge
// pages (madvise(MADV_HUGEPAGE); a hint, which the kernel may ignore).
//
// A result that a collective writes into fresh memory (an allgather's output, allocated for this
// call) pays a page fault per 4 KiB page on first touch: on a VM 64 MB took 27 ms to fault in
// against 9 ms with huge pages, more than the allgather itself (docs/benchmarks.md, "Allgather
// into the caller's tensor"). Where the system's policy is "madvise" (common), memory is only
// backed by huge pages after such advice; with "always" it changes nothing, with "never" the call
// does nothing. Only the whole huge pages inside the range are advised, so memory around it is
// left alone.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace horo {

constexpr size_t kHugePageBytes = size_t{2} << 20;

inline void AdviseHugePages(void* data, size_t bytes) {
#ifdef MADV_HUGEPAGE
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  const uintptr_t end = (start + bytes) & ~(uintptr_t{kHugePageBytes} - 1);
  if (end > begin) (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace horo
