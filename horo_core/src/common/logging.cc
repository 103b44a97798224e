#include "common/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace horo {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<bool> g_hide_time{false};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kFatal: return "FATAL";
  }
  return "?";
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogHideTime(bool hide) { g_hide_time.store(hide); }

bool ParseLogLevel(const std::string& text, LogLevel* out) {
  static const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
  std::string upper;
  for (char c : text) upper += static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c);
  if (upper == "WARN") upper = "WARNING";
  for (int i = 0; i < 6; ++i) {
    if (upper == kNames[i]) {
      *out = static_cast<LogLevel>(i);
      return true;
    }
  }
  return false;
}

void LogLine(LogLevel level, int rank, const std::string& message) {
  char stamp[64] = "";
  if (!g_hide_time.load()) {
    auto now = std::chrono::system_clock::now();
    std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm_buf;
    localtime_r(&t, &tm_buf);
    std::strftime(stamp, sizeof(stamp), "[%Y-%m-%d %H:%M:%S] ", &tm_buf);
  }
  // One fprintf call per line keeps lines of concurrent ranks from interleaving mid-line.
  std::fprintf(stderr, "%s[horo %s rank %d] %s\n", stamp, LevelName(level), rank, message.c_str());
  std::fflush(stderr);
}

}  // namespace horo
