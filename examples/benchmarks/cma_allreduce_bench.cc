// Single-copy allreduce through Linux cross-memory attach (process_vm_readv) against the core's
// ring allreduce over shared memory, 2 ranks as 2 processes on this host, measured side by side.
//
// The CMA variant is the "owner computes" allreduce of Open MPI's vader/CMA and MPICH: each rank
// publishes the address of its buffer (exchanged once, outside the timing, with one small message;
// the per-iteration start sync still costs one), rank r reads block r of its peer straight from the
// peer's memory in pieces of piece_kib KiB into a small scratch and reduces it into its own block r,
// the ranks sync, rank r reads the other block from its owner directly into its buffer, and a final
// sync keeps the peer's buffer alive until every read is done. Each rank so copies S/2 + S/2 bytes
// once, where the ring copies each byte twice (into the shared ring and out of it).
//
// Every variant runs on two kinds of buffer: plain malloc memory (4 KiB pages, what a torch tensor
// is unless THP_MEM_ALLOC_ENABLE=1) and memory advised to transparent huge pages. The ring runs
// as the core runs it (its scatter-reduce reduces straight out of the shared-memory ring) and as
// it ran before (received into a scratch buffer, then reduced), each with 1 MiB and 256 KiB chunks. Variants take turns
// iteration by iteration, so that drift in machine load hits all of them alike; an iteration counts
// as the slower rank's time and the table shows medians and busbw (= S / time for 2 ranks).
//
//   g++ -std=c++17 -O3 -pthread -I horo_core/src -I horo_core/include \
//       examples/benchmarks/cma_allreduce_bench.cc horo_core/src/collectives/*.cc \
//       horo_core/src/transport/{tcp,shm}/*.cc \
//       horo_core/src/common/*.cc -o /tmp/cma_allreduce_bench
//   /tmp/cma_allreduce_bench [megabytes...]
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collectives.h"
#include "collectives/group_io.h"
#include "collectives/reduce_kernels.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

#include "bench_util.h"

using namespace horo;
using Clock = std::chrono::steady_clock;

namespace {

// A one-byte exchange with the peer: both ranks have reached this point.
void Sync(const CommGroup& group) {
  char out = 1, in = 0;
  Require(ExchangeWithMembers(group, 1 - group.index, &out, 1, 1 - group.index, &in, 1, "sync", 0), "sync");
}

struct Peer {
  pid_t pid = 0;
  uint64_t address = 0;  // of the peer's buffer of the same kind
};

void ReadPeer(const Peer& peer, uint64_t offset, void* into, size_t len) {
  iovec local = {into, len};
  iovec remote = {reinterpret_cast<void*>(peer.address + offset), len};
  const ssize_t got = ::process_vm_readv(peer.pid, &local, 1, &remote, 1, 0);
  if (got != static_cast<ssize_t>(len)) {
    std::perror("process_vm_readv");
    std::exit(1);
  }
}

// 2 ranks: rank r owns block r (the first count/2 elements are block 0).
void AllreduceCma(const CommGroup& group, const Peer& peer, float* data, int64_t count, size_t piece_bytes,
                  std::vector<float>* scratch) {
  const int me = group.index;
  const int64_t half = count / 2;
  const int64_t begin[2] = {0, half};
  const int64_t size[2] = {half, count - half};
  const int64_t piece = static_cast<int64_t>(piece_bytes / sizeof(float));
  scratch->resize(static_cast<size_t>(piece));
  Sync(group);  // the peer's buffer holds its input
  for (int64_t at = 0; at < size[me]; at += piece) {
    const int64_t n = std::min(piece, size[me] - at);
    ReadPeer(peer, (begin[me] + at) * sizeof(float), scratch->data(), n * sizeof(float));
    ReduceInto(data + begin[me] + at, scratch->data(), n, DataType::kFloat32, ReduceOp::kSum);
  }
  Sync(group);  // both blocks are reduced
  const int other = 1 - me;
  const int64_t big = int64_t{1} << 18;  // 1 MiB of floats per read straight into the buffer
  for (int64_t at = 0; at < size[other]; at += big) {
    const int64_t n = std::min(big, size[other] - at);
    ReadPeer(peer, (begin[other] + at) * sizeof(float), data + begin[other] + at, n * sizeof(float));
  }
  Sync(group);  // the peer no longer reads this buffer
}

float* Allocate(size_t bytes, bool huge) {
  void* p = nullptr;
  if (huge) {
    bytes = (bytes + (2u << 20) - 1) & ~size_t{(2u << 20) - 1};
    if (posix_memalign(&p, 2u << 20, bytes) != 0) std::exit(1);
    ::madvise(p, bytes, MADV_HUGEPAGE);
  } else {
    p = std::malloc(bytes);  // large: mmap'd 4 KiB pages
  }
  std::memset(p, 0, bytes);
  return static_cast<float*>(p);
}

// The shared-memory transport as the ring saw it before it reduced on receive: SendRecvReduce is
// left to the base class (Unsupported), so the scatter-reduce receives into scratch and reduces.
class CopyingTransport : public Transport {
 public:
  explicit CopyingTransport(Transport* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  Status Send(int peer, const void* data, size_t len) override { return inner_->Send(peer, data, len); }
  Status Recv(int peer, void* data, size_t len) override { return inner_->Recv(peer, data, len); }
  Status SendRecv(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                  size_t recv_len) override {
    return inner_->SendRecv(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  }
  Status SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                          size_t recv_len) override {
    return inner_->SendRecvUncached(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  }
  Status SendControl(int peer, const std::string& payload) override { return inner_->SendControl(peer, payload); }
  Status PollControl(int timeout_ms, std::vector<ControlMessage>* messages, std::vector<int>* lost_peers) override {
    return inner_->PollControl(timeout_ms, messages, lost_peers);
  }
  void Wake() override { inner_->Wake(); }
  void Close() override { inner_->Close(); }

 private:
  Transport* inner_;
};

struct Variant {
  std::string name;
  bool huge;
  std::function<void(const CommGroup&, float*, int64_t)> run;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> megabytes;
  for (int i = 1; i < argc; ++i) megabytes.push_back(std::atoll(argv[i]));
  if (megabytes.empty()) megabytes = {4, 16, 64};
  const int64_t largest = *std::max_element(megabytes.begin(), megabytes.end()) << 20;

  // Listen for both ranks, then fork: each process connects its own rank.
  std::vector<std::unique_ptr<ShmTransport>> mesh(2);
  std::vector<std::string> addresses(2);
  for (int rank = 0; rank < 2; ++rank) {
    TcpOptions tcp;
    tcp.rank = rank;
    tcp.size = 2;
    tcp.secret = "cma allreduce benchmark";
    std::unique_ptr<TcpTransport> listener;
    Require(TcpTransport::Listen(tcp, &listener), "listen");
    mesh[rank] = std::make_unique<ShmTransport>(std::move(listener), ShmOptions());
    addresses[rank] = mesh[rank]->address();
  }
  const pid_t child = ::fork();
  const int rank = child == 0 ? 1 : 0;
  ShmTransport* transport = mesh[rank].release();  // the other rank's listener is left alone
  Require(transport->Connect(addresses), "connect");
  CommGroup group;
  group.transport = transport;
  group.ranks = {0, 1};
  group.index = rank;

  float* buffers[2] = {Allocate(largest, false), Allocate(largest, true)};
  Peer peers[2];
  for (int kind = 0; kind < 2; ++kind) {
    uint64_t mine[2] = {static_cast<uint64_t>(::getpid()), reinterpret_cast<uint64_t>(buffers[kind])};
    uint64_t theirs[2] = {};
    Require(ExchangeWithMembers(group, 1 - rank, mine, sizeof(mine), 1 - rank, theirs, sizeof(theirs), "addr", 0),
            "address exchange");
    peers[kind].pid = static_cast<pid_t>(theirs[0]);
    peers[kind].address = theirs[1];
  }

  CopyingTransport copying(transport);
  CommGroup copying_group = group;
  copying_group.transport = &copying;
  std::vector<float> scratch;
  std::vector<Variant> variants;
  for (int huge = 0; huge < 2; ++huge) {
    for (int copying = 1; copying >= 0; --copying) {
      for (int64_t chunk : {int64_t{1} << 20, int64_t{256} << 10}) {
        variants.push_back({std::string(copying ? "ring, scratch " : "ring, from ring ") + std::to_string(chunk >> 10) +
                                "K",
                            huge == 1, [chunk, copying, &copying_group](const CommGroup& g, float* d, int64_t n) {
                              AllreduceOptions options;
                              options.chunk_bytes = chunk;
                              Require(AllreduceRing(copying ? copying_group : g, d, n, DataType::kFloat32,
                                                    ReduceOp::kSum, options),
                                      "ring");
                            }});
      }
    }
    for (size_t piece : {size_t{256} << 10, size_t{1} << 20}) {
      variants.push_back({"cma " + std::to_string(piece >> 10) + "K", huge == 1,
                          [&peers, &scratch, huge, piece](const CommGroup& g, float* d, int64_t n) {
                            AllreduceCma(g, peers[huge], d, n, piece, &scratch);
                          }});
    }
  }

  if (rank == 0) {
    std::printf("| size | pages | variant | median | busbw GB/s |\n|---:|---|---|---:|---:|\n");
  }
  for (int64_t mb : megabytes) {
    const int64_t count = (mb << 20) / static_cast<int64_t>(sizeof(float));
    const int iterations = mb <= 16 ? 40 : 12;
    std::vector<std::vector<double>> times(variants.size());
    for (int it = 0; it < iterations + 2; ++it) {
      for (size_t v = 0; v < variants.size(); ++v) {
        float* data = buffers[variants[v].huge ? 1 : 0];
        for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + 1 + (i & 7));
        Sync(group);
        const auto start = Clock::now();
        variants[v].run(group, data, count);
        double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        double theirs = 0;
        Require(ExchangeWithMembers(group, 1 - rank, &seconds, 8, 1 - rank, &theirs, 8, "time", 0), "time");
        for (int64_t i = 0; i < count; i += 4099) {
          if (data[i] != static_cast<float>(3 + 2 * (i & 7))) {
            std::fprintf(stderr, "%s: wrong sum at %lld\n", variants[v].name.c_str(), static_cast<long long>(i));
            return 1;
          }
        }
        if (it >= 2) times[v].push_back(std::max(seconds, theirs));
      }
    }
    if (rank != 0) continue;
    for (size_t v = 0; v < variants.size(); ++v) {
      std::sort(times[v].begin(), times[v].end());
      const double median = times[v][times[v].size() / 2];
      std::printf("| %lld MB | %s | %s | %.2f ms | %.2f |\n", static_cast<long long>(mb),
                  variants[v].huge ? "huge" : "4K", variants[v].name.c_str(), median * 1e3,
                  static_cast<double>(mb << 20) / median / 1e9);
    }
    std::fflush(stdout);
  }
  if (child != 0) ::waitpid(child, nullptr, 0);
  std::_Exit(0);
}
