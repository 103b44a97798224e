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

size_t Ring::Read(char* destination, size_t len) {
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
    std::memcpy(destination + done, data_ + offset, first);
    if (first < piece) std::memcpy(destination + done + first, data_, piece - first);
    tail_ += piece;
    shared_->tail.store(tail_, std::memory_order_release);
    other_end_.Ring();
    done += piece;
  }
  return done;
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
