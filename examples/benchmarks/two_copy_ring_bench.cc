// The fastest a two-copy ring allreduce of 2 ranks can be on this host: a reference, not Horo.
//
// Two processes, one per CPU, each with its own float buffer. As in a 2-rank ring allreduce, each
// sends half its buffer through a shared-memory ring (one per direction) while reducing the half
// the peer sends into its own (scatter-reduce), then sends its reduced half while copying the
// peer's into its buffer (allgather). It has nothing else: no negotiation, no slices, no waiting
// other than spinning on the ring counters, plain memcpy and a plain loop for the sum. Horo's
// allreduce moves the same bytes the same way (two copies per byte: into the ring, out of it), so
// its time over this program's is what its machinery costs (docs/benchmarks.md).
//
//   g++ -std=c++17 -O3 -march=native examples/benchmarks/two_copy_ring_bench.cc -o /tmp/two_copy_ring_bench
//   /tmp/two_copy_ring_bench [ring bytes, default 512 KiB] [chunk bytes, default 256 KiB] [sizes in MiB...]
//
// Prints the median of 7 timed allreduces per size (after one untimed), as latency and busbw.
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

namespace {

struct alignas(64) Counters {
  std::atomic<size_t> head{0};
  alignas(64) std::atomic<size_t> tail{0};
};

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t ring = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : size_t{512} << 10;
  const size_t chunk = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : size_t{256} << 10;
  std::vector<size_t> sizes;
  for (int i = 3; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10) << 20);
  if (sizes.empty()) sizes = {size_t{1} << 20, size_t{4} << 20, size_t{16} << 20, size_t{64} << 20};
  if (ring % chunk != 0) {
    std::fprintf(stderr, "the ring (%zu bytes) must hold a whole number of chunks (%zu bytes)\n", ring, chunk);
    return 2;
  }
  char* shared = static_cast<char*>(
      mmap(nullptr, 2 * ring + 2 * sizeof(Counters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (shared == MAP_FAILED) return 1;
  Counters* counters = new (shared + 2 * ring) Counters[2];
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  CPU_SET(me, &cpus);
  sched_setaffinity(0, sizeof cpus, &cpus);
  char* out = shared + me * ring;  // this rank writes, the peer reads
  char* in = shared + (1 - me) * ring;
  Counters& mine = counters[me];
  Counters& theirs = counters[1 - me];
  size_t sent = 0, received = 0;  // stream positions, kept across allreduces
  for (size_t total : sizes) {
    const size_t half = total / 2;
    if (half % chunk != 0) {
      if (me == 0) std::printf("%zu MiB: skipped (half is not a whole number of chunks)\n", total >> 20);
      continue;
    }
    std::vector<float> buffer(total / sizeof(float), 1.0f);
    std::vector<double> times;
    for (int rep = 0; rep < 8; ++rep) {
      const double start = Seconds();
      for (int phase = 0; phase < 2; ++phase) {
        // scatter-reduce: send the peer's half, reduce into mine; allgather: send mine, copy theirs
        char* base = reinterpret_cast<char*>(buffer.data());
        const char* source = base + (phase == 0 ? 1 - me : me) * half;
        char* destination = base + (phase == 0 ? me : 1 - me) * half;
        size_t sent_here = 0, received_here = 0;
        while (sent_here < half || received_here < half) {
          if (sent_here < half && sent + chunk - mine.tail.load(std::memory_order_acquire) <= ring) {
            std::memcpy(out + sent % ring, source + sent_here, chunk);
            sent += chunk;
            sent_here += chunk;
            mine.head.store(sent, std::memory_order_release);
          }
          if (received_here < half && theirs.head.load(std::memory_order_acquire) >= received + chunk) {
            const char* from = in + received % ring;
            if (phase == 0) {
              float* d = reinterpret_cast<float*>(destination + received_here);
              const float* s = reinterpret_cast<const float*>(from);
              for (size_t i = 0; i < chunk / sizeof(float); ++i) d[i] += s[i];
            } else {
              std::memcpy(destination + received_here, from, chunk);
            }
            received += chunk;
            received_here += chunk;
            theirs.tail.store(received, std::memory_order_release);
          }
        }
      }
      if (rep > 0) times.push_back(Seconds() - start);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    if (me == 0) {
      std::printf("%zu MiB: %.1f us, busbw %.2f GB/s (ring %zu KiB, chunk %zu KiB)\n", total >> 20, median * 1e6,
                  total / median / 1e9, ring >> 10, chunk >> 10);
    }
  }
  if (child != 0) waitpid(child, nullptr, 0);
  return 0;
}
