// sources: common/sha256.cc common/hmac.cc common/logging.cc transport/tcp/*.cc transport/shm/*.cc common/cpu_cache.cc
//
// Tests of the shared-memory data plane (ShmTransport over TcpTransport): ranks are threads (or a
// forked child) on 127.0.0.1, so every pair is on one host unless a test overrides host names.
// Checks: the default ring size, Send/Recv of 0, 1, odd sizes and 64 MB with pattern checks over
// default and tiny rings (wrap-around), ring SendRecv on 2-4 ranks at once, a mesh mixing shared-memory and TCP pairs
// (host names overridden) including SendRecv with one direction of each kind, shared memory
// disabled on one rank, fallback to TCP when a segment cannot be created, no segment left in
// /dev/shm, a peer that Close()s, Close() from another thread, data timeouts, forked children
// that are SIGKILLed or exit mid-transfer or during link setup (their segment unlinked), and the
// control plane (in order, larger than its ring, both ways at once, Wake, a closed worker), and
// SendRecvReduce (reducing straight from the ring:
// element sizes 1-8, skewed streams, exact sums; after odd-length messages still straight from
// the ring, each message starting at a 64-byte boundary; Unsupported with nothing moved for a TCP
// peer; PeerLost when the sender is SIGKILLed). Prints
// one line per check and exits 1 on the first failure. Timings are printed, never asserted.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/cpu_cache.h"
#include "common/logging.h"
#include "transport/shm/segment.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"
#include "transport_checks.h"

using namespace horo;
using namespace horo_test;  // transport_checks.h
using Clock = std::chrono::steady_clock;

namespace {

const std::string kSecret = "per-job secret for the shared-memory transport test";
constexpr size_t kLarge = size_t{64} << 20;

// Per-rank knobs of a mesh.
struct RankSetup {
  TcpOptions tcp;
  ShmOptions shm;
};

RankSetup Setup(int rank, int size) {
  RankSetup setup;
  setup.tcp.rank = rank;
  setup.tcp.size = size;
  setup.tcp.secret = kSecret;
  setup.tcp.connect_timeout_seconds = 20;
  setup.tcp.data_timeout_seconds = 20;
  return setup;
}

using Mesh = std::vector<std::unique_ptr<ShmTransport>>;

Mesh BuildMesh(int n, const std::function<void(RankSetup*)>& adjust = nullptr) {
  Mesh mesh(n);
  std::vector<std::string> addresses(n);
  for (int rank = 0; rank < n; ++rank) {
    RankSetup setup = Setup(rank, n);
    if (adjust) adjust(&setup);
    std::unique_ptr<TcpTransport> tcp;
    ExpectOk(TcpTransport::Listen(setup.tcp, &tcp), "Listen rank " + std::to_string(rank));
    mesh[rank] = std::make_unique<ShmTransport>(std::move(tcp), setup.shm);
    addresses[rank] = mesh[rank]->address();
  }
  RunRanks(n, [&](int rank) { ExpectOk(mesh[rank]->Connect(addresses), "Connect rank " + std::to_string(rank)); });
  return mesh;
}

// Names of this process's segments still in /dev/shm.
std::vector<std::string> LeftoverSegments() {
  std::vector<std::string> names;
  const std::string prefix = "horo-" + std::to_string(::getpid()) + "-";
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* entry = ::readdir(dir)) {
      if (std::strncmp(entry->d_name, prefix.c_str(), prefix.size()) == 0) names.push_back(entry->d_name);
    }
    ::closedir(dir);
  }
  return names;
}

// Every rank reports the same host map: host_ids[r] is the lowest rank on rank r's host.
void ExpectHostIds(const Mesh& mesh, const std::vector<int>& expected, const std::string& tag) {
  for (size_t rank = 0; rank < mesh.size(); ++rank) {
    const std::vector<int> got = mesh[rank]->HostIds();
    std::string text;
    for (int id : got) text += " " + std::to_string(id);
    Check(got == expected, tag + "rank " + std::to_string(rank) + " reports host ids" + text);
  }
}

void ExpectLinks(const Mesh& mesh, const std::function<bool(int, int)>& expected, const std::string& tag) {
  const int n = static_cast<int>(mesh.size());
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      Check(mesh[a]->SharedMemoryPeer(b) == expected(a, b),
            tag + "rank " + std::to_string(a) + " -> rank " + std::to_string(b) + ": shared memory is " +
                (mesh[a]->SharedMemoryPeer(b) ? "on" : "off") + ", expected the opposite");
    }
  }
}

// Every ordered pair in one global order, each size; then a ring SendRecv of every size at once.
void ExerciseMesh(Mesh& mesh, const std::vector<size_t>& sizes, const std::string& tag) {
  const int n = static_cast<int>(mesh.size());
  RunRanks(n, [&](int rank) {
    ShmTransport* t = mesh[rank].get();
    std::vector<uint8_t> buffer;
    for (size_t size : sizes) {
      ExchangeEveryPair(t, rank, n, size, &buffer, tag);
    }
    const int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    std::vector<uint8_t> out, in;
    for (size_t size : sizes) {
      FillPattern(&out, size, rank, next);
      in.assign(size + 1, 0);
      ExpectOk(t->SendRecv(next, out.data(), size, prev, in.data(), size), tag + "ring SendRecv");
      CheckPattern(in, size, prev, rank, tag + "ring SendRecv");
    }
  });
}

const std::vector<size_t> kSizes = {0, 1, 7, 1000, 65537, 1000003, kLarge};

// Unset ring sizes: the core cache shared out among the same-host peers, a power of two from
// 512 KiB to 4 MiB, and 512 KiB when the cache is unknown.
void TestDefaultRingBytes() {
  constexpr uint64_t K = 1024;
  const struct {
    size_t peers;
    int64_t cache;
    uint64_t expected;
  } cases[] = {{1, 0, 512 * K},        {1, 512 * K, 512 * K}, {1, 1024 * K, 1024 * K}, {1, 1536 * K, 1024 * K},
               {1, 2048 * K, 2048 * K}, {1, 32768 * K, 4096 * K}, {2, 1024 * K, 512 * K}, {3, 1024 * K, 512 * K},
               {3, 2048 * K, 512 * K},  {2, 4096 * K, 2048 * K}, {0, 1024 * K, 512 * K}, {7, 256 * K, 512 * K}};
  for (const auto& c : cases) {
    const uint64_t got = DefaultRingBytes(c.peers, c.cache);
    Check(got == c.expected, "DefaultRingBytes(" + std::to_string(c.peers) + " peers, cache " +
                                 std::to_string(c.cache) + ") = " + std::to_string(got) + ", expected " +
                                 std::to_string(c.expected));
  }
  Pass("ring size by default: the core cache shared out among the peers, a power of two from 512 KiB to 4 MiB");
}

void TestAllLocal(int n, uint64_t ring_bytes) {
  const std::string tag =
      "[n=" + std::to_string(n) + " ring=" + (ring_bytes ? std::to_string(ring_bytes >> 10) + "K" : "default") + "] ";
  Mesh mesh = BuildMesh(n, [&](RankSetup* s) { s->shm.ring_bytes = ring_bytes; });
  const uint64_t expected = ring_bytes ? ring_bytes : DefaultRingBytes(static_cast<size_t>(n - 1), CoreCacheBytes());
  for (int r = 0; r < n; ++r) {
    const uint64_t got = mesh[r]->InboundRingBytes();
    Check(got == expected, tag + "rank " + std::to_string(r) + " has rings of " + std::to_string(got) +
                               " bytes, expected " + std::to_string(expected));
  }
  ExpectLinks(mesh, [](int, int) { return true; }, tag);
  ExpectHostIds(mesh, std::vector<int>(n, 0), tag);
  Check(LeftoverSegments().empty(), tag + "segments left in /dev/shm after Connect");
  ExerciseMesh(mesh, kSizes, tag);
  Pass(tag + "all pairs in shared memory; Send/Recv and ring SendRecv of 0, 1, 7, 1000, 65537, 1000003 bytes and "
             "64 MB, patterns intact; nothing left in /dev/shm");
}

void TestMixedHosts() {
  // Ranks 0 and 1 on "host-a", 2 and 3 on "host-b": the ring 0->1->2->3->0 alternates shared
  // memory and TCP, so every SendRecv has one direction of each kind.
  const int n = 4;
  Mesh mesh = BuildMesh(n, [](RankSetup* s) { s->shm.host = s->tcp.rank < 2 ? "host-a" : "host-b"; });
  ExpectLinks(mesh, [](int a, int b) { return (a < 2) == (b < 2); }, "[mixed] ");
  ExpectHostIds(mesh, {0, 0, 2, 2}, "[mixed] ");
  ExerciseMesh(mesh, kSizes, "[mixed] ");
  Pass("[mixed] host names override same-host detection: {0,1} and {2,3} in shared memory (and in the host map), "
       "other pairs TCP; "
       "Send/Recv and mixed SendRecv correct up to 64 MB");
}

void TestFallbacks() {
  Mesh disabled = BuildMesh(3, [](RankSetup* s) { s->shm.enabled = s->tcp.rank != 1; });
  ExpectLinks(disabled, [](int a, int b) { return a != 1 && b != 1; }, "[rank 1 disabled] ");
  ExpectHostIds(disabled, {0, 0, 0}, "[rank 1 disabled] ");  // still one host, shared memory or not
  ExerciseMesh(disabled, {0, 1, 1000, 1000003}, "[rank 1 disabled] ");
  Pass("shared memory disabled on one rank: its pairs use TCP, the others shared memory, all correct");

  // 1 TiB cannot be reserved in /dev/shm: rank 1 offers no segment, so both of its pairs use TCP
  // although rank 1 mapped the others' segments.
  Mesh failing = BuildMesh(3, [](RankSetup* s) {
    if (s->tcp.rank == 1) s->shm.ring_bytes = uint64_t{1} << 40;
  });
  ExpectLinks(failing, [](int a, int b) { return a != 1 && b != 1; }, "[no segment] ");
  Check(LeftoverSegments().empty(), "segments left in /dev/shm after a failed creation");
  ExerciseMesh(failing, {0, 1, 1000, 1000003}, "[no segment] ");
  Pass("a rank whose segment cannot be created falls back to TCP with its peers, nothing left in /dev/shm");
}

void TestPeerClose() {
  Mesh mesh = BuildMesh(3);
  std::vector<uint8_t> buffer(kLarge, 1);
  // Rank 0 is already blocked when rank 2 closes: the closed flag and doorbell wake it at once.
  Status blocked;
  std::thread receiver([&] { blocked = mesh[0]->Recv(2, buffer.data(), 100); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it reach its doorbell (not required)
  auto start = Clock::now();
  mesh[2]->Close();
  receiver.join();
  double seconds = SecondsSince(start);
  ExpectCode(blocked, HORO_ERR_PEER_LOST, "blocked Recv from a peer that closes",
             {"rank 0", "rank 2", "lost during recv", "closed its transport"});
  ExpectCode(mesh[1]->Send(2, buffer.data(), buffer.size()), HORO_ERR_PEER_LOST, "64 MB Send to a closed peer",
             {"rank 1", "rank 2", "lost during send"});
  // The link is broken now: later calls in either direction fail the same way.
  ExpectCode(mesh[1]->Recv(2, buffer.data(), 1), HORO_ERR_PEER_LOST, "rank 1 Recv from a closed peer",
             {"rank 2", "lost during send"});
  ExpectCode(mesh[0]->Recv(2, buffer.data(), 1), HORO_ERR_PEER_LOST, "Recv again from a lost peer", {"rank 2"});
  // The pair 0-1 is unaffected.
  RunRanks(2, [&](int rank) {
    std::vector<uint8_t> data;
    FillPattern(&data, 1000, rank, 1 - rank);
    std::vector<uint8_t> in(1000);
    ExpectOk(mesh[rank]->SendRecv(1 - rank, data.data(), 1000, 1 - rank, in.data(), 1000), "0-1 after 2 closed");
    CheckPattern(in, 1000, 1 - rank, rank, "0-1 after 2 closed");
  });
  std::printf("time blocked Recv saw the peer's Close() after %.3f ms\n", seconds * 1e3);
  Pass("a peer that Close()s: PeerLost on Recv and Send naming it, other pairs unaffected");

  // Close() from another thread ends this rank's own blocked Send and Recv with ShutDown.
  Mesh pair = BuildMesh(2);
  Status send_status, recv_status;
  std::thread sender([&] { send_status = pair[1]->Send(0, buffer.data(), buffer.size()); });
  std::vector<uint8_t> head(10);  // not buffer, which the sender reads meanwhile (a race ThreadSanitizer reports)
  std::thread waiter([&] { recv_status = pair[0]->Recv(1, head.data(), head.size()); });
  waiter.join();  // rank 1's first bytes arrive
  pair[1]->Close();
  sender.join();
  ExpectOk(recv_status, "Recv of the first 10 bytes");
  ExpectCode(send_status, HORO_ERR_SHUT_DOWN, "blocked Send interrupted by its own Close", {"rank 1"});
  ExpectCode(pair[1]->Send(0, buffer.data(), 1), HORO_ERR_SHUT_DOWN, "Send after Close");
  Pass("Close() from another thread makes a blocked Send return ShutDown");
}

void TestDataTimeout() {
  Mesh mesh = BuildMesh(2, [](RankSetup* s) { s->tcp.data_timeout_seconds = 0.3; });
  uint8_t small[1000];
  auto start = Clock::now();
  ExpectCode(mesh[0]->Recv(1, small, sizeof(small)), HORO_ERR_TIMEOUT, "Recv from a silent peer",
             {"rank 0", "recv from rank 1", "0.3 s", "0 of 1000 bytes received"});
  double recv_seconds = SecondsSince(start);
  ExpectCode(mesh[0]->Recv(1, small, 1), HORO_ERR_TIMEOUT, "Recv after a timeout (stream out of step)");
  std::vector<uint8_t> big(kLarge, 5);
  start = Clock::now();
  ExpectCode(mesh[1]->Send(0, big.data(), big.size()), HORO_ERR_TIMEOUT, "Send to a peer that never reads",
             {"rank 1", "send to rank 0", "bytes sent"});
  double send_seconds = SecondsSince(start);
  std::printf("time data timeout 0.3 s: recv returned after %.3f s, send after %.3f s\n", recv_seconds, send_seconds);
  Pass("no progress for data_timeout_seconds: Timeout on Recv and Send naming the peer; the link stays broken");
}

// Forked children that die mid-transfer. Run first, while the program has a single thread.
// Element i of a SendRecvReduce test: unsigned of element_size bytes, so sums wrap exactly.
uint64_t TestValue(uint64_t i, int rank, int salt) { return i * 2654435761u + rank * 97 + salt; }

void AddUnsigned(void* dst, const void* src, size_t count, const void* context) {
  const size_t size = *static_cast<const size_t*>(context);
  for (size_t i = 0; i < count; ++i) {
    uint64_t a = 0, b = 0;
    std::memcpy(&a, static_cast<char*>(dst) + i * size, size);
    std::memcpy(&b, static_cast<const char*>(src) + i * size, size);
    a += b;
    std::memcpy(static_cast<char*>(dst) + i * size, &a, size);
  }
}

// Rank 1 of 2 in a forked child: child_main runs there with its listening TcpTransport, rank 0's
// address and the write end of a pipe to the parent, and must end the process. The parent keeps
// rank 0's listening transport and reads the child's messages (ReadFromChild).
struct ForkedRank {
  std::unique_ptr<TcpTransport> parent_tcp;
  std::string parent_address;
  pid_t child = -1;
  int from_child = -1;
};

constexpr size_t kChildMessageBytes = 128;

ForkedRank ForkRankOne(const std::function<void(std::unique_ptr<TcpTransport>, const std::string&, int)>& child_main) {
  ForkedRank forked;
  ExpectOk(TcpTransport::Listen(Setup(0, 2).tcp, &forked.parent_tcp), "parent Listen");
  forked.parent_address = forked.parent_tcp->address();
  int pipe_fds[2];
  Check(::pipe(pipe_fds) == 0, "pipe");
  std::fflush(stdout);
  forked.child = ::fork();
  Check(forked.child >= 0, "fork");
  if (forked.child == 0) {
    ::close(pipe_fds[0]);
    std::unique_ptr<TcpTransport> tcp;
    if (!TcpTransport::Listen(Setup(1, 2).tcp, &tcp).ok()) ::_exit(3);
    child_main(std::move(tcp), forked.parent_address, pipe_fds[1]);
    ::_exit(6);
  }
  ::close(pipe_fds[1]);
  forked.from_child = pipe_fds[0];
  return forked;
}

// In the child: sends text (at most kChildMessageBytes - 1 bytes) to the parent, or exits.
void TellParent(int to_parent, const std::string& text) {
  char message[kChildMessageBytes] = {};
  std::snprintf(message, sizeof(message), "%s", text.c_str());
  if (::write(to_parent, message, sizeof(message)) != sizeof(message)) ::_exit(4);
}

std::string ReadFromChild(const ForkedRank& forked, const char* what) {
  char message[kChildMessageBytes] = {};
  size_t have = 0;
  while (have < sizeof(message)) {
    ssize_t n = ::read(forked.from_child, message + have, sizeof(message) - have);
    Check(n > 0, std::string("child's ") + what + " (child exited early?)");
    have += static_cast<size_t>(n);
  }
  return std::string(message);
}

// kSigkillWhileParentReduces: the child dies as in kSigkillWhileSending while the parent receives
// with SendRecvReduce (reducing straight from the ring).
enum class ChildDeath { kSigkillWhileSending, kExitWhileReceiving, kSigkillWhileParentReduces };

void TestForkedPeerDies(ChildDeath how) {
  const bool child_sends = how != ChildDeath::kExitWhileReceiving;
  const char* name = how == ChildDeath::kSigkillWhileSending         ? "child SIGKILLed while sending"
                     : how == ChildDeath::kSigkillWhileParentReduces ? "child SIGKILLed while the parent reduces"
                                                                     : "child _exit()s while receiving";
  ForkedRank forked = ForkRankOne([&](std::unique_ptr<TcpTransport> tcp, const std::string& parent_address,
                                      int to_parent) {
    ShmTransport t(std::move(tcp), ShmOptions());
    TellParent(to_parent, t.address());
    if (!t.Connect({parent_address, t.address()}).ok() || !t.SharedMemoryPeer(0)) ::_exit(5);
    std::vector<uint8_t> data(8 << 20, 9);
    if (child_sends) {
      t.Send(0, data.data(), data.size());  // 8 MB of the 64 MB the parent expects
      ::raise(SIGKILL);
    } else {
      t.Recv(0, data.data(), data.size());  // 8 MB of the 256 MB the parent sends
      ::_exit(0);
    }
  });
  const pid_t child = forked.child;
  ShmTransport parent(std::move(forked.parent_tcp), ShmOptions());
  const std::string address = ReadFromChild(forked, "address");
  ::close(forked.from_child);
  ExpectOk(parent.Connect({forked.parent_address, address}), "parent Connect to child");
  Check(parent.SharedMemoryPeer(1), "parent and child should share memory");
  auto start = Clock::now();
  if (how == ChildDeath::kSigkillWhileSending) {
    std::vector<uint8_t> buffer(kLarge);
    ExpectCode(parent.Recv(1, buffer.data(), buffer.size()), HORO_ERR_PEER_LOST, name,
               {"rank 0", "rank 1", "lost during recv", "exited"});
  } else if (how == ChildDeath::kSigkillWhileParentReduces) {
    std::vector<uint8_t> buffer(kLarge);
    size_t one = 1;
    ReceiveReducer reducer;
    reducer.reduce = AddUnsigned;
    reducer.context = &one;
    ExpectCode(parent.SendRecvReduce(-1, nullptr, 0, 1, buffer.data(), buffer.size(), reducer), HORO_ERR_PEER_LOST,
               name, {"rank 0", "rank 1", "lost during recv", "exited"});
  } else {
    std::vector<uint8_t> buffer(size_t{256} << 20, 1);
    ExpectCode(parent.Send(1, buffer.data(), buffer.size()), HORO_ERR_PEER_LOST, name,
               {"rank 0", "rank 1", "lost during send"});
  }
  double seconds = SecondsSince(start);
  std::vector<int> lost;
  std::vector<ControlMessage> messages;
  while (lost.empty()) ExpectOk(parent.PollControl(5000, &messages, &lost), "parent PollControl");
  Check(lost == std::vector<int>{1}, std::string(name) + ": lost_peers should be {1}");
  int wstatus = 0;
  Check(::waitpid(child, &wstatus, 0) == child, "waitpid");
  if (child_sends) {
    Check(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL, "child did not die of SIGKILL");
  } else {
    Check(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "child exit status " + std::to_string(wstatus));
  }
  std::printf("time %s: PeerLost after %.3f s\n", name, seconds);
  Pass(std::string("forked ") + name + ": parent gets PeerLost naming rank 1, no hang");
}

// A peer SIGKILLed while the links are set up, after it offered its segment (round 2 of
// link_builder.h) and before round 3 ended, cannot unlink the segment's name: the parent, which
// mapped it and then loses the peer, unlinks it for it. The child speaks rounds 1 and 2 over a
// plain TcpTransport: it echoes the parent's hello (same host, shared memory enabled) and offers
// a real segment in the wire layout of link_builder.cc.
void TestPeerDiesDuringLinkSetup() {
  ForkedRank forked = ForkRankOne([](std::unique_ptr<TcpTransport> tcp, const std::string& parent_address,
                                     int to_parent) {
    TellParent(to_parent, tcp->address());
    if (!tcp->Connect({parent_address, tcp->address()}).ok()) ::_exit(5);
    char hello[48];  // magic, enabled, reserved, host digest
    if (!tcp->Recv(0, hello, sizeof(hello)).ok() || !tcp->Send(0, hello, sizeof(hello)).ok()) ::_exit(7);
    std::unique_ptr<shm::Segment> segment;
    if (!shm::Segment::Create(1, shm::Segment::kMinRingBytes, &segment).ok()) ::_exit(8);
    struct {
      uint32_t ok = 1, slot = 0;
      uint64_t ring_bytes, token;
      char name[64] = {};
    } offer;
    offer.ring_bytes = segment->ring_bytes();
    offer.token = segment->token();
    std::snprintf(offer.name, sizeof(offer.name), "%s", segment->name().c_str());
    static_assert(sizeof(offer) == 88, "link_builder.cc's Offer");
    if (!tcp->Send(0, &offer, sizeof(offer)).ok() || !tcp->Recv(0, &offer, sizeof(offer)).ok()) ::_exit(9);
    TellParent(to_parent, segment->name());
    ::raise(SIGKILL);  // no destructor runs: the name stays linked
  });
  const std::string child_address = ReadFromChild(forked, "address");
  ShmTransport parent(std::move(forked.parent_tcp), ShmOptions());
  ExpectCode(parent.Connect({forked.parent_address, child_address}), HORO_ERR_PEER_LOST,
             "parent Connect while the child dies in link setup", {"rank 1"});
  const std::string name = ReadFromChild(forked, "segment name");
  ::close(forked.from_child);
  int wstatus = 0;
  Check(::waitpid(forked.child, &wstatus, 0) == forked.child, "waitpid");
  Check(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL, "child did not die of SIGKILL");
  Check(::access(("/dev/shm" + name).c_str(), F_OK) != 0, "the dead child's segment " + name + " is left in /dev/shm");
  Pass("a peer SIGKILLed during link setup: Connect fails naming it, and its segment is unlinked");
}

// Receives control messages until want arrive (or fails after a deadline), in arrival order.
std::vector<ControlMessage> ReceiveControl(ShmTransport* t, size_t want, const std::string& what) {
  std::vector<ControlMessage> got;
  std::vector<int> lost;
  auto start = Clock::now();
  while (got.size() < want) {
    ExpectOk(t->PollControl(100, &got, &lost), what + ": PollControl");
    Check(lost.empty(), what + ": a peer was reported lost");
    Check(SecondsSince(start) < 20, what + ": only " + std::to_string(got.size()) + " of " + std::to_string(want) +
                                        " control messages arrived");
  }
  Check(got.size() == want, what + ": more control messages than sent");
  return got;
}

std::string ControlPayload(size_t size, int src, int index) {
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>(PatternByte(i, src, index, size));
  return payload;
}

// Control messages between rank 0 and the workers: through the control rings for same-host pairs
// (TCP for the others), in order, of every size up to several times the ring; both ends sending
// large messages to each other at once (each must drain the other while it waits); Wake(); and a
// worker that closes is reported lost.
void TestControlPlane(bool mixed) {
  const int n = 3;
  const std::string tag = mixed ? "[control, rank 2 on another host] " : "[control, one host] ";
  Mesh mesh = BuildMesh(n, [&](RankSetup* s) {
    if (mixed) s->shm.host = s->tcp.rank == 2 ? "host-b" : "host-a";
  });
  const size_t ring = shm::Segment::kControlRingBytes;
  const std::vector<size_t> sizes = {0, 1, 1000, ring - 8, ring + 12345, size_t{3} << 20};
  RunRanks(n, [&](int rank) {
    ShmTransport* t = mesh[rank].get();
    if (rank == 0) {
      // Send to every worker while receiving theirs: the big messages exceed the rings both ways.
      for (int peer = 1; peer < n; ++peer) {
        for (size_t i = 0; i < sizes.size(); ++i) {
          ExpectOk(t->SendControl(peer, ControlPayload(sizes[i], 0, static_cast<int>(i))), tag + "rank 0 SendControl");
        }
      }
      std::vector<ControlMessage> got = ReceiveControl(t, sizes.size() * (n - 1), tag + "rank 0");
      std::vector<size_t> next(n, 0);
      for (const ControlMessage& m : got) {
        Check(m.peer > 0 && m.peer < n, tag + "message from an unexpected peer");
        const size_t i = next[m.peer]++;
        Check(m.payload == ControlPayload(sizes[i], m.peer, static_cast<int>(i)),
              tag + "message " + std::to_string(i) + " from rank " + std::to_string(m.peer) + " out of order or corrupt");
      }
    } else {
      // Over TCP, two ends that both send more than the socket buffers hold would wait for each
      // other (TCP's SendControl does not read meanwhile): that pair receives first.
      const bool tcp_pair = !t->SharedMemoryPeer(0);
      std::vector<ControlMessage> got;
      if (tcp_pair) got = ReceiveControl(t, sizes.size(), tag + "rank " + std::to_string(rank));
      for (size_t i = 0; i < sizes.size(); ++i) {
        ExpectOk(t->SendControl(0, ControlPayload(sizes[i], rank, static_cast<int>(i))), tag + "worker SendControl");
      }
      if (!tcp_pair) got = ReceiveControl(t, sizes.size(), tag + "rank " + std::to_string(rank));
      for (size_t i = 0; i < got.size(); ++i) {
        Check(got[i].peer == 0 && got[i].payload == ControlPayload(sizes[i], 0, static_cast<int>(i)),
              tag + "message " + std::to_string(i) + " to rank " + std::to_string(rank) + " out of order or corrupt");
      }
    }
  });
  Check(mesh[1]->SharedMemoryPeer(0) && mesh[0]->SharedMemoryPeer(1), tag + "rank 0 and 1 should share memory");
  Pass(tag + "control messages of 0 B to 3 MB in order, both directions at once");

  // Wake() ends a PollControl that would otherwise wait for a second.
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    mesh[1]->Wake();
  });
  std::vector<ControlMessage> none;
  std::vector<int> lost;
  auto start = Clock::now();
  ExpectOk(mesh[1]->PollControl(10000, &none, &lost), tag + "PollControl with Wake");
  const double waited = SecondsSince(start);
  waker.join();
  Check(none.empty() && waited < 9, tag + "Wake() did not end PollControl early");
  Pass(tag + "Wake() ends PollControl after " + std::to_string(static_cast<int>(waited * 1000)) + " ms");

  // A worker that closes: rank 0 reports it lost (through its idle TCP control connection).
  mesh[1]->Close();
  start = Clock::now();
  while (lost.empty() && SecondsSince(start) < 10) ExpectOk(mesh[0]->PollControl(100, &none, &lost), tag + "poll");
  Check(lost.size() == 1 && lost[0] == 1, tag + "rank 0 did not report rank 1 lost");
  Pass(tag + "a closed worker is reported lost");
}

// A one-rank job has no control peer at all: Wake() must still end a PollControl at once.
void TestSingleRankWake() {
  Mesh mesh = BuildMesh(1);
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    mesh[0]->Wake();
  });
  std::vector<ControlMessage> none;
  std::vector<int> lost;
  auto start = Clock::now();
  ExpectOk(mesh[0]->PollControl(10000, &none, &lost), "[one rank] PollControl with Wake");
  const double waited = SecondsSince(start);
  waker.join();
  Check(none.empty() && lost.empty() && waited < 9, "[one rank] Wake() did not end PollControl early");
  Pass("[one rank] Wake() ends PollControl");
}

// One-way and ring bandwidth of 64 MB, shared memory against TCP on the same ranks (printed only).
// Both ranks send count elements to each other and reduce what they receive into their own
// buffer. skew bytes sent first shift the ring's stream so that elements straddle the ring's end
// and the pieces published by the writer.
void ExerciseReceiveReduce(Mesh& mesh, size_t element_size, size_t count, size_t skew, const std::string& tag) {
  RunRanks(2, [&](int rank) {
    ShmTransport* t = mesh[rank].get();
    const int peer = 1 - rank;
    std::vector<uint8_t> skew_out(skew, 1), skew_in(skew);
    ExpectOk(t->SendRecv(peer, skew_out.data(), skew, peer, skew_in.data(), skew), tag + "skew");
    const size_t bytes = count * element_size;
    std::vector<uint64_t> out_words(count + 1), mine_words(count + 1);
    char* out = reinterpret_cast<char*>(out_words.data());
    char* mine = reinterpret_cast<char*>(mine_words.data());
    for (size_t i = 0; i < count; ++i) {
      const uint64_t sent = TestValue(i, rank, 1), own = TestValue(i, rank, 2);
      std::memcpy(out + i * element_size, &sent, element_size);
      std::memcpy(mine + i * element_size, &own, element_size);
    }
    std::memset(mine + bytes, 0xAB, element_size);  // must stay untouched
    ReceiveReducer reducer;
    reducer.element_size = element_size;
    reducer.reduce = AddUnsigned;
    reducer.context = &element_size;
    ExpectOk(t->SendRecvReduce(peer, out, bytes, peer, mine, bytes, reducer), tag + "SendRecvReduce");
    const uint64_t mask = element_size == 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * element_size)) - 1;
    for (size_t i = 0; i < count; ++i) {
      uint64_t got = 0;
      std::memcpy(&got, mine + i * element_size, element_size);
      const uint64_t expected = (TestValue(i, rank, 2) + TestValue(i, peer, 1)) & mask;
      if (got != expected) {
        Check(false, tag + "element " + std::to_string(i) + " of rank " + std::to_string(rank) + " is " +
                         std::to_string(got) + ", expected " + std::to_string(expected));
      }
    }
    for (size_t b = 0; b < element_size; ++b) {
      Check(static_cast<uint8_t>(mine[bytes + b]) == 0xAB, tag + "byte after the message overwritten");
    }
  });
}

void TestReceiveReduce() {
  // 64 KiB rings: the larger counts wrap the ring many times.
  Mesh mesh = BuildMesh(2, [](RankSetup* s) { s->shm.ring_bytes = uint64_t{64} << 10; });
  for (size_t element_size : {1, 2, 4, 8}) {
    for (size_t count : {1, 7, 1000, 100003}) {
      for (size_t skew : {0, 3}) {
        ExerciseReceiveReduce(mesh, element_size, count, skew,
                              "[reduce " + std::to_string(element_size) + "B x " + std::to_string(count) + " skew " +
                                  std::to_string(skew) + "] ");
      }
    }
  }
  Pass("SendRecvReduce over shared memory: element sizes 1, 2, 4, 8 x 1, 7, 1000, 100003 elements, aligned and "
       "skewed streams through 64 KiB rings, exact sums, nothing written past the message");

  // A TCP pair cannot reduce on receive: Unsupported, and the streams are still in step.
  Mesh mixed = BuildMesh(2, [](RankSetup* s) { s->shm.host = s->tcp.rank == 0 ? "host-a" : "host-b"; });
  RunRanks(2, [&](int rank) {
    const int peer = 1 - rank;
    uint32_t out = 5, mine = 1;
    size_t four = 4;
    ReceiveReducer reducer;
    reducer.element_size = 4;
    reducer.reduce = AddUnsigned;
    reducer.context = &four;
    ExpectCode(mixed[rank]->SendRecvReduce(peer, &out, 4, peer, &mine, 4, reducer), HORO_ERR_UNSUPPORTED,
               "SendRecvReduce with a TCP peer", {"no shared memory with rank " + std::to_string(peer)});
    Check(mine == 1, "SendRecvReduce with a TCP peer changed the buffer");
    uint32_t in = 0;
    ExpectOk(mixed[rank]->SendRecv(peer, &out, 4, peer, &in, 4), "SendRecv after Unsupported");
    Check(in == 5, "SendRecv after Unsupported received " + std::to_string(in));
  });
  Pass("SendRecvReduce with a TCP peer: Unsupported naming the peer, nothing moved");
}

// Every message starts at a 64-byte boundary of the ring's stream, so a message of odd length
// (a byte tensor, a pickled object) does not leave every later float misaligned in the ring, where
// each reduction would first be copied through a staging buffer of 4 KiB. Reducing straight from
// the ring shows as calls of more elements than that buffer holds.
struct CountingAdd {
  size_t element_size = 4;
  std::atomic<size_t> largest_call{0};
};

void AddCounting(void* dst, const void* src, size_t count, const void* context) {
  auto* counting = const_cast<CountingAdd*>(static_cast<const CountingAdd*>(context));
  size_t seen = counting->largest_call.load();
  while (count > seen && !counting->largest_call.compare_exchange_weak(seen, count)) {
  }
  AddUnsigned(dst, src, count, &counting->element_size);
}

void TestAlignedAfterOddMessages() {
  Mesh mesh = BuildMesh(2, [](RankSetup* s) { s->shm.ring_bytes = uint64_t{1} << 20; });
  for (size_t odd : {1, 3, 63, 65, 4097}) {
    RunRanks(2, [&](int rank) {
      ShmTransport* t = mesh[rank].get();
      const int peer = 1 - rank;
      const std::string tag = "[reduce after a " + std::to_string(odd) + "-byte message] ";
      std::vector<uint8_t> odd_out(odd, static_cast<uint8_t>(rank + 1)), odd_in(odd);
      ExpectOk(t->SendRecv(peer, odd_out.data(), odd, peer, odd_in.data(), odd), tag + "odd message");
      Check(odd_in == std::vector<uint8_t>(odd, static_cast<uint8_t>(peer + 1)), tag + "odd message arrived wrong");
      const size_t count = 100000;
      std::vector<uint32_t> out(count), mine(count);
      for (size_t i = 0; i < count; ++i) {
        out[i] = static_cast<uint32_t>(TestValue(i, rank, 1));
        mine[i] = static_cast<uint32_t>(TestValue(i, rank, 2));
      }
      CountingAdd counting;
      ReceiveReducer reducer;
      reducer.element_size = 4;
      reducer.reduce = AddCounting;
      reducer.context = &counting;
      ExpectOk(t->SendRecvReduce(peer, out.data(), 4 * count, peer, mine.data(), 4 * count, reducer),
               tag + "SendRecvReduce");
      for (size_t i = 0; i < count; ++i) {
        const uint32_t expected = static_cast<uint32_t>(TestValue(i, rank, 2) + TestValue(i, peer, 1));
        if (mine[i] != expected) {
          Check(false, tag + "element " + std::to_string(i) + " is " + std::to_string(mine[i]) + ", expected " +
                           std::to_string(expected));
        }
      }
      Check(counting.largest_call.load() > 4096 / 4,
            tag + "reduced through the staging buffer only (largest call " +
                std::to_string(counting.largest_call.load()) + " elements): the stream was left misaligned");
      // Bytes sent after the padding still arrive in order.
      uint64_t word_out = 0x0123456789abcdefULL + rank, word_in = 0;
      ExpectOk(t->SendRecv(peer, &word_out, 8, peer, &word_in, 8), tag + "word after");
      Check(word_in == 0x0123456789abcdefULL + peer, tag + "word after the reduction arrived wrong");
    });
  }
  Pass("messages start at 64-byte boundaries of the stream: after odd-length messages (1, 3, 63, 65, 4097 "
       "bytes) floats reduce straight from the ring, exactly, and later bytes arrive in order");
}

// SendRecvUncached writes what arrives with non-temporal stores for every whole 64-byte line of the
// destination and plain copies for the ragged ends: destinations at several offsets within a line,
// lengths around a line and across ring pieces, and a skewed stream that wraps the ring's end in
// the middle of a line must all arrive exactly, with the bytes around the destination untouched.
void TestUncachedReceive() {
  Mesh mesh = BuildMesh(2, [](RankSetup* s) { s->shm.ring_bytes = uint64_t{64} << 10; });
  int cases = 0;
  for (size_t len : {size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{200}, size_t{70001}, size_t{300007}}) {
    for (size_t offset : {size_t{0}, size_t{1}, size_t{17}, size_t{63}}) {
      for (size_t skew : {size_t{0}, size_t{5}}) {
        const std::string tag = "[uncached " + std::to_string(len) + " B at +" + std::to_string(offset) + " skew " +
                                std::to_string(skew) + "] ";
        RunRanks(2, [&](int rank) {
          ShmTransport* t = mesh[rank].get();
          const int peer = 1 - rank;
          std::vector<uint8_t> skew_out(skew, 1), skew_in(skew);
          ExpectOk(t->SendRecv(peer, skew_out.data(), skew, peer, skew_in.data(), skew), tag + "skew");
          std::vector<uint8_t> out(len);
          for (size_t i = 0; i < len; ++i) out[i] = static_cast<uint8_t>(TestValue(i, rank, 3));
          // 64-byte aligned storage, so that offset sets the destination's place within a line.
          std::vector<uint64_t> words((offset + len + 2 * 64) / 8 + 1, 0xCDCDCDCDCDCDCDCDull);
          uint8_t* storage = reinterpret_cast<uint8_t*>(words.data());
          uint8_t* line = storage + ((64 - (reinterpret_cast<uintptr_t>(storage) & 63)) & 63);
          uint8_t* in = line + 64 + offset;
          ExpectOk(t->SendRecvUncached(peer, out.data(), len, peer, in, len), tag + "SendRecvUncached");
          for (size_t i = 0; i < len; ++i) {
            if (in[i] != static_cast<uint8_t>(TestValue(i, peer, 3))) {
              Check(false, tag + "byte " + std::to_string(i) + " of rank " + std::to_string(rank) + " is " +
                               std::to_string(in[i]));
              break;
            }
          }
          for (uint8_t* b = storage; b < in; ++b) Check(*b == 0xCD, tag + "a byte before the destination changed");
          for (uint8_t* b = in + len; b < storage + words.size() * 8; ++b) {
            Check(*b == 0xCD, tag + "a byte after the destination changed");
          }
        });
        ++cases;
      }
    }
  }
  // Over TCP the same call is a plain SendRecv.
  Mesh mixed = BuildMesh(2, [](RankSetup* s) { s->shm.host = s->tcp.rank == 0 ? "host-a" : "host-b"; });
  RunRanks(2, [&](int rank) {
    const int peer = 1 - rank;
    std::vector<uint8_t> out(100000, static_cast<uint8_t>(rank + 1)), in(100000);
    ExpectOk(mixed[rank]->SendRecvUncached(peer, out.data(), out.size(), peer, in.data(), in.size()),
             "SendRecvUncached with a TCP peer");
    Check(in == std::vector<uint8_t>(100000, static_cast<uint8_t>(peer + 1)), "SendRecvUncached over TCP: wrong bytes");
  });
  Pass("SendRecvUncached over shared memory: " + std::to_string(cases) + " cases of lengths 1 B-300 KB at offsets "
       "0, 1, 17 and 63 within a line, skewed streams through 64 KiB rings, exact bytes and nothing around them "
       "touched; a TCP peer gets a plain SendRecv");
}

void Measure() {
  for (bool enabled : {true, false}) {
    Mesh mesh = BuildMesh(2, [&](RankSetup* s) { s->shm.enabled = enabled; });
    double one_way = 0, ring = 0;
    RunRanks(2, [&](int rank) {
      std::vector<uint8_t> out(kLarge, 1), in(kLarge);
      for (int repeat = 0; repeat < 3; ++repeat) {
        auto start = Clock::now();
        if (rank == 0) ExpectOk(mesh[0]->Send(1, out.data(), kLarge), "measure Send");
        else ExpectOk(mesh[1]->Recv(0, in.data(), kLarge), "measure Recv");
        if (rank == 1) one_way = std::max(one_way, kLarge / SecondsSince(start) / 1e9);
        start = Clock::now();
        ExpectOk(mesh[rank]->SendRecv(1 - rank, out.data(), kLarge, 1 - rank, in.data(), kLarge), "measure ring");
        if (rank == 0) ring = std::max(ring, kLarge / SecondsSince(start) / 1e9);
      }
    });
    std::printf("time 64 MB over %s: one way %.2f GB/s, both ways at once %.2f GB/s per direction\n",
                enabled ? "shared memory" : "tcp", one_way, ring);
  }
}

}  // namespace

int main() {
  SetLogLevel(LogLevel::kError);
  auto start = Clock::now();
  TestForkedPeerDies(ChildDeath::kSigkillWhileSending);
  TestForkedPeerDies(ChildDeath::kExitWhileReceiving);
  TestForkedPeerDies(ChildDeath::kSigkillWhileParentReduces);
  TestPeerDiesDuringLinkSetup();
  TestDefaultRingBytes();
  for (int n : {2, 3, 4}) TestAllLocal(n, ShmOptions().ring_bytes);
  TestAllLocal(2, uint64_t{4} << 20);
  TestAllLocal(3, uint64_t{64} << 10);
  TestMixedHosts();
  TestReceiveReduce();
  TestAlignedAfterOddMessages();
  TestUncachedReceive();
  TestFallbacks();
  TestPeerClose();
  TestDataTimeout();
  TestControlPlane(false);
  TestControlPlane(true);
  TestSingleRankWake();
  Measure();
  Check(LeftoverSegments().empty(), "segments left in /dev/shm at the end");
  std::printf("all shared-memory transport checks passed in %.1f s\n", SecondsSince(start));
  return 0;
}
