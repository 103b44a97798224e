#include "transport/shm/ring.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

// ThreadSanitizer does not see non-temporal stores: its builds copy through the cache.
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define HORO_RING_STREAMING_STORES 1
#include <emmintrin.h>  // SSE2, part of every x86-64 CPU: no run-time dispatch needed
#endif

namespace horo {
namespace shm {

Ring::Ring(RingShared* shared, char* data, uint64_t capacity, Doorbell other_end)
    : shared_(shared), data_(data), capacity_(capacity), mask_(capacity - 1), other_end_(other_end) {
  head_ = shared_->head.load(std::memory_order_acquire);
  tail_ = shared_->tail.load(std::memory_order_acquire);
}

size_t Ring::Write(const char* source, size_t len) {
  size_t done = 0;
  while (done < len) {
    const size_t want = std::min<size_t>(len - done, kPieceBytes);
    uint64_t free = capacity_ - (head_ - tail_);
    if (free < want) {
      tail_ = shared_->tail.load(std::memory_order_acquire);
      free = capacity_ - (head_ - tail_);
      if (free == 0) break;
    }
    const size_t piece = std::min<size_t>(want, free);
    const size_t offset = static_cast<size_t>(head_ & mask_);
    const size_t first = std::min<size_t>(piece, capacity_ - offset);
    std::memcpy(data_ + offset, source + done, first);
    if (first < piece) std::memcpy(data_, source + done + first, piece - first);
    head_ += piece;
    shared_->head.store(head_, std::memory_order_release);
    other_end_.Ring();
    done += piece;
  }
  return done;
}

namespace {

// Bytes from a stream position to the next message boundary.
uint64_t GapToBoundary(uint64_t position) { return (0 - position) & (kDataMessageAlignment - 1); }

}  // namespace

bool Ring::AlignWriter() {
  const uint64_t gap = GapToBoundary(head_);
  if (gap == 0) return true;
  if (capacity_ - (head_ - tail_) < gap) {
    tail_ = shared_->tail.load(std::memory_order_acquire);
    if (capacity_ - (head_ - tail_) < gap) return false;
  }
  head_ += gap;
  shared_->head.store(head_, std::memory_order_release);
  return true;
}

bool Ring::AlignReader() {
  const uint64_t gap = GapToBoundary(tail_);
  if (gap == 0) return true;
  if (head_ - tail_ < gap) {
    head_ = shared_->head.load(std::memory_order_acquire);
    if (head_ - tail_ < gap) return false;
  }
  tail_ += gap;
  shared_->tail.store(tail_, std::memory_order_release);
  return true;
}

// Hands up to len published bytes to take(message_offset, ring_bytes, n), in at most two runs per
// piece (the second from the ring's start), then frees the piece for the producer.
template <typename Take>
size_t Ring::Consume(size_t len, Take&& take) {
  size_t done = 0;
  while (done < len) {
    const size_t want = std::min<size_t>(len - done, kPieceBytes);
    uint64_t available = head_ - tail_;
    if (available < want) {
      head_ = shared_->head.load(std::memory_order_acquire);
      available = head_ - tail_;
      if (available == 0) break;
    }
    const size_t piece = std::min<size_t>(want, available);
    const size_t offset = static_cast<size_t>(tail_ & mask_);
    const size_t first = std::min<size_t>(piece, capacity_ - offset);
    take(done, data_ + offset, first);
    if (first < piece) take(done + first, data_, piece - first);
    tail_ += piece;
    shared_->tail.store(tail_, std::memory_order_release);
    other_end_.Ring();
    done += piece;
  }
  return done;
}

size_t Ring::Read(char* destination, size_t len) {
  return Consume(len, [destination](size_t at, const char* bytes, size_t n) {
    std::memcpy(destination + at, bytes, n);
  });
}

namespace {

#ifdef HORO_RING_STREAMING_STORES
// Copies n bytes with non-temporal stores for every whole 64-byte line of the destination (a
// partly written line would make memory merge it with what it holds); the ragged ends go through
// the cache. The caller fences once it is done.
void CopyPastCaches(char* destination, const char* source, size_t n) {
  constexpr size_t kLine = 64;
  size_t head = (kLine - (reinterpret_cast<uintptr_t>(destination) & (kLine - 1))) & (kLine - 1);
  head = std::min(head, n);
  std::memcpy(destination, source, head);
  size_t at = head;
  for (; at + kLine <= n; at += kLine) {
    const __m128i* from = reinterpret_cast<const __m128i*>(source + at);
    __m128i* to = reinterpret_cast<__m128i*>(destination + at);
    const __m128i a = _mm_loadu_si128(from);
    const __m128i b = _mm_loadu_si128(from + 1);
    const __m128i c = _mm_loadu_si128(from + 2);
    const __m128i d = _mm_loadu_si128(from + 3);
    _mm_stream_si128(to, a);
    _mm_stream_si128(to + 1, b);
    _mm_stream_si128(to + 2, c);
    _mm_stream_si128(to + 3, d);
  }
  std::memcpy(destination + at, source + at, n - at);
}
#endif

}  // namespace

size_t Ring::ReadUncached(char* destination, size_t len) {
#ifdef HORO_RING_STREAMING_STORES
  const size_t moved = Consume(len, [destination](size_t at, const char* bytes, size_t n) {
    CopyPastCaches(destination + at, bytes, n);
  });
  // Non-temporal stores are not ordered by the release stores that publish the result (the
  // handle's completion): fence them first.
  if (moved > 0) _mm_sfence();
  return moved;
#else
  return Read(destination, len);
#endif
}

namespace {

// Reduces the n bytes at source into destination (the carry's bytes belong just before it),
// completing a split element first and keeping the bytes of an unfinished one in the carry.
// source may lie anywhere in the ring: runs that are not element-aligned are staged through an
// aligned buffer, since the kernels address elements by type.
void ReduceRun(char* destination, const char* source, size_t n, const ReceiveReducer& reducer, Ring::Carry* carry) {
  const size_t element = reducer.element_size;
  size_t at = 0;
  if (carry->have > 0) {
    const size_t take = std::min(n, element - carry->have);
    std::memcpy(carry->bytes + carry->have, source, take);
    carry->have += take;
    at = take;
    if (carry->have < element) return;
    reducer.reduce(destination + at - element, carry->bytes, 1, reducer.context);
    carry->have = 0;
  }
  const size_t whole = (n - at) / element;
  if (reinterpret_cast<uintptr_t>(source + at) % element == 0) {
    if (whole > 0) reducer.reduce(destination + at, source + at, whole, reducer.context);
    at += whole * element;
  } else {
    alignas(64) char staged[4096];
    const size_t per_round = sizeof(staged) / element;
    for (size_t left = whole; left > 0;) {
      const size_t count = std::min(left, per_round);
      std::memcpy(staged, source + at, count * element);
      reducer.reduce(destination + at, staged, count, reducer.context);
      at += count * element;
      left -= count;
    }
  }
  std::memcpy(carry->bytes, source + at, n - at);
  carry->have = n - at;
}

}  // namespace

size_t Ring::ReadReduce(char* destination, size_t len, const ReceiveReducer& reducer, Carry* carry) {
  return Consume(len, [&](size_t at, const char* bytes, size_t n) {
    ReduceRun(destination + at, bytes, n, reducer, carry);
  });
}

bool Ring::CanWrite(size_t at_least) {
  tail_ = shared_->tail.load(std::memory_order_acquire);
  return capacity_ - (head_ - tail_) >= at_least;
}

bool Ring::CanRead() {
  head_ = shared_->head.load(std::memory_order_acquire);
  return head_ != tail_;
}

void Ring::CloseWriter() {
  shared_->writer_closed.store(1, std::memory_order_release);
  other_end_.RingAlways();
}

void Ring::CloseReader() {
  shared_->reader_closed.store(1, std::memory_order_release);
  other_end_.RingAlways();
}

}  // namespace shm
}  // namespace horo
