#include "common/cpu_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <limits>

namespace horo {
namespace {

std::string ReadLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The largest data or unified cache of CPU 0 in sysfs (level 0: any level), 0 if none is listed.
// cache/index<i> lists L1d, L1i, L2, L3...
int64_t ReadSysfsCacheBytes(int level) {
  int64_t largest = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    const std::string type = ReadLine(dir + "type");
    if (type.empty()) break;
    if (type == "Instruction") continue;
    if (level != 0 && ReadLine(dir + "level") != std::to_string(level)) continue;
    largest = std::max(largest, ParseCacheSize(ReadLine(dir + "size")));
  }
  return largest;
}

int64_t ReadLastLevelCacheBytes() {
  const int64_t largest = ReadSysfsCacheBytes(0);
  if (largest > 0) return largest;
#ifdef _SC_LEVEL3_CACHE_SIZE
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(name);
    if (bytes > 0) return bytes;
  }
#endif
  return 0;
}

int64_t ReadCoreCacheBytes() {
  const int64_t l2 = ReadSysfsCacheBytes(2);
  if (l2 > 0) return l2;
#ifdef _SC_LEVEL2_CACHE_SIZE
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (bytes > 0) return bytes;
#endif
  return 0;
}

}  // namespace

int64_t ParseCacheSize(const std::string& text) {
  size_t at = 0;
  int64_t value = 0;
  while (at < text.size() && std::isdigit(static_cast<unsigned char>(text[at]))) {
    if (value > (int64_t{1} << 50)) return 0;  // no cache is that large: unreadable
    value = value * 10 + (text[at++] - '0');
  }
  if (at == 0) return 0;
  int64_t unit = 1;
  if (at < text.size()) {
    switch (std::toupper(static_cast<unsigned char>(text[at++]))) {
      case 'K': unit = int64_t{1} << 10; break;
      case 'M': unit = int64_t{1} << 20; break;
      case 'G': unit = int64_t{1} << 30; break;
      default: return 0;
    }
  }
  while (at < text.size() && std::isspace(static_cast<unsigned char>(text[at]))) ++at;
  if (at != text.size() || value > std::numeric_limits<int64_t>::max() / unit) return 0;
  return value * unit;
}

int64_t LastLevelCacheBytes() {
  static const int64_t bytes = ReadLastLevelCacheBytes();
  return bytes;
}

int64_t DefaultUncachedResultBytes() { return std::max(int64_t{16} << 20, LastLevelCacheBytes()); }

int64_t CoreCacheBytes() {
  static const int64_t bytes = ReadCoreCacheBytes();
  return bytes;
}

}  // namespace horo
