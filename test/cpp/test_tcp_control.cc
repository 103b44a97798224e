// sources: common/sha256.cc common/hmac.cc common/logging.cc transport/tcp/*.cc
//
// The TCP control plane when both ends of a control connection send more than the socket buffers
// hold at the same time (rank 0 sending a large response list to a worker while that worker sends
// it a large request list). A sender that only waited for buffer space would wait for a reader
// that is itself waiting to send: both stall until the data timeout. SendControl must keep reading
// (and buffering) inbound control frames while it waits, and PollControl must return them first,
// in order. Checks: 2 ranks crossing [small, 48 MB, small] both ways; rank 0 and two workers all
// sending 24 MB at once; a worker whose PollControl(-1) runs on another thread while its
// SendControl drains the same socket (every frame must reach that thread; the narrow window in
// which only the Wake() after buffering saves it is not forced here). Ranks are threads over
// 127.0.0.1; a short data timeout turns the deadlock into a failure instead of a hang. Exits 1 on
// the first failure.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "tcp_mesh.h"
#include "transport_checks.h"

using namespace horo;
using namespace horo_test;

namespace {

constexpr double kTimeoutSeconds = 5;  // far more than any of these sends needs once it cannot deadlock
constexpr int kHangSeconds = 60;       // a liveness guard, not a speed limit: a wait this long is a hang

std::string Payload(size_t size, int src, int dst) {
  std::string text(size, '\0');
  for (size_t i = 0; i < size; ++i) text[i] = static_cast<char>(PatternByte(i, src, dst, size));
  return text;
}

Mesh ControlMesh(int n) {
  return BuildMesh(n, [](TcpOptions* options) { options->data_timeout_seconds = kTimeoutSeconds; });
}

// Polls until `count` messages have arrived and checks that they are `expected` from `src`, in order.
void ExpectMessages(Transport* t, int rank, const std::vector<std::string>& expected, int src, const std::string& tag) {
  std::vector<ControlMessage> messages;
  std::vector<int> lost;
  const auto start = std::chrono::steady_clock::now();
  while (messages.size() < expected.size()) {
    ExpectOk(t->PollControl(1000, &messages, &lost), tag + "PollControl on rank " + std::to_string(rank));
    Check(lost.empty(), tag + "rank " + std::to_string(rank) + " lost a peer");
    Check(SecondsSince(start) < kHangSeconds, tag + "rank " + std::to_string(rank) + " never got its messages");
  }
  Check(messages.size() == expected.size(), tag + "rank " + std::to_string(rank) + ": " +
                                                std::to_string(messages.size()) + " messages, expected " +
                                                std::to_string(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    Check(messages[i].peer == src, tag + "message " + std::to_string(i) + " on rank " + std::to_string(rank) +
                                       " came from rank " + std::to_string(messages[i].peer));
    Check(messages[i].payload == expected[i], tag + "message " + std::to_string(i) + " (" +
                                                  std::to_string(expected[i].size()) + " bytes) on rank " +
                                                  std::to_string(rank) + " differs");
  }
}

void TestTwoRanksCrossing() {
  const std::string tag = "[2 ranks crossing] ";
  Mesh mesh = ControlMesh(2);
  Barrier barrier(2);
  std::vector<std::vector<std::string>> sent(2);
  for (int rank = 0; rank < 2; ++rank) {
    sent[rank] = {"first from " + std::to_string(rank), Payload(size_t{48} << 20, rank, 1 - rank),
                  "last from " + std::to_string(rank)};
  }
  RunRanks(2, [&](int rank) {
    Transport* t = mesh.ranks[rank].get();
    barrier.Wait();
    for (const std::string& payload : sent[rank]) {
      ExpectOk(t->SendControl(1 - rank, payload), tag + "SendControl of " + std::to_string(payload.size()) +
                                                      " bytes from rank " + std::to_string(rank));
    }
    ExpectMessages(t, rank, sent[1 - rank], 1 - rank, tag);
  });
  Pass(tag + "both ranks send [small, 48 MB, small] at once; each receives the other's three, in order");
}

void TestCoordinatorAndWorkers() {
  const std::string tag = "[rank 0 and 2 workers] ";
  Mesh mesh = ControlMesh(3);
  Barrier barrier(3);
  const size_t big = size_t{24} << 20;
  RunRanks(3, [&](int rank) {
    Transport* t = mesh.ranks[rank].get();
    barrier.Wait();
    if (rank == 0) {
      for (int worker : {1, 2}) ExpectOk(t->SendControl(worker, Payload(big, 0, worker)), tag + "rank 0 SendControl");
      std::vector<ControlMessage> messages;
      std::vector<int> lost;
      while (messages.size() < 2) ExpectOk(t->PollControl(1000, &messages, &lost), tag + "rank 0 PollControl");
      Check(messages.size() == 2 && messages[0].peer != messages[1].peer, tag + "rank 0: one message per worker");
      for (const ControlMessage& m : messages) {
        Check(m.payload == Payload(big, m.peer, 0), tag + "rank 0: message from rank " + std::to_string(m.peer));
      }
    } else {
      ExpectOk(t->SendControl(0, Payload(big, rank, 0)), tag + "worker SendControl");
      ExpectMessages(t, rank, {Payload(big, 0, rank)}, 0, tag);
    }
  });
  Pass(tag + "rank 0 sends 24 MB to each worker while both send it 24 MB; every message arrives intact");
}

void TestPollerOnAnotherThread() {
  const std::string tag = "[poller thread] ";
  Mesh mesh = ControlMesh(2);
  Barrier barrier(2);
  const std::string to_worker = Payload(size_t{48} << 20, 0, 1), to_coordinator = Payload(size_t{48} << 20, 1, 0);
  std::mutex mutex;
  std::condition_variable cv;
  bool worker_received = false;
  std::thread poller([&] {  // the worker's PollControl(-1), as the runtime's background thread
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    while (messages.empty()) ExpectOk(mesh.ranks[1]->PollControl(-1, &messages, &lost), tag + "worker PollControl(-1)");
    Check(messages.size() == 1 && messages[0].payload == to_worker, tag + "worker: the 48 MB message, intact");
    std::lock_guard<std::mutex> lock(mutex);
    worker_received = true;
    cv.notify_all();
  });
  RunRanks(2, [&](int rank) {
    barrier.Wait();
    if (rank == 0) {
      ExpectOk(mesh.ranks[0]->SendControl(1, to_worker), tag + "rank 0 SendControl");
      ExpectMessages(mesh.ranks[0].get(), 0, {to_coordinator}, 1, tag);
    } else {
      ExpectOk(mesh.ranks[1]->SendControl(0, to_coordinator), tag + "worker SendControl");
    }
  });
  {
    std::unique_lock<std::mutex> lock(mutex);
    Check(cv.wait_for(lock, std::chrono::seconds(kHangSeconds), [&] { return worker_received; }),
          tag + "the worker's PollControl(-1) never returned the message");
  }
  poller.join();
  Pass(tag + "frames a SendControl buffers while another thread waits in PollControl(-1) reach that thread");
}

}  // namespace

int main() {
  SetLogLevel(LogLevel::kError);
  const auto start = std::chrono::steady_clock::now();
  TestTwoRanksCrossing();
  TestCoordinatorAndWorkers();
  TestPollerOnAnotherThread();
  std::printf("all tcp control checks passed in %.1f s\n", SecondsSince(start));
  return 0;
}
