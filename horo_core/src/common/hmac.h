// Message authentication primitives for transport handshakes and TCP control frames: HMAC-SHA256
// (RFC 2104), a constant-time comparison of MACs, and cryptographically secure random bytes for
// nonces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/sha256.h"
#include "common/status.h"

namespace horo {

// Incremental HMAC-SHA256 keyed with raw key bytes (any length; keys longer than one SHA-256
// block are hashed first, as RFC 2104 requires).
class HmacSha256 {
 public:
  explicit HmacSha256(const std::string& key);
  // A copy continues from the same state: a copy of a keyed, not yet updated object MACs one
  // message without hashing the key's pad again (the TCP control frames).
  HmacSha256(const HmacSha256&) = default;
  HmacSha256& operator=(const HmacSha256&) = default;
  ~HmacSha256();

  void Update(const void* data, size_t len);
  // Returns the MAC. The object must not be updated afterwards.
  Sha256Digest Final();

  static Sha256Digest Compute(const std::string& key, const void* data, size_t len);

 private:
  Sha256 inner_;
  uint8_t outer_key_pad_[Sha256::kBlockSize];
};

// Compares two byte strings of equal length in time that depends only on len, not on where they
// differ, so that a MAC cannot be guessed byte by byte from response times.
bool ConstantTimeEqual(const void* a, const void* b, size_t len);

// Fills out[0, len) with bytes from the kernel's CSPRNG (getrandom, else /dev/urandom).
Status SecureRandomBytes(void* out, size_t len);

}  // namespace horo
