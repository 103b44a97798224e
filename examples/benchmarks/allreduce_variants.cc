// Allreduce design variants measured side by side in one process, over the real transports
// (TCP on 127.0.0.1 plus shared memory between ranks of one host). Ranks are threads; host names
// are overridden per rank, so "hosts" are emulated on this machine: shared memory inside a host,
// TCP loopback between hosts. Every variant runs the same float32 Sum, variants take turns
// iteration by iteration so that drift in machine load hits all of them alike, and each iteration
// counts as the slowest rank's time. The table shows medians.
//
//  hierarchy: 4 ranks on 2 hosts (2+2)
//    flat         ring (recursive doubling up to 64 KiB) over all 4 ranks, ignoring hosts
//    sharded      the core's hierarchical allreduce: local reduce-scatter, one cross-host allreduce
//                 per shard, local allgather
//    leader       reduce to one leader per host (pipelined in 1 MiB chunks), allreduce among the
//                 leaders, broadcast from the leader inside the host
//  channels: 2 ranks on 1 host (shared memory only)
//    1 channel    ring allreduce of the whole buffer
//    2 channels   the buffer halved, each half reduced by its own ring on its own mesh and thread
//
// Built and run by hierarchical_bench.py --variants; or by hand:
//   g++ -std=c++17 -O3 -pthread -I horo_core/src -I horo_core/include \
//       examples/benchmarks/allreduce_variants.cc horo_core/src/collectives/*.cc \
//       horo_core/src/transport/{tcp,shm}/*.cc \
//       horo_core/src/common/*.cc -o /tmp/allreduce_variants
//   /tmp/allreduce_variants [max_megabytes] [seconds_per_cell]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/host_topology.h"
#include "collectives/reduce_kernels.h"
#include "common/logging.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

#include "bench_util.h"

using namespace horo;
using Clock = std::chrono::steady_clock;

namespace {

// A reusable barrier for the rank threads (C++17 has none).
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      done_.notify_all();
    } else {
      done_.wait(lock, [&] { return generation != generation_; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_;
  const int count_;
  int waiting_ = 0;
  int generation_ = 0;
};

using Mesh = std::vector<std::unique_ptr<ShmTransport>>;

Mesh BuildMesh(const std::vector<std::string>& hosts) {
  const int n = static_cast<int>(hosts.size());
  Mesh mesh(n);
  std::vector<std::string> addresses(n);
  for (int rank = 0; rank < n; ++rank) {
    TcpOptions tcp;
    tcp.rank = rank;
    tcp.size = n;
    tcp.secret = "allreduce variants benchmark";
    ShmOptions shm;
    shm.host = hosts[rank];
    std::unique_ptr<TcpTransport> listener;
    Require(TcpTransport::Listen(tcp, &listener), "listen");
    mesh[rank] = std::make_unique<ShmTransport>(std::move(listener), shm);
    addresses[rank] = mesh[rank]->address();
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] { Require(mesh[rank]->Connect(addresses), "connect"); });
  }
  for (auto& t : threads) t.join();
  return mesh;
}

CommGroup WorldGroup(Transport* transport) {
  CommGroup g;
  g.transport = transport;
  for (int r = 0; r < transport->size(); ++r) g.ranks.push_back(r);
  g.index = transport->rank();
  return g;
}

// Reduce to the first member of each host, allreduce among those, broadcast inside each host.
Status AllreduceViaLeaders(const CommGroup& group, const HostTopology& topology, float* data, int64_t count,
                           std::vector<float>* scratch) {
  constexpr int64_t kChunk = (1 << 20) / sizeof(float);
  const CommGroup local = LocalGroup(group, topology);
  const int64_t bytes = count * static_cast<int64_t>(sizeof(float));
  if (local.index != 0) {
    HORO_RETURN_IF_ERROR(ExchangeWithMembers(local, 0, data, bytes, -1, nullptr, 0, "leader reduce", 0));
  } else {
    scratch->resize(static_cast<size_t>(std::min(count, kChunk)));
    for (int member = 1; member < local.size(); ++member) {
      for (int64_t begin = 0; begin < count; begin += kChunk) {
        const int64_t n = std::min(kChunk, count - begin);
        HORO_RETURN_IF_ERROR(ExchangeWithMembers(local, -1, nullptr, 0, member, scratch->data(),
                                                 n * static_cast<int64_t>(sizeof(float)), "leader reduce", 0));
        ReduceInto(data + begin, scratch->data(), n, DataType::kFloat32, ReduceOp::kSum);
      }
    }
    const CommGroup leaders = CrossGroup(group, topology);
    HORO_RETURN_IF_ERROR(Allreduce(leaders, data, count, DataType::kFloat32, ReduceOp::kSum, AllreduceOptions()));
  }
  return Broadcast(local, data, bytes, 0);
}

struct Variant {
  std::string name;
  // Runs one allreduce of count floats on the given rank; must leave the exact Sum in data.
  std::function<Status(int rank, float* data, int64_t count)> run;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string Size(int64_t bytes) {
  char text[32];
  if (bytes >= (1 << 20)) std::snprintf(text, sizeof(text), "%lld MB", static_cast<long long>(bytes >> 20));
  else std::snprintf(text, sizeof(text), "%lld KB", static_cast<long long>(bytes >> 10));
  return text;
}

// Runs every variant on `ranks` threads, taking turns per iteration, and prints one row per size.
void Compare(const char* title, int ranks, const std::vector<Variant>& variants, const std::vector<int64_t>& sizes,
             double seconds_per_cell) {
  std::printf("\n%s (median per allreduce; ratio = time / %s's)\n%-8s", title, variants[0].name.c_str(), "size");
  for (const Variant& v : variants) std::printf(" %14s", v.name.c_str());
  for (size_t i = 1; i < variants.size(); ++i) std::printf(" %10s", ("ratio " + std::to_string(i)).c_str());
  std::printf("\n");
  for (int64_t bytes : sizes) {
    const int64_t count = bytes / static_cast<int64_t>(sizeof(float));
    std::vector<std::vector<float>> buffers(ranks, std::vector<float>(count));
    std::vector<std::vector<double>> times(variants.size());
    std::vector<std::vector<double>> per_rank(ranks, std::vector<double>(variants.size()));
    Barrier barrier(ranks);
    // Enough iterations for about seconds_per_cell per variant, judged from a first round.
    int iterations = 3;
    bool sized = false;
    std::vector<std::thread> threads;
    for (int rank = 0; rank < ranks; ++rank) {
      threads.emplace_back([&, rank] {
        for (int it = 0; it < iterations + 1; ++it) {  // iteration 0 warms up
          for (size_t v = 0; v < variants.size(); ++v) {
            std::fill(buffers[rank].begin(), buffers[rank].end(), static_cast<float>(rank + 1));
            barrier.Wait();
            const auto start = Clock::now();
            Require(variants[v].run(rank, buffers[rank].data(), count), variants[v].name);
            per_rank[rank][v] = std::chrono::duration<double>(Clock::now() - start).count();
            const float want = static_cast<float>(ranks * (ranks + 1) / 2);
            if (buffers[rank][count - 1] != want || buffers[rank][0] != want) {
              std::fprintf(stderr, "%s: wrong result on rank %d\n", variants[v].name.c_str(), rank);
              std::exit(1);
            }
            barrier.Wait();
            if (rank == 0 && it > 0) {
              double slowest = 0;
              for (int r = 0; r < ranks; ++r) slowest = std::max(slowest, per_rank[r][v]);
              times[v].push_back(slowest);
            }
          }
          if (rank == 0 && it == 1 && !sized) {
            double round = 0;
            for (const auto& t : times) round += t.back();
            iterations = std::max(3, std::min(200, static_cast<int>(seconds_per_cell * variants.size() / round)));
            sized = true;
          }
          barrier.Wait();  // every rank sees the final iteration count
        }
      });
    }
    for (auto& t : threads) t.join();
    std::printf("%-8s", Size(bytes).c_str());
    std::vector<double> medians;
    for (const auto& t : times) medians.push_back(Median(t));
    for (double m : medians) std::printf(" %11.3f ms", m * 1e3);
    for (size_t i = 1; i < medians.size(); ++i) std::printf(" %10.2f", medians[i] / medians[0]);
    std::printf("   (%d iterations)\n", iterations);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  SetLogLevel(LogLevel::kError);
  const int64_t max_bytes = (argc > 1 ? std::atoll(argv[1]) : 64) << 20;
  const double seconds_per_cell = argc > 2 ? std::atof(argv[2]) : 1.0;
  std::vector<int64_t> sizes;
  for (int64_t bytes = 16 << 10; bytes <= max_bytes; bytes *= 4) sizes.push_back(bytes);

  {
    const std::vector<std::string> hosts = {"host-a", "host-a", "host-b", "host-b"};
    Mesh mesh = BuildMesh(hosts);
    std::vector<HostTopology> topologies(4);
    for (int r = 0; r < 4; ++r) Require(BuildHostTopology({0, 1, 2, 3}, r, mesh[r]->HostIds(), &topologies[r]), "topology");
    std::vector<std::vector<float>> scratch(4);
    std::vector<Variant> variants = {
        {"flat", [&](int r, float* d, int64_t n) {
           return Allreduce(WorldGroup(mesh[r].get()), d, n, DataType::kFloat32, ReduceOp::kSum, AllreduceOptions());
         }},
        {"sharded", [&](int r, float* d, int64_t n) {
           return AllreduceHierarchical(WorldGroup(mesh[r].get()), topologies[r], d, n, DataType::kFloat32,
                                        ReduceOp::kSum, AllreduceOptions());
         }},
        {"leader", [&](int r, float* d, int64_t n) {
           return AllreduceViaLeaders(WorldGroup(mesh[r].get()), topologies[r], d, n, &scratch[r]);
         }},
    };
    Compare("hierarchy: 4 ranks on 2 emulated hosts", 4, variants, sizes, seconds_per_cell);
  }
  {
    const std::vector<std::string> hosts = {"host-a", "host-a"};
    std::vector<Mesh> channels;
    channels.push_back(BuildMesh(hosts));
    channels.push_back(BuildMesh(hosts));
    std::vector<Variant> variants = {
        {"1 channel", [&](int r, float* d, int64_t n) {
           return AllreduceRing(WorldGroup(channels[0][r].get()), d, n, DataType::kFloat32, ReduceOp::kSum,
                                AllreduceOptions());
         }},
        {"2 channels", [&](int r, float* d, int64_t n) {
           const int64_t half = n / 2;
           Status second;
           std::thread helper([&] {
             second = AllreduceRing(WorldGroup(channels[1][r].get()), d + half, n - half, DataType::kFloat32,
                                    ReduceOp::kSum, AllreduceOptions());
           });
           Status first = AllreduceRing(WorldGroup(channels[0][r].get()), d, half, DataType::kFloat32, ReduceOp::kSum,
                                        AllreduceOptions());
           helper.join();
           return first.ok() ? second : first;
         }},
    };
    std::vector<int64_t> large;
    for (int64_t bytes : sizes) {
      if (bytes >= (1 << 20)) large.push_back(bytes);
    }
    Compare("channels: 2 ranks on 1 host, shared memory", 2, variants, large, seconds_per_cell);
  }
  return 0;
}
