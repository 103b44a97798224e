#include "transport/shm/segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <new>

#include "common/hmac.h"

namespace horo {
namespace shm {
namespace {

constexpr uint64_t kMagic = 0x314d485354524f48ULL;  // "HORTSHM1" little-endian
constexpr uint32_t kVersion = 2;  // 2: a control ring after each data ring
constexpr uint64_t kPage = 4096;

struct Header {
  uint64_t magic;
  uint64_t token;
  uint64_t ring_bytes;
  uint32_t slots;
  uint32_t version;
  DoorbellShared doorbell;
};
static_assert(sizeof(Header) <= kPage, "segment header exceeds one page");
static_assert(sizeof(RingShared) <= kPage, "ring header exceeds one page");

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

std::string Hex(const uint8_t* data, size_t len) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < len; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

}  // namespace

bool Segment::SizeFor(uint32_t slots, uint64_t ring_bytes, uint64_t* size) {
  if (slots == 0 || slots > kMaxSlots) return false;
  if (ring_bytes < kMinRingBytes || (ring_bytes & (ring_bytes - 1)) != 0 || ring_bytes > (uint64_t{1} << 40)) {
    return false;
  }
  *size = kPage + uint64_t{slots} * SlotBytes(ring_bytes);
  return true;
}

Status Segment::Create(uint32_t slots, uint64_t ring_bytes, std::unique_ptr<Segment>* out) {
  std::unique_ptr<Segment> segment(new Segment());
  if (!SizeFor(slots, ring_bytes, &segment->size_)) {
    return Status::InvalidArgument("shared-memory segment of " + std::to_string(slots) + " rings of " +
                                   std::to_string(ring_bytes) + " bytes: ring size must be a power of two >= " +
                                   std::to_string(kMinRingBytes));
  }
  uint8_t random[24];
  HORO_RETURN_IF_ERROR(SecureRandomBytes(random, sizeof(random)));
  segment->name_ = "/horo-" + std::to_string(::getpid()) + "-" + Hex(random, 16);
  std::memcpy(&segment->token_, random + 16, sizeof(segment->token_));
  segment->owner_ = true;
  segment->slots_ = slots;
  segment->ring_bytes_ = ring_bytes;

  int fd = ::shm_open(segment->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return Status::Internal(Errno(("shm_open(" + segment->name_ + ")").c_str()));
  segment->linked_ = true;  // from here on the destructor unlinks
  int rc = ::ftruncate(fd, static_cast<off_t>(segment->size_));
  if (rc == 0) rc = ::posix_fallocate(fd, 0, static_cast<off_t>(segment->size_));
  else rc = errno;
  if (rc != 0) {
    ::close(fd);
    return Status::Internal("cannot reserve " + std::to_string(segment->size_) + " bytes of shared memory for " +
                            segment->name_ + ": " + std::strerror(rc));
  }
  void* base = ::mmap(nullptr, segment->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return Status::Internal(Errno(("mmap(" + segment->name_ + ")").c_str()));
  segment->base_ = static_cast<char*>(base);
  // The file is zero-filled, which is the initial state of every atomic in it; construct them in
  // place so that the objects formally exist.
  Header* header = new (segment->base_) Header();
  header->token = segment->token_;
  header->ring_bytes = ring_bytes;
  header->slots = slots;
  header->version = kVersion;
  for (uint32_t slot = 0; slot < slots; ++slot) {
    new (segment->ring_shared(slot)) RingShared();
    new (segment->control_shared(slot)) RingShared();
  }
  header->magic = kMagic;
  *out = std::move(segment);
  return Status::OK();
}

Status Segment::Open(const std::string& name, uint64_t token, std::unique_ptr<Segment>* out) {
  std::unique_ptr<Segment> segment(new Segment());
  segment->name_ = name;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return Status::Internal(Errno(("shm_open(" + name + ")").c_str()));
  struct stat info;
  if (::fstat(fd, &info) != 0 || info.st_size < static_cast<off_t>(kPage)) {
    ::close(fd);
    return Status::Internal("shared-memory segment " + name + " is too small or unreadable");
  }
  segment->size_ = static_cast<uint64_t>(info.st_size);
  void* base = ::mmap(nullptr, segment->size_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (base == MAP_FAILED) return Status::Internal(Errno(("mmap(" + name + ")").c_str()));
  segment->base_ = static_cast<char*>(base);
  const Header* header = reinterpret_cast<const Header*>(segment->base_);
  uint64_t expected_size = 0;
  if (header->magic != kMagic || header->version != kVersion || header->token != token ||
      !SizeFor(header->slots, header->ring_bytes, &expected_size) || expected_size != segment->size_) {
    return Status::Internal("shared-memory segment " + name + " does not carry the expected token and layout");
  }
  segment->token_ = token;
  segment->slots_ = header->slots;
  segment->ring_bytes_ = header->ring_bytes;
  *out = std::move(segment);
  return Status::OK();
}

Segment::~Segment() {
  Unlink();
  if (base_ != nullptr) ::munmap(base_, size_);
}

void Segment::Unlink() {
  if (owner_ && linked_) ::shm_unlink(name_.c_str());
  linked_ = false;
}

Doorbell Segment::doorbell() const { return Doorbell(&reinterpret_cast<Header*>(base_)->doorbell); }

uint64_t Segment::SlotBytes(uint64_t ring_bytes) { return kPage + ring_bytes + kPage + kControlRingBytes; }

char* Segment::slot_base(uint32_t slot) const { return base_ + kPage + uint64_t{slot} * SlotBytes(ring_bytes_); }

RingShared* Segment::ring_shared(uint32_t slot) const { return reinterpret_cast<RingShared*>(slot_base(slot)); }

char* Segment::ring_data(uint32_t slot) const { return slot_base(slot) + kPage; }

RingShared* Segment::control_shared(uint32_t slot) const {
  return reinterpret_cast<RingShared*>(slot_base(slot) + kPage + ring_bytes_);
}

char* Segment::control_data(uint32_t slot) const { return slot_base(slot) + kPage + ring_bytes_ + kPage; }

}  // namespace shm
}  // namespace horo
