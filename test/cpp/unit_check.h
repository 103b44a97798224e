// Assertions shared by the C++ unit tests: the first failure prints one line and ends the program
// with exit code 1 (also from a rank thread, while other threads are still running).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/status.h"

namespace horo_test {

[[noreturn]] inline void Fail(const std::string& message) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::printf("FAIL: %s\n", message.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

inline void Check(bool condition, const std::string& message) {
  if (!condition) Fail(message);
}

inline void CheckOk(const horo::Status& status, const std::string& what) {
  if (!status.ok()) Fail(what + ": status " + std::to_string(status.code()) + ": " + status.message());
}

// The status has the code and its message contains needle.
inline void CheckCode(const horo::Status& status, horo_status_t code, const std::string& needle,
                      const std::string& what) {
  if (status.code() != code) {
    Fail(what + ": expected code " + std::to_string(code) + ", got " + std::to_string(status.code()) + " (" +
         status.message() + ")");
  }
  if (status.message().find(needle) == std::string::npos) {
    Fail(what + ": message \"" + status.message() + "\" does not mention \"" + needle + "\"");
  }
}

}  // namespace horo_test
