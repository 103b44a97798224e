// sources: collectives/allreduce.cc collectives/allreduce_ring.cc common/cpu_cache.cc collectives/allreduce_tree.cc collectives/allreduce_hierarchical.cc collectives/host_topology.cc collectives/allgather.cc collectives/allgather_ring.cc collectives/allgather_hierarchical.cc collectives/broadcast_tree.cc collectives/alltoall_pairwise.cc collectives/reducescatter_ring.cc collectives/ring_phases.cc collectives/group_io.cc collectives/reduce_kernels.cc transport/loopback/*.cc transport/counting/transport.cc common/dtype.cc
//
// The collective algorithms over the loopback transport, ranks being threads. Every value checked
// is exact and derived from the member index: member m contributes small integers chosen so that
// sums, products, minima and maxima are exactly representable in every dtype, and the expected
// result is the same fold computed in double. Matrix: world sizes {1,2,3,4,5,8} x counts
// {0,1,7,1000,65537} x 10 dtypes x {Sum,Min,Max,Product} x {ring, recursive doubling, dispatcher},
// plus allgather, broadcast, alltoall and reducescatter with uneven and zero
// sizes, a process set of scattered ranks, bitwise-identical float results across members, and
// PeerLost when a member disappears. Prints one line per group of checks; exits 1 on the first
// failure.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collective_checks.h"
#include "collectives/collectives.h"
#include "collectives/host_topology.h"
#include "collectives/reduce_kernels.h"
#include "common/half.h"
#include "transport/counting/transport.h"
#include "transport/loopback/transport.h"
#include "unit_check.h"

using namespace horo;
using namespace horo_test;

namespace {

const int kWorldSizes[] = {1, 2, 3, 4, 5, 8};
const int64_t kCounts[] = {0, 1, 7, 1000, 65537};

// ---- allreduce ---------------------------------------------------------------------------------

enum class Algorithm { kRing, kSmall, kDispatch };
const char* AlgorithmName(Algorithm a) {
  return a == Algorithm::kRing ? "ring" : a == Algorithm::kSmall ? "recursive doubling" : "dispatcher";
}

Status RunAllreduce(Algorithm algorithm, const CommGroup& g, void* buffer, int64_t count, DataType dtype, ReduceOp op) {
  AllreduceOptions small_chunks;
  small_chunks.chunk_bytes = 999;  // many chunks per block, and not a multiple of any element size
  switch (algorithm) {
    case Algorithm::kRing: return AllreduceRing(g, buffer, count, dtype, op, small_chunks);
    case Algorithm::kSmall: return AllreduceSmall(g, buffer, count, dtype, op);
    default: return Allreduce(g, buffer, count, dtype, op, AllreduceOptions());
  }
}

void CheckAllreduceMatrix(const CommGroup& g) {
  for (int64_t count : kCounts) {
    for (DataType dtype : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        const std::vector<uint8_t> input = MemberInput(g.index, count, dtype, op);
        const std::vector<uint8_t> expected = ExpectedReduction(g.size(), count, dtype, op);
        for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kSmall, Algorithm::kDispatch}) {
          std::vector<uint8_t> buffer = input;
          const std::string what = Label(g, std::string("allreduce ") + AlgorithmName(algorithm) + " " +
                                                DataTypeName(dtype) + " " + ReduceOpName(op) + " count " +
                                                std::to_string(count));
          CheckOk(RunAllreduce(algorithm, g, buffer.data(), count, dtype, op), what);
          ExpectBytes(buffer.data(), expected.data(), count, dtype, what);
        }
      }
    }
  }
}

// Random float32 data spanning many magnitudes: the sum depends on the association, so any
// member-dependent order would show up as differing bits.
void CheckBitwiseIdentical() {
  const int64_t count = 4099;
  for (int members : {2, 3, 5, 6, 7, 8}) {
    std::vector<std::vector<float>> inputs(members, std::vector<float>(count));
    std::mt19937 rng(1234 + members);
    std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-20, 20);
    for (auto& input : inputs) {
      for (float& v : input) v = std::ldexp(mantissa(rng), exponent(rng));
    }
    // The data must be able to expose order differences: forward and backward sums must differ.
    int order_sensitive = 0;
    for (int64_t j = 0; j < count; ++j) {
      float forward = 0, backward = 0;
      for (int m = 0; m < members; ++m) forward += inputs[m][j];
      for (int m = members - 1; m >= 0; --m) backward += inputs[m][j];
      order_sensitive += forward != backward;
    }
    if (members > 2 && order_sensitive == 0) Fail("bitwise test data is not order sensitive");

    for (Algorithm algorithm : {Algorithm::kSmall, Algorithm::kRing}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kProduct}) {
        std::vector<std::vector<float>> results = inputs;
        if (op == ReduceOp::kMin) {  // signed zeros: min(+0, -0) depends on the operand order
          for (int m = 0; m < members; ++m) {
            for (int64_t j = 0; j < count; ++j) results[m][j] = ((j * 7 + m * 3) % 5) < 2 ? -0.0f : 0.0f;
          }
        }
        if (op == ReduceOp::kProduct) {  // NaNs with member-specific payloads: the survivor depends on order
          for (int m = 0; m < members; ++m) {
            for (int64_t j = 0; j < count; j += 3) results[m][j] = FloatFromBits(0x7fc00001u + m);
          }
        }
        RunWorld(members, [&](const CommGroup& g) {
          CheckOk(RunAllreduce(algorithm, g, results[g.index].data(), count, DataType::kFloat32, op),
                  Label(g, "bitwise allreduce"));
        });
        for (int m = 1; m < members; ++m) {
          ++g_checks;
          if (std::memcmp(results[m].data(), results[0].data(), count * sizeof(float)) != 0) {
            Fail(std::string("allreduce ") + AlgorithmName(algorithm) + " " + ReduceOpName(op) + " with " +
                 std::to_string(members) + " members: member " + std::to_string(m) +
                 " is not bitwise identical to member 0");
          }
        }
      }
    }
  }
  std::printf("ok  allreduce results bitwise identical across members (float32 sums over 41 binades, "
              "signed-zero min, NaN payloads) for 2..8 members\n");
}

// ---- allgather, broadcast, alltoall, reducescatter ----------------------------------------------

uint8_t PatternByte(int a, int b, int64_t k) { return static_cast<uint8_t>(a * 31 + b * 7 + k * 13 + 1); }

void CheckAllgather(const CommGroup& g) {
  const int n = g.size();
  for (int variant = 0; variant < 5; ++variant) {
    std::vector<int64_t> sizes(n);
    for (int i = 0; i < n; ++i) {
      sizes[i] = variant < 3 ? ((i * 7 + variant) % 5) * 13 : variant == 3 ? 100003 + 1000 * i : 0;
    }
    int64_t total = 0, offset = 0;
    for (int i = 0; i < n; ++i) {
      if (i == g.index) offset = total;
      total += sizes[i];
    }
    std::vector<uint8_t> input(sizes[g.index]);
    for (int64_t k = 0; k < sizes[g.index]; ++k) input[k] = PatternByte(g.index, 0, k);
    std::vector<uint8_t> output(total, 0xee);
    const bool in_place = variant % 2 == 1;
    if (in_place && !input.empty()) std::memcpy(output.data() + offset, input.data(), input.size());
    const std::string what = Label(g, "allgather variant " + std::to_string(variant) + (in_place ? " in place" : ""));
    CheckOk(Allgather(g, in_place ? output.data() + offset : input.data(), output.data(), sizes), what);
    std::vector<uint8_t> expected;
    for (int i = 0; i < n; ++i) {
      for (int64_t k = 0; k < sizes[i]; ++k) expected.push_back(PatternByte(i, 0, k));
    }
    ExpectBytes(output.data(), expected.data(), total, DataType::kUInt8, what);
  }
}

void CheckBroadcast(const CommGroup& g) {
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1000}, int64_t{(3 << 20) + 5}}) {
    for (int root = 0; root < g.size(); ++root) {
      std::vector<uint8_t> buffer(bytes), expected(bytes);
      for (int64_t k = 0; k < bytes; ++k) expected[k] = PatternByte(root, 1, k);
      if (g.index == root) buffer = expected;
      else std::fill(buffer.begin(), buffer.end(), 0xee);
      const std::string what = Label(g, "broadcast root " + std::to_string(root) + " bytes " + std::to_string(bytes));
      CheckOk(Broadcast(g, buffer.data(), bytes, root), what);
      ExpectBytes(buffer.data(), expected.data(), bytes, DataType::kUInt8, what);
    }
  }
}

int64_t AlltoallBytes(int from, int to, int variant) {
  return variant < 3 ? ((from + 2 * to + variant) % 4) * 6 : 50000 + 100 * from + to;
}

void CheckAlltoall(const CommGroup& g) {
  const int n = g.size();
  const int me = g.index;
  for (int variant = 0; variant < 4; ++variant) {
    std::vector<int64_t> send_bytes(n), recv_bytes(n);
    std::vector<uint8_t> input, expected;
    for (int j = 0; j < n; ++j) {
      send_bytes[j] = AlltoallBytes(me, j, variant);
      recv_bytes[j] = AlltoallBytes(j, me, variant);
      for (int64_t k = 0; k < send_bytes[j]; ++k) input.push_back(PatternByte(me, j, k));
      for (int64_t k = 0; k < recv_bytes[j]; ++k) expected.push_back(PatternByte(j, me, k));
    }
    std::vector<uint8_t> output(expected.size(), 0xee);
    const std::string what = Label(g, "alltoall variant " + std::to_string(variant));
    CheckOk(Alltoall(g, input.data(), send_bytes, output.data(), recv_bytes), what);
    ExpectBytes(output.data(), expected.data(), static_cast<int64_t>(expected.size()), DataType::kUInt8, what);
  }
}

void CheckReducescatter(const CommGroup& g, bool every_type) {
  const int n = g.size();
  for (int variant = 0; variant < 5; ++variant) {
    std::vector<int64_t> counts(n);
    for (int i = 0; i < n; ++i) counts[i] = variant < 3 ? ((i + variant) % 3) * 5 : variant == 3 ? 20001 + i : 0;
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    int64_t offset = 0;
    for (int i = 0; i < g.index; ++i) offset += counts[i];
    for (DataType dtype : kAllTypes) {
      if (!every_type && dtype != DataType::kInt32 && dtype != DataType::kFloat16) continue;
      const size_t size = DataTypeSize(dtype);
      for (ReduceOp op : kAllOps) {
        std::vector<uint8_t> input = MemberInput(g.index, total, dtype, op);
        const std::vector<uint8_t> expected = ExpectedReduction(n, total, dtype, op);
        std::vector<uint8_t> output(counts[g.index] * size, 0xee);
        AllreduceOptions options;
        options.chunk_bytes = variant == 3 ? 4096 : 999;
        const std::string what = Label(g, std::string("reducescatter ") + DataTypeName(dtype) + " " +
                                              ReduceOpName(op) + " variant " + std::to_string(variant));
        CheckOk(Reducescatter(g, input.data(), output.data(), counts, dtype, op, options), what);
        ExpectBytes(output.data(), expected.data() + offset * size, counts[g.index], dtype, what);
      }
    }
  }
}

// ---- a process set of scattered ranks, failures, argument errors ---------------------------------

void CheckProcessSet() {
  const std::vector<int> ranks = {5, 2, 0, 3};  // a set of 4 out of a world of 6, not in rank order
  RunGroup(6, ranks, [](const CommGroup& g) {
    for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kSmall, Algorithm::kDispatch}) {
      for (int64_t count : {int64_t{7}, int64_t{65537}}) {
        std::vector<uint8_t> buffer = MemberInput(g.index, count, DataType::kInt32, ReduceOp::kSum);
        const std::string what = Label(g, std::string("process set allreduce ") + AlgorithmName(algorithm));
        CheckOk(RunAllreduce(algorithm, g, buffer.data(), count, DataType::kInt32, ReduceOp::kSum), what);
        const std::vector<uint8_t> expected = ExpectedReduction(g.size(), count, DataType::kInt32, ReduceOp::kSum);
        ExpectBytes(buffer.data(), expected.data(), count, DataType::kInt32, what);
      }
    }
    CheckAllgather(g);
    CheckBroadcast(g);
    CheckAlltoall(g);
    CheckReducescatter(g, false);
  });
  std::printf("ok  process set {5,2,0,3} of a world of 6: allreduce, allgather, broadcast, alltoall, reducescatter\n");
}

void CheckPeerLost() {
  for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kSmall}) {
    auto hub = std::make_shared<LoopbackHub>(3);
    std::vector<std::unique_ptr<LoopbackTransport>> transports;
    for (int r = 0; r < 3; ++r) transports.push_back(std::make_unique<LoopbackTransport>(hub, r, 60.0));
    transports[2]->Close();  // member 2 is gone before the collective starts
    std::vector<Status> results(2);
    std::vector<std::thread> threads;
    for (int m = 0; m < 2; ++m) {
      threads.emplace_back([&, m] {
        CommGroup g;
        g.transport = transports[m].get();
        g.ranks = {0, 1, 2};
        g.index = m;
        std::vector<float> buffer(100000, 1.0f);
        results[m] = RunAllreduce(algorithm, g, buffer.data(), 100000, DataType::kFloat32, ReduceOp::kSum);
        transports[m]->Close();  // as the runtime does after a failure
      });
    }
    for (auto& t : threads) t.join();
    for (int m = 0; m < 2; ++m) {
      ++g_checks;
      const Status& s = results[m];
      if (s.code() != HORO_ERR_PEER_LOST || s.message().find("lost peer rank") == std::string::npos ||
          s.message().find("allreduce") == std::string::npos) {
        Fail(std::string("allreduce ") + AlgorithmName(algorithm) + " member " + std::to_string(m) +
             " with a lost peer: got status " + std::to_string(s.code()) + ": " + s.message());
      }
    }
    std::printf("ok  allreduce %s with a lost member fails on every member with PeerLost: %s\n",
                AlgorithmName(algorithm), results[0].message().c_str());
  }
}

// Ring options with chunks of 999 bytes; sliced: the members share one host (*one_host, filled in
// here) and the ring works in slices of slice_bytes.
AllreduceOptions SmallChunkRing(const CommGroup& g, bool sliced, int64_t slice_bytes, HostTopology* one_host) {
  CheckOk(BuildHostTopology(g.ranks, g.index, std::vector<int>(g.size(), 0), one_host), "one-host topology");
  AllreduceOptions options;
  options.chunk_bytes = 999;
  if (sliced) {
    options.topology = one_host;
    options.slice_bytes = slice_bytes;
  }
  return options;
}

// A CountingTransport (which forwards every call) that also adds up the bytes received through
// SendRecvUncached.
class UncachedRecorder : public CountingTransport {
 public:
  using CountingTransport::CountingTransport;
  int64_t uncached_bytes = 0;
  Status SendRecvUncached(int send_peer, const void* send_data, size_t send_len, int recv_peer, void* recv_data,
                          size_t recv_len) override {
    if (recv_peer != -1) uncached_bytes += static_cast<int64_t>(recv_len);
    return CountingTransport::SendRecvUncached(send_peer, send_data, send_len, recv_peer, recv_data, recv_len);
  }
};

// The default threshold for results written past the caches: the last-level cache, at least
// 16 MiB, and the sysfs size texts it is read from.
void CheckUncachedDefault() {
  const std::pair<const char*, int64_t> cases[] = {{"266240K", int64_t{266240} << 10}, {"32M", int64_t{32} << 20},
                                                   {"1G", int64_t{1} << 30}, {"512K\n", int64_t{512} << 10},
                                                   {"4096", 4096}, {"", 0}, {"K", 0}, {"12Q", 0}, {"1M2", 0},
                                                   {"99999999999999999999K", 0}, {"9999999999G", 0}};
  for (const auto& [text, bytes] : cases) {
    ++g_checks;
    if (ParseCacheSize(text) != bytes) {
      Fail(std::string("ParseCacheSize(\"") + text + "\") = " + std::to_string(ParseCacheSize(text)) + ", expected " +
           std::to_string(bytes));
    }
  }
  const int64_t llc = LastLevelCacheBytes();
  const int64_t expected = std::max(int64_t{16} << 20, llc);
  ++g_checks;
  if (AllreduceOptions().uncached_result_bytes != expected || DefaultUncachedResultBytes() != expected) {
    Fail("default uncached_result_bytes " + std::to_string(AllreduceOptions().uncached_result_bytes) +
         ", expected max(16 MiB, last-level cache " + std::to_string(llc) + ")");
  }
  std::printf("ok  uncached results by default from %lld bytes (last-level cache %lld bytes)\n",
              static_cast<long long>(expected), static_cast<long long>(llc));
}

// options.uncached_result_bytes: from that size on, a ring allreduce asks for the allgather's last
// received block (block index + 2, counted over all its slices) to be written past the caches,
// and for no other: every earlier received block is sent on at the next step and must stay cached.
// Below the size, nothing. Whole phases and slices (uneven blocks), 2 to 5 members, exact sums.
void CheckUncachedLastBlock() {
  const int64_t count = 65537;
  for (int members : {2, 3, 5}) {
    for (bool sliced : {false, true}) {
      for (bool large : {false, true}) {
        RunWorld(members, [&](const CommGroup& g) {
          UncachedRecorder recorder(g.transport);
          CommGroup recorded = g;
          recorded.transport = &recorder;
          HostTopology one_host;
          AllreduceOptions options = SmallChunkRing(g, sliced, 4096, &one_host);
          options.uncached_result_bytes = large ? count * 4 : count * 4 + 1;
          const std::string what = Label(g, std::string("uncached last block ") + (sliced ? "sliced" : "whole") +
                                                (large ? ", at the threshold" : ", below it"));
          std::vector<uint8_t> buffer = MemberInput(g.index, count, DataType::kFloat32, ReduceOp::kSum);
          CheckOk(AllreduceRing(recorded, buffer.data(), count, DataType::kFloat32, ReduceOp::kSum, options), what);
          ExpectBytes(buffer.data(), ExpectedReduction(g.size(), count, DataType::kFloat32, ReduceOp::kSum).data(), count,
                      DataType::kFloat32, what);
          const int last = (g.index + 2) % g.size();
          const int64_t last_bytes = 4 * (count / g.size() + (last < count % g.size() ? 1 : 0));
          ++g_checks;
          if (recorder.uncached_bytes != (large ? last_bytes : 0)) {
            Fail(what + ": " + std::to_string(recorder.uncached_bytes) + " bytes received uncached, expected " +
                 std::to_string(large ? last_bytes : 0));
          }
        });
      }
    }
  }
  std::printf("ok  uncached results: only the allgather's last block, whole phases and slices, 2/3/5 members\n");
}

// options.ring_postscale: each member scales the block it reduced, once, before the allgather, in
// whole phases (no topology) and slice by slice (one host, small slices, uneven blocks). The result
// must equal the ring's sum scaled afterwards, bit for bit and on every member; random float32 data
// with a factor of 1/3 (inexact) shows any block scaled twice, never or on one member only.
void CheckRingPostscale() {
  const DataType float_types[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
  for (int members : {1, 2, 3, 5}) {
    for (bool sliced : {false, true}) {
      RunWorld(members, [&](const CommGroup& g) {
        HostTopology one_host;
        // 1000 is not a multiple of 8: the ring rounds the slice down per element.
        AllreduceOptions options = SmallChunkRing(g, sliced, 1000, &one_host);
        for (int64_t count : {int64_t{0}, int64_t{7}, int64_t{1000}, int64_t{65537}}) {
          for (DataType dtype : float_types) {
            const std::string what = Label(g, std::string("ring postscale ") + (sliced ? "sliced " : "whole ") +
                                                  DataTypeName(dtype) + " count " + std::to_string(count));
            std::vector<uint8_t> buffer = MemberInput(g.index, count, dtype, ReduceOp::kSum);
            std::vector<uint8_t> expected = ExpectedReduction(g.size(), count, dtype, ReduceOp::kSum);
            ScaleBuffer(expected.data(), count, dtype, 0.25);  // exact: small integers times 1/4
            options.ring_postscale = 0.25;
            CheckOk(AllreduceRing(g, buffer.data(), count, dtype, ReduceOp::kSum, options), what);
            ExpectBytes(buffer.data(), expected.data(), count, dtype, what);
          }
        }
      });
    }
  }
  const int64_t count = 70001;
  for (int members : {2, 3, 5}) {
    std::vector<std::vector<float>> inputs(members, std::vector<float>(count));
    std::mt19937 rng(99 + members);
    std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
    for (auto& input : inputs) {
      for (float& v : input) v = value(rng);
    }
    std::vector<std::vector<float>> scaled = inputs, plain = inputs;
    RunWorld(members, [&](const CommGroup& g) {
      HostTopology one_host;
      CheckOk(BuildHostTopology(g.ranks, g.index, std::vector<int>(g.size(), 0), &one_host), "one-host topology");
      AllreduceOptions options;
      options.topology = &one_host;
      options.slice_bytes = 4096;
      CheckOk(AllreduceRing(g, plain[g.index].data(), count, DataType::kFloat32, ReduceOp::kSum, options),
              Label(g, "ring sum"));
      ScaleBuffer(plain[g.index].data(), count, DataType::kFloat32, 1.0 / 3.0);
      options.ring_postscale = 1.0 / 3.0;
      CheckOk(AllreduceRing(g, scaled[g.index].data(), count, DataType::kFloat32, ReduceOp::kSum, options),
              Label(g, "ring sum scaled by 1/3"));
    });
    for (int m = 0; m < members; ++m) {
      ++g_checks;
      if (std::memcmp(scaled[m].data(), plain[0].data(), count * sizeof(float)) != 0) {
        Fail("ring postscale 1/3 with " + std::to_string(members) + " members: member " + std::to_string(m) +
             " differs from the sum scaled afterwards");
      }
    }
  }
  std::printf("ok  ring postscale: 1-5 members x whole phases and slices x 4 float types x counts {0,7,1000,65537}, "
              "and bitwise equal to scaling afterwards\n");
}

void CheckArgumentErrors() {
  auto hub = std::make_shared<LoopbackHub>(1);
  LoopbackTransport transport(hub, 0);
  CommGroup g;
  g.transport = &transport;
  g.ranks = {0};
  float value = 1.0f;
  auto expect_invalid = [](const Status& s, const std::string& needle, const std::string& what) {
    ++g_checks;
    if (s.code() != HORO_ERR_INVALID_ARGUMENT || s.message().find(needle) == std::string::npos) {
      Fail(what + ": expected InvalidArgument mentioning \"" + needle + "\", got " + std::to_string(s.code()) +
           ": " + s.message());
    }
  };
  expect_invalid(Allreduce(g, &value, 1, DataType::kFloat32, ReduceOp::kAverage, AllreduceOptions()), "Average",
                 "allreduce with Average");
  expect_invalid(AllreduceSmall(g, &value, -1, DataType::kFloat32, ReduceOp::kSum), "negative count",
                 "negative count");
  AllreduceOptions zero_chunks;
  zero_chunks.chunk_bytes = 0;
  expect_invalid(AllreduceRing(g, &value, 1, DataType::kFloat32, ReduceOp::kSum, zero_chunks), "chunk_bytes",
                 "zero chunk size");
  AllreduceOptions scaled;
  scaled.ring_postscale = 0.5;
  int32_t integer = 4;
  expect_invalid(AllreduceRing(g, &integer, 1, DataType::kInt32, ReduceOp::kSum, scaled),
                 "a postscale needs a floating-point type, got int32", "integer postscale");
  expect_invalid(Allgather(g, &value, &value, {4, 4}), "2 entries of size for a group of 1", "allgather sizes");
  expect_invalid(Broadcast(g, &value, 4, 1), "root index 1", "broadcast root");
  expect_invalid(Alltoall(g, &value, {4}, &value, {0}), "sends 4 bytes to itself", "alltoall self block");
  expect_invalid(Reducescatter(g, &value, &value, {-1}, DataType::kFloat32, ReduceOp::kSum, AllreduceOptions()),
                 "negative count", "reducescatter counts");
  CommGroup no_transport;
  no_transport.ranks = {0};
  expect_invalid(Broadcast(no_transport, &value, 4, 0), "no transport", "group without transport");
  CommGroup wrong_rank = g;
  wrong_rank.ranks = {1};
  expect_invalid(Broadcast(wrong_rank, &value, 4, 0), "outside a world of 1", "member outside the world");
  std::printf("ok  argument errors: InvalidArgument with a message naming the problem\n");
}

}  // namespace

int main() {
  for (int size : kWorldSizes) {
    RunWorld(size, CheckAllreduceMatrix);
    std::printf("ok  allreduce matrix, %d members: counts {0,1,7,1000,65537} x 10 dtypes x 4 ops x "
                "{ring, recursive doubling, dispatcher}\n", size);
  }
  CheckBitwiseIdentical();
  CheckRingPostscale();
  CheckUncachedDefault();
  CheckUncachedLastBlock();
  for (int size : kWorldSizes) {
    RunWorld(size, [](const CommGroup& g) {
      CheckAllgather(g);
      CheckBroadcast(g);
      CheckAlltoall(g);
      CheckReducescatter(g, true);
    });
    std::printf("ok  %d members: allgather (uneven, zero, in place), broadcast (every root, 0..3 MiB), "
                "alltoall (uneven, zero), reducescatter (10 dtypes x 4 ops, uneven, zero)\n", size);
  }
  CheckProcessSet();
  CheckPeerLost();
  CheckArgumentErrors();
  std::printf("all collective checks passed (%ld value checks)\n", g_checks.load());
  return 0;
}
