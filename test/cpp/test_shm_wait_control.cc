// sources: common/sha256.cc common/hmac.cc common/logging.cc transport/tcp/*.cc transport/shm/*.cc common/cpu_cache.cc
//
// WaitControl beside PollControl on one rank, as HORO_CALLER_PROGRESS runs them: one thread reads
// the control plane (PollControl, as a pass under the progress mutex does) while another waits on
// it without reading (WaitControl, as the background thread does between passes). Rank 1 streams
// numbered control messages of assorted sizes to rank 0 through their control ring; rank 0 checks
// every message, in order and intact. WaitControl must never disturb the reader's view of the
// ring. Prints one line per check and exits 1 on the first failure.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"
#include "tcp_mesh.h"
#include "transport_checks.h"

using namespace horo;
using namespace horo_test;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::unique_ptr<ShmTransport>> BuildShmMesh(int n) {
  std::vector<std::unique_ptr<ShmTransport>> mesh(n);
  std::vector<std::string> addresses(n);
  for (int rank = 0; rank < n; ++rank) {
    ShmOptions shm;
    shm.spin_microseconds = 0;
    std::unique_ptr<TcpTransport> t;
    ExpectOk(TcpTransport::Listen(Options(rank, n), &t), "Listen");
    mesh[rank] = std::make_unique<ShmTransport>(std::move(t), shm);
    addresses[rank] = mesh[rank]->address();
  }
  RunRanks(n, [&](int rank) { ExpectOk(mesh[rank]->Connect(addresses), "Connect"); });
  return mesh;
}

std::string Payload(int index) {
  const size_t size = 1 + static_cast<size_t>(static_cast<int64_t>(index) * 7919 % 3000);
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((index * 31 + i * 7) & 0xff);
  return payload;
}

}  // namespace

int main(int argc, char** argv) {
  SetLogLevel(LogLevel::kError);
  const int count = argc > 1 ? std::atoi(argv[1]) : 200000;
  auto mesh = BuildShmMesh(2);
  std::atomic<bool> reading{true};
  std::atomic<int64_t> waits{0};
  std::thread sender([&] {
    for (int i = 0; i < count; ++i) ExpectOk(mesh[1]->SendControl(0, Payload(i)), "SendControl");
  });
  // The background thread between passes: waits on the control plane without reading it.
  std::thread waiter([&] {
    while (reading.load()) {
      mesh[0]->WaitControl(1);
      waits.fetch_add(1, std::memory_order_relaxed);
    }
  });
  // A caller's passes: read whatever has arrived, without waiting.
  int next = 0;
  const auto start = Clock::now();
  std::vector<ControlMessage> got;
  std::vector<int> lost;
  while (next < count) {
    got.clear();
    Status st = mesh[0]->PollControl(0, &got, &lost);
    if (!st.ok()) Fail("PollControl after " + std::to_string(next) + " messages: " + st.message());
    for (const ControlMessage& m : got) {
      if (m.payload != Payload(next)) {
        Fail("message " + std::to_string(next) + " corrupt: " + std::to_string(m.payload.size()) + " bytes, want " +
             std::to_string(Payload(next).size()));
      }
      ++next;
    }
    if (std::chrono::duration<double>(Clock::now() - start).count() > 120) Fail("only " + std::to_string(next) + " arrived");
  }
  reading = false;
  sender.join();
  waiter.join();
  std::printf("PASS: %d control messages intact while another thread ran WaitControl %lld times\n", count,
              static_cast<long long>(waits.load()));
  return 0;
}
