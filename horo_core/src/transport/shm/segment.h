// Segment: one rank's shared-memory segment, holding its doorbell and one inbound Ring per
// same-host peer (slot s carries bytes from the peer that was told "slot s" to this rank).
//
// Layout (every part starts on a page):
//   [header: magic, version, token, ring_bytes, slots | DoorbellShared]   4 KiB
//   slots x ( [RingShared] 4 KiB | ring data, ring_bytes |                 data plane
//             [RingShared] 4 KiB | control ring data, kControlRingBytes )  control plane
//
// Lifecycle: the owner creates it under an unguessable name (/horo-<pid>-<128 random bits>,
// O_CREAT|O_EXCL, mode 0600) and reserves its memory with posix_fallocate, so that a full /dev/shm
// fails here (and the pair falls back to TCP) instead of raising SIGBUS on first touch. The name
// and a random 64-bit token travel to the peers over their authenticated TCP connections; a peer
// maps the segment only if the token in its header matches, which proves both that the name was
// not hijacked and that both ranks really share this host's memory. Once every peer has answered,
// the owner unlinks the name, so nothing is left in /dev/shm when ranks exit or crash afterwards;
// the destructor unlinks too if setup ended early. An owner killed before that cannot: a peer
// that mapped the segment unlinks it when it loses the owner (link_builder.h), and hororun removes
// the segments of the ranks it started once they have exited.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/shm/doorbell.h"
#include "transport/shm/ring.h"

namespace horo {
namespace shm {

class Segment {
 public:
  static constexpr uint64_t kMinRingBytes = uint64_t{64} << 10;
  static constexpr uint32_t kMaxSlots = 4096;
  // Control messages (request and response lists) are small; a larger one streams through.
  static constexpr uint64_t kControlRingBytes = uint64_t{256} << 10;

  static Status Create(uint32_t slots, uint64_t ring_bytes, std::unique_ptr<Segment>* out);
  // Maps a peer's segment; fails unless the header's token equals token.
  static Status Open(const std::string& name, uint64_t token, std::unique_ptr<Segment>* out);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Removes the name (owner only; idempotent). Mappings stay valid.
  void Unlink();

  const std::string& name() const { return name_; }
  uint64_t token() const { return token_; }
  uint32_t slots() const { return slots_; }
  uint64_t ring_bytes() const { return ring_bytes_; }
  Doorbell doorbell() const;
  // The shared state and data of slot's ring; slot < slots().
  RingShared* ring_shared(uint32_t slot) const;
  char* ring_data(uint32_t slot) const;
  // The same for the slot's control ring (capacity kControlRingBytes).
  RingShared* control_shared(uint32_t slot) const;
  char* control_data(uint32_t slot) const;

 private:
  Segment() = default;
  static bool SizeFor(uint32_t slots, uint64_t ring_bytes, uint64_t* size);
  static uint64_t SlotBytes(uint64_t ring_bytes);
  char* slot_base(uint32_t slot) const;

  std::string name_;
  bool owner_ = false;
  bool linked_ = false;
  uint64_t token_ = 0;
  uint32_t slots_ = 0;
  uint64_t ring_bytes_ = 0;
  char* base_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace shm
}  // namespace horo
