// Sha256: the SHA-256 hash of FIPS 180-4, incremental (Update any number of times, then Final).
// Used by HMAC-SHA256 to authenticate transport connections; no external crypto library needed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace horo {

using Sha256Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  static constexpr size_t kBlockSize = 64;
  static constexpr size_t kDigestSize = 32;

  Sha256();

  void Update(const void* data, size_t len);
  // Pads, finishes and returns the digest. The object must not be updated afterwards.
  Sha256Digest Final();

  static Sha256Digest Hash(const void* data, size_t len);

 private:
  void Compress(const uint8_t* block);

  uint32_t state_[8];
  uint8_t buffer_[kBlockSize];
  size_t buffer_len_ = 0;
  uint64_t total_len_ = 0;  // bytes hashed so far
};

}  // namespace horo
