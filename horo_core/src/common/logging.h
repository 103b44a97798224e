// Logging: every line carries the rank; the level comes from the config (HORO_LOG_LEVEL).
#pragma once

#include <sstream>
#include <string>

namespace horo {

enum class LogLevel : int { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kFatal = 5 };

// Process-wide logging sink settings. They are the one piece of shared state outside Runtime,
// because several runtimes of one process (loopback tests) write to the same stderr.
void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogHideTime(bool hide);
bool ParseLogLevel(const std::string& text, LogLevel* out);
void LogLine(LogLevel level, int rank, const std::string& message);

class LogMessage {
 public:
  LogMessage(LogLevel level, int rank) : level_(level), rank_(rank) {}
  ~LogMessage() { LogLine(level_, rank_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  int rank_;
  std::ostringstream stream_;
};

// Turns the streamed expression into void, so that HORO_LOG is one expression: an `if` inside the
// macro would capture the `else` of an unbraced `if (...) HORO_LOG(...) << ...; else ...` around
// it. `&` binds looser than `<<`, so the whole line is streamed first.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

// HORO_LOG(kWarning, rank) << "text": one line at that level, unless the level is filtered out (then
// nothing after it is evaluated).
#define HORO_LOG(level, rank)                                  \
  (::horo::LogLevel::level < ::horo::GetLogLevel())            \
      ? (void)0                                                \
      : ::horo::LogVoidify() & ::horo::LogMessage(::horo::LogLevel::level, (rank)).stream()

}  // namespace horo
