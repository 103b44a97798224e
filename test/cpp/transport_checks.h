// Helpers shared by the transport tests (test_tcp_transport.cc, test_shm_transport.cc): printing a
// passed check, status expectations, timing, a byte pattern that tells sender, receiver and size
// apart, and running ranks as threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "transport/transport.h"
#include "unit_check.h"

namespace horo_test {

inline void Pass(const std::string& message) {
  std::printf("ok   %s\n", message.c_str());
  std::fflush(stdout);
}

inline void ExpectOk(const horo::Status& st, const std::string& what) { CheckOk(st, what); }

// The status has the code and its message contains every needle.
inline void ExpectCode(const horo::Status& st, horo_status_t code, const std::string& what,
                       const std::vector<std::string>& needles = {}) {
  CheckCode(st, code, "", what);
  for (const std::string& needle : needles) CheckCode(st, code, needle, what);
}

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The byte at offset i of a message from src to dst of the given size: detects lost, duplicated,
// reordered or misrouted bytes.
inline uint8_t PatternByte(size_t i, int src, int dst, size_t size) {
  return static_cast<uint8_t>((i * 131 + (i >> 12) * 7 + src * 29 + dst * 13 + size) & 0xff);
}

inline void FillPattern(std::vector<uint8_t>* buffer, size_t size, int src, int dst) {
  if (buffer->size() < size) buffer->resize(size);
  for (size_t i = 0; i < size; ++i) (*buffer)[i] = PatternByte(i, src, dst, size);
}

inline void CheckPattern(const std::vector<uint8_t>& buffer, size_t size, int src, int dst, const std::string& what) {
  for (size_t i = 0; i < size; ++i) {
    if (buffer[i] != PatternByte(i, src, dst, size)) {
      Fail(what + ": byte " + std::to_string(i) + " of " + std::to_string(size) + " from rank " +
           std::to_string(src) + " to rank " + std::to_string(dst) + " is wrong");
    }
  }
}

// This rank's part of sending a patterned message of size bytes over every ordered pair, in one
// global order (only the pair's two ranks act), each checked on arrival.
inline void ExchangeEveryPair(horo::Transport* t, int rank, int n, size_t size, std::vector<uint8_t>* buffer,
                              const std::string& tag) {
  for (int src = 0; src < n; ++src) {
    for (int dst = 0; dst < n; ++dst) {
      if (src == dst) continue;
      if (rank == src) {
        FillPattern(buffer, size, src, dst);
        ExpectOk(t->Send(dst, buffer->data(), size), tag + "Send");
      } else if (rank == dst) {
        buffer->assign(size + 1, 0);
        ExpectOk(t->Recv(src, buffer->data(), size), tag + "Recv");
        CheckPattern(*buffer, size, src, dst, tag + "Send/Recv");
      }
    }
  }
}

// Runs body(rank) for every rank on its own thread and waits for all of them.
inline void RunRanks(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) threads.emplace_back(body, rank);
  for (auto& thread : threads) thread.join();
}

}  // namespace horo_test
