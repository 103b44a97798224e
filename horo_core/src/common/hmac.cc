// HMAC-SHA256 (RFC 2104): MAC = H((K ^ opad) | H((K ^ ipad) | message)), with K the key padded to
// one block (or its hash, padded, when longer than a block).
#include "common/hmac.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cstring>

namespace horo {
namespace {

// Zeroes key material in a way the optimizer may not remove.
void SecureZero(void* p, size_t len) {
  volatile uint8_t* v = static_cast<volatile uint8_t*>(p);
  while (len--) *v++ = 0;
}

Status ReadUrandom(uint8_t* out, size_t len) {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::Internal(std::string("cannot open /dev/urandom: ") + std::strerror(errno));
  while (len > 0) {
    ssize_t n = ::read(fd, out, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(fd);
      return Status::Internal(std::string("cannot read /dev/urandom: ") + std::strerror(err));
    }
    out += n;
    len -= static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::OK();
}

}  // namespace

HmacSha256::HmacSha256(const std::string& key) {
  uint8_t block_key[Sha256::kBlockSize] = {0};
  if (key.size() > Sha256::kBlockSize) {
    Sha256Digest hashed = Sha256::Hash(key.data(), key.size());
    std::memcpy(block_key, hashed.data(), hashed.size());
    SecureZero(hashed.data(), hashed.size());
  } else {
    std::memcpy(block_key, key.data(), key.size());
  }
  uint8_t inner_key_pad[Sha256::kBlockSize];
  for (size_t i = 0; i < Sha256::kBlockSize; ++i) {
    inner_key_pad[i] = block_key[i] ^ 0x36;
    outer_key_pad_[i] = block_key[i] ^ 0x5c;
  }
  inner_.Update(inner_key_pad, sizeof(inner_key_pad));
  SecureZero(block_key, sizeof(block_key));
  SecureZero(inner_key_pad, sizeof(inner_key_pad));
}

HmacSha256::~HmacSha256() { SecureZero(outer_key_pad_, sizeof(outer_key_pad_)); }

void HmacSha256::Update(const void* data, size_t len) { inner_.Update(data, len); }

Sha256Digest HmacSha256::Final() {
  Sha256Digest inner_digest = inner_.Final();
  Sha256 outer;
  outer.Update(outer_key_pad_, sizeof(outer_key_pad_));
  outer.Update(inner_digest.data(), inner_digest.size());
  return outer.Final();
}

Sha256Digest HmacSha256::Compute(const std::string& key, const void* data, size_t len) {
  HmacSha256 mac(key);
  mac.Update(data, len);
  return mac.Final();
}

bool ConstantTimeEqual(const void* a, const void* b, size_t len) {
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < len; ++i) diff |= static_cast<uint8_t>(x[i] ^ y[i]);
  return diff == 0;
}

Status SecureRandomBytes(void* out, size_t len) {
  uint8_t* p = static_cast<uint8_t*>(out);
  while (len > 0) {
    ssize_t n = ::getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSYS) return ReadUrandom(p, len);  // kernel older than 3.17
      return Status::Internal(std::string("getrandom failed: ") + std::strerror(errno));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace horo
