#include "transport/shm/ring.h"

#include <algorithm>
#include <cstring>

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

bool Ring::CanWrite() {
  tail_ = shared_->tail.load(std::memory_order_acquire);
  return head_ - tail_ < capacity_;
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
