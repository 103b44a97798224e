// Ring: a single-producer, single-consumer byte ring in shared memory, carrying one direction of
// the data plane between two ranks of one host.
//
// head counts every byte ever written (only the producer stores it), tail every byte ever read
// (only the consumer stores it); both only grow, so head - tail is the fill level and the buffer
// index is the count modulo the power-of-two capacity. Each counter has its own cache line, and
// each side keeps a private copy of the other side's counter that it refreshes only when the copy
// says the ring is full (producer) or empty (consumer), so the two cores exchange a cache line
// about once per piece instead of once per call.
//
// Large messages are streamed: Write() publishes every kPieceBytes, so the consumer copies piece k
// out while the producer copies piece k+1 in (a two-stage pipeline through the shared cache), and
// every publish rings the other side's doorbell in case it sleeps. ReadReduce is Read for a
// scatter-reduce: it hands the published bytes to a ReceiveReducer where they lie, instead of
// copying them out, and frees each piece once it has been reduced. The closed flags let either
// side see that the other called Close(): a consumer still reads what was published before.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/shm/doorbell.h"
#include "transport/transport.h"

namespace horo {
namespace shm {

// Lives in shared memory; zero-initialised by the segment's creator.
struct RingShared {
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint32_t> writer_closed;
  std::atomic<uint32_t> reader_closed;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring counters must be lock-free across processes");

class Ring {
 public:
  static constexpr size_t kPieceBytes = size_t{64} << 10;

  Ring() = default;
  // other_end: the doorbell of the rank at the other end of this ring (producer rings the
  // consumer's, consumer the producer's).
  Ring(RingShared* shared, char* data, uint64_t capacity, Doorbell other_end);

  // Producer: copies up to len bytes into free space without waiting; returns the count.
  size_t Write(const char* source, size_t len);
  // Producer and consumer, before a message: skip to the next kDataMessageAlignment-byte boundary
  // of the stream (the writer publishes the gap, the reader passes it). False while the gap does
  // not fit yet.
  bool AlignWriter();
  bool AlignReader();
  // Consumer: copies up to len published bytes out without waiting; returns the count.
  size_t Read(char* destination, size_t len);
  // Read with non-temporal stores: the bytes go to memory around the caches, and the destination
  // lines are not read first. For destinations nobody reads again soon; they are visible to
  // other threads once this returns. Plain Read where the CPU has no such stores.
  size_t ReadUncached(char* destination, size_t len);

  // An element of a ReadReduce that is split across calls or across the ring's end: its bytes so
  // far (have < element size between calls).
  struct Carry {
    alignas(16) char bytes[16];
    size_t have = 0;
  };
  // Consumer: reduces up to len published bytes into destination with reducer, without waiting;
  // returns the count consumed. destination is where the next byte belongs; the carry's bytes
  // (the start of a split element) belong just before it. A message is read with one Carry.
  size_t ReadReduce(char* destination, size_t len, const ReceiveReducer& reducer, Carry* carry);

  // Fresh looks at the other side's counter, for the re-check before sleeping. They refresh the
  // calling side's private copy, so only the producer (CanWrite) or the consumer (CanRead) may call
  // them, under whatever serialises that side's Write or Read.
  // CanWrite: at least at_least bytes are free (a writer that must first publish a gap needs
  // kDataMessageAlignment, or it would wake at once and spin).
  bool CanWrite(size_t at_least = 1);
  bool CanRead();
  // Published bytes not read yet, from the shared counters alone: safe from any thread while the
  // consumer reads (a waiter that is not the consumer, ShmTransport::WaitControl).
  bool HasUnread() const {
    return shared_->head.load(std::memory_order_acquire) != shared_->tail.load(std::memory_order_acquire);
  }

  void CloseWriter();
  void CloseReader();
  bool writer_closed() const { return shared_->writer_closed.load(std::memory_order_acquire) != 0; }
  bool reader_closed() const { return shared_->reader_closed.load(std::memory_order_acquire) != 0; }

 private:
  template <typename Take>
  size_t Consume(size_t len, Take&& take);

  RingShared* shared_ = nullptr;
  char* data_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;
  Doorbell other_end_;
  uint64_t head_ = 0;         // producer: own counter; consumer: last head seen
  uint64_t tail_ = 0;         // consumer: own counter; producer: last tail seen
};

}  // namespace shm
}  // namespace horo
