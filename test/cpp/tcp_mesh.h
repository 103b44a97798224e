// Meshes of TCP transports as threads of one process on 127.0.0.1, shared by the TCP transport
// tests (test_tcp_transport.cc, test_tcp_control.cc): every rank listens, the addresses are
// exchanged in memory, then all ranks connect at once (as a rendezvous would).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/transport.h"
#include "transport_checks.h"

namespace horo_test {

inline const std::string kSecret = "per-job secret \x01\x02\x03 for the tcp transport test";

inline horo::TcpOptions Options(int rank, int size) {
  horo::TcpOptions options;
  options.rank = rank;
  options.size = size;
  options.secret = kSecret;
  options.connect_timeout_seconds = 20;
  options.data_timeout_seconds = 20;
  return options;
}

struct Mesh {
  std::vector<std::unique_ptr<horo::TcpTransport>> ranks;
  std::vector<std::string> addresses;
};

// Listens on every rank; adjust may change each rank's options first.
inline void ListenAll(int n, Mesh* mesh, const std::function<void(horo::TcpOptions*)>& adjust = nullptr) {
  mesh->ranks.resize(n);
  mesh->addresses.resize(n);
  for (int rank = 0; rank < n; ++rank) {
    horo::TcpOptions options = Options(rank, n);
    if (adjust) adjust(&options);
    ExpectOk(horo::TcpTransport::Listen(options, &mesh->ranks[rank]), "Listen rank " + std::to_string(rank));
    mesh->addresses[rank] = mesh->ranks[rank]->address();
  }
}

inline std::vector<horo::Status> ConnectAll(Mesh* mesh) {
  int n = static_cast<int>(mesh->ranks.size());
  std::vector<horo::Status> results(n);
  RunRanks(n, [&](int rank) { results[rank] = mesh->ranks[rank]->Connect(mesh->addresses); });
  return results;
}

inline Mesh BuildMesh(int n, const std::function<void(horo::TcpOptions*)>& adjust = nullptr) {
  Mesh mesh;
  ListenAll(n, &mesh, adjust);
  std::vector<horo::Status> results = ConnectAll(&mesh);
  for (int rank = 0; rank < n; ++rank) ExpectOk(results[rank], "Connect rank " + std::to_string(rank));
  return mesh;
}

// Threads as ranks meet here: Wait() returns once count threads have called it (reusable).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    int generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation != generation_; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_;
  int arrived_ = 0;
  int generation_ = 0;
};

}  // namespace horo_test
