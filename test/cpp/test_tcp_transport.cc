// sources: common/sha256.cc common/hmac.cc common/logging.cc transport/tcp/*.cc
//
// Tests of the authenticated TCP transport: SHA-256 / HMAC-SHA256 against FIPS 180-2 and RFC 4231
// vectors; meshes of 1, 2, 3 and 5 ranks as threads on 127.0.0.1 (data plane, ring SendRecv,
// control plane, Wake); wrong secret; strangers on the listening port; a peer that closes; data
// timeouts; and forked child ranks killed mid-transfer. Prints one line per check and exits 1 on the
// first failure. Timings are printed, never asserted.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <errno.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/hmac.h"
#include "common/logging.h"
#include "common/sha256.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket_address.h"
#include "transport/tcp/transport.h"
#include "tcp_mesh.h"
#include "transport_checks.h"

using namespace horo;
using namespace horo_test;  // transport_checks.h, tcp_mesh.h
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kLarge = size_t{64} << 20;

std::string Hex(const uint8_t* data, size_t len) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < len; ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Crypto primitives.

void TestCrypto() {
  struct ShaCase {
    std::string input;
    const char* digest;
  };
  const ShaCase sha_cases[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
      {std::string(1000000, 'a'), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
  };
  for (const ShaCase& c : sha_cases) {
    Sha256Digest digest = Sha256::Hash(c.input.data(), c.input.size());
    Check(Hex(digest.data(), digest.size()) == c.digest,
          "SHA-256 of a " + std::to_string(c.input.size()) + "-byte input: got " + Hex(digest.data(), 32));
    // The same input fed in uneven pieces must give the same digest.
    Sha256 pieces;
    size_t offset = 0, step = 1;
    while (offset < c.input.size()) {
      size_t take = std::min(step, c.input.size() - offset);
      pieces.Update(c.input.data() + offset, take);
      offset += take;
      step = step * 3 + 1;
    }
    Sha256Digest incremental = pieces.Final();
    Check(incremental == digest, "incremental SHA-256 differs for a " + std::to_string(c.input.size()) + "-byte input");
  }
  Pass("SHA-256 FIPS 180-2 vectors (one-shot and incremental)");

  struct HmacCase {
    std::string key, data;
    const char* mac;
  };
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4 += static_cast<char>(i);
  const HmacCase hmac_cases[] = {
      {std::string(20, '\x0b'), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {key4, std::string(50, '\xcd'), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {std::string(20, '\x0c'), "Test With Truncation", "a3b6167473100ee06e0c796c2955552b"},  // truncated to 128 bits
      {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The key needs to "
       "be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  int index = 1;
  for (const HmacCase& c : hmac_cases) {
    Sha256Digest mac = HmacSha256::Compute(c.key, c.data.data(), c.data.size());
    std::string expected = c.mac;
    Check(Hex(mac.data(), 32).substr(0, expected.size()) == expected,
          "HMAC-SHA256 RFC 4231 test case " + std::to_string(index) + ": got " + Hex(mac.data(), 32));
    ++index;
  }
  Pass("HMAC-SHA256 RFC 4231 test cases 1-7");

  uint8_t a[32], b[32];
  std::memset(a, 7, sizeof(a));
  std::memcpy(b, a, sizeof(b));
  Check(ConstantTimeEqual(a, b, 32), "ConstantTimeEqual of equal buffers");
  b[31] ^= 1;
  Check(!ConstantTimeEqual(a, b, 32), "ConstantTimeEqual of buffers differing in the last byte");
  b[31] ^= 1;
  b[0] ^= 0x80;
  Check(!ConstantTimeEqual(a, b, 32), "ConstantTimeEqual of buffers differing in the first byte");
  Check(ConstantTimeEqual(a, b, 0), "ConstantTimeEqual of empty buffers");
  Pass("ConstantTimeEqual");

  uint8_t r1[32] = {}, r2[32] = {};
  ExpectOk(SecureRandomBytes(r1, sizeof(r1)), "SecureRandomBytes");
  ExpectOk(SecureRandomBytes(r2, sizeof(r2)), "SecureRandomBytes");
  Check(std::memcmp(r1, r2, 32) != 0, "two 32-byte SecureRandomBytes draws are equal");
  Pass("SecureRandomBytes gives distinct draws");
}

// ---------------------------------------------------------------------------------------------
// Options and addresses.

void TestOptionsAndAddresses() {
  std::unique_ptr<TcpTransport> transport;
  TcpOptions options = Options(0, 2);
  options.secret.clear();
  ExpectCode(TcpTransport::Listen(options, &transport), HORO_ERR_INVALID_ARGUMENT, "empty secret",
             {"secret", "unauthenticated"});
  options = Options(2, 2);
  ExpectCode(TcpTransport::Listen(options, &transport), HORO_ERR_INVALID_ARGUMENT, "rank out of range");
  options = Options(0, 2);
  options.bind_host = "192.0.2.1";  // TEST-NET-1: not an address of this host
  ExpectCode(TcpTransport::Listen(options, &transport), HORO_ERR_INVALID_ARGUMENT, "bind to a foreign address",
             {"192.0.2.1"});
  ExpectOk(TcpTransport::Listen(Options(0, 2), &transport), "Listen");
  Check(transport->address().rfind("127.0.0.1:", 0) == 0, "address() is " + transport->address());
  ExpectCode(transport->Connect({transport->address()}), HORO_ERR_INVALID_ARGUMENT, "Connect with 1 address for 2 ranks");
  ExpectCode(transport->Send(1, "x", 1), HORO_ERR_INVALID_ARGUMENT, "Send before Connect");

  std::string host;
  int port = 0;
  ExpectOk(SocketAddress::SplitHostPort("[::1]:80", &host, &port), "split [::1]:80");
  Check(host == "::1" && port == 80, "split [::1]:80 gave " + host);
  ExpectCode(SocketAddress::SplitHostPort("localhost", &host, &port), HORO_ERR_INVALID_ARGUMENT, "no port");
  ExpectCode(SocketAddress::SplitHostPort("h:99999", &host, &port), HORO_ERR_INVALID_ARGUMENT, "port range");
  Pass("options validation (empty secret refused, bad rank, foreign bind_host) and address parsing");
}

// ---------------------------------------------------------------------------------------------
// A mesh of n ranks: data plane, ring, control plane, Wake, then Close.

void TestMesh(int n, bool measure) {
  const std::string tag = "[n=" + std::to_string(n) + "] ";
  Mesh mesh = BuildMesh(n);
  Pass(tag + "mesh connected");
  Barrier barrier(n);

  // Every ordered pair, in one global order, each size; only the pair's two ranks act.
  const size_t small_sizes[] = {0, 1, 1000};
  RunRanks(n, [&](int rank) {
    TcpTransport* t = mesh.ranks[rank].get();
    std::vector<uint8_t> buffer;
    for (size_t size : small_sizes) {
      ExchangeEveryPair(t, rank, n, size, &buffer, tag);
    }
    if (n >= 2 && (rank == 0 || rank == n - 1)) {  // 64 MB both ways between the first and last rank
      int other = n - 1 - rank;
      for (int src : {0, n - 1}) {
        if (rank == src) {
          FillPattern(&buffer, kLarge, src, other);
          ExpectOk(t->Send(other, buffer.data(), kLarge), tag + "Send 64 MB");
        } else {
          buffer.assign(kLarge, 0);
          ExpectOk(t->Recv(src, buffer.data(), kLarge), tag + "Recv 64 MB");
          CheckPattern(buffer, kLarge, src, rank, tag + "64 MB Send/Recv");
        }
      }
    }
  });
  if (n >= 2) Pass(tag + "Send/Recv of 0, 1, 1000 bytes between every pair, 64 MB between ranks 0 and " + std::to_string(n - 1));

  // Ring: every rank sends to rank+1 while receiving from rank-1, all at once (n == 2: the same
  // peer in both directions). 64 MB exceeds every socket buffer, so this deadlocks unless both
  // directions progress together.
  if (n >= 2) {
    RunRanks(n, [&](int rank) {
      TcpTransport* t = mesh.ranks[rank].get();
      int next = (rank + 1) % n, prev = (rank + n - 1) % n;
      std::vector<uint8_t> out, in;
      for (size_t size : {size_t{0}, size_t{1}, size_t{1000}, kLarge}) {
        FillPattern(&out, size, rank, next);
        in.assign(size + 1, 0);
        ExpectOk(t->SendRecv(next, out.data(), size, prev, in.data(), size), tag + "ring SendRecv");
        CheckPattern(in, size, prev, rank, tag + "ring SendRecv");
      }
      // One direction skipped with -1.
      barrier.Wait();
      FillPattern(&out, 1000, rank, next);
      in.assign(1000, 0);
      if (rank % 2 == 0) {
        ExpectOk(t->SendRecv(next, out.data(), 1000, -1, nullptr, 0), tag + "SendRecv send only");
      }
      if ((rank + n - 1) % n % 2 == 0) {
        ExpectOk(t->SendRecv(-1, nullptr, 0, prev, in.data(), 1000), tag + "SendRecv recv only");
        CheckPattern(in, 1000, prev, rank, tag + "SendRecv recv only");
      }
    });
    Pass(tag + "ring SendRecv of 0, 1, 1000 bytes and 64 MB on all ranks at once; one-sided SendRecv");
  }

  // Control plane: every rank sends rank 0 an empty, a small and a 1 MB message; rank 0 answers
  // each rank; invalid destinations are refused.
  RunRanks(n, [&](int rank) {
    TcpTransport* t = mesh.ranks[rank].get();
    const std::string big(1 << 20, static_cast<char>('a' + rank % 26));
    if (rank != 0) {
      ExpectOk(t->SendControl(0, ""), tag + "SendControl empty");
      ExpectOk(t->SendControl(0, "request from " + std::to_string(rank)), tag + "SendControl");
      ExpectOk(t->SendControl(0, big), tag + "SendControl 1 MB");
      if (n > 2) {
        ExpectCode(t->SendControl(n - 1 == rank ? 1 : n - 1, "x"), HORO_ERR_INVALID_ARGUMENT,
                   tag + "SendControl between non-zero ranks", {"only to rank 0"});
      }
      std::vector<ControlMessage> messages;
      std::vector<int> lost;
      while (messages.empty()) ExpectOk(t->PollControl(5000, &messages, &lost), tag + "PollControl on rank " + std::to_string(rank));
      Check(messages.size() == 1 && messages[0].peer == 0 && messages[0].payload == "reply to " + std::to_string(rank),
            tag + "rank " + std::to_string(rank) + " got the wrong control reply");
      Check(lost.empty(), tag + "unexpected lost peer");
    } else {
      ExpectCode(t->SendControl(0, "x"), HORO_ERR_INVALID_ARGUMENT, tag + "SendControl to self");
      ExpectCode(t->SendControl(n, "x"), HORO_ERR_INVALID_ARGUMENT, tag + "SendControl out of range");
      std::vector<std::vector<std::string>> received(n);
      size_t total = 0;
      while (total < 3 * static_cast<size_t>(n - 1)) {
        std::vector<ControlMessage> messages;
        std::vector<int> lost;
        ExpectOk(t->PollControl(5000, &messages, &lost), tag + "PollControl on rank 0");
        Check(lost.empty(), tag + "unexpected lost peer on rank 0");
        Check(!messages.empty(), tag + "rank 0 PollControl timed out waiting for requests");
        for (ControlMessage& m : messages) {
          Check(m.peer > 0 && m.peer < n, tag + "message from invalid peer");
          received[m.peer].push_back(std::move(m.payload));
          ++total;
        }
      }
      for (int peer = 1; peer < n; ++peer) {
        Check(received[peer].size() == 3 && received[peer][0].empty() &&
                  received[peer][1] == "request from " + std::to_string(peer) &&
                  received[peer][2] == std::string(1 << 20, static_cast<char>('a' + peer % 26)),
              tag + "control messages from rank " + std::to_string(peer) + " are wrong or out of order");
        ExpectOk(t->SendControl(peer, "reply to " + std::to_string(peer)), tag + "SendControl reply");
      }
    }
  });
  Pass(tag + "control frames both ways (empty, small, 1 MB, in order); invalid destinations refused");

  // Wake: a PollControl blocked without a time limit returns once another thread calls Wake();
  // a Wake() before the poll makes the next poll return at once; a timeout returns nothing.
  {
    TcpTransport* t = mesh.ranks[0].get();
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    ExpectOk(t->PollControl(30, &messages, &lost), tag + "PollControl with timeout");
    Check(messages.empty() && lost.empty(), tag + "PollControl timeout returned something");
    std::atomic<bool> returned{false};
    std::thread poller([&] {
      std::vector<ControlMessage> m;
      std::vector<int> l;
      ExpectOk(t->PollControl(-1, &m, &l), tag + "PollControl(-1) woken");
      returned = true;
    });
    t->Wake();
    poller.join();
    Check(returned, tag + "PollControl did not return after Wake");
    t->Wake();
    ExpectOk(t->PollControl(-1, &messages, &lost), tag + "PollControl after an earlier Wake");
    Check(messages.empty(), tag + "Wake produced messages");
  }
  Pass(tag + "Wake() interrupts PollControl(-1), early Wake() is kept, timeout returns empty");

  if (measure && n == 2) {
    // 4-byte round trips between ranks 0 and 1, and 64 MB one way.
    constexpr int kTrips = 5000;
    double round_trip_us = 0, gbps = 0;
    RunRanks(2, [&](int rank) {
      TcpTransport* t = mesh.ranks[rank].get();
      uint32_t word = 0;
      for (int warmup = 0; warmup < 2; ++warmup) {
        auto start = Clock::now();
        for (int i = 0; i < kTrips; ++i) {
          if (rank == 0) {
            word = i;
            ExpectOk(t->Send(1, &word, 4), "ping");
            ExpectOk(t->Recv(1, &word, 4), "pong");
            Check(word == static_cast<uint32_t>(i) + 1, "ping-pong value");
          } else {
            ExpectOk(t->Recv(0, &word, 4), "ping");
            ++word;
            ExpectOk(t->Send(0, &word, 4), "pong");
          }
        }
        if (rank == 0) round_trip_us = SecondsSince(start) * 1e6 / kTrips;
      }
      std::vector<uint8_t> buffer(kLarge, 1);
      constexpr int kReps = 8;
      auto start = Clock::now();
      for (int i = 0; i < kReps; ++i) {
        if (rank == 0) {
          ExpectOk(t->Send(1, buffer.data(), kLarge), "bandwidth send");
        } else {
          ExpectOk(t->Recv(0, buffer.data(), kLarge), "bandwidth recv");
        }
      }
      ExpectOk(rank == 0 ? t->Recv(1, &word, 1) : t->Send(0, &word, 1), "bandwidth ack");
      if (rank == 0) gbps = kReps * double(kLarge) / SecondsSince(start) / 1e9;
    });
    std::printf("time %s4-byte round trip: %.1f us; 64 MB one way: %.2f GB/s\n", tag.c_str(), round_trip_us, gbps);
  }

  for (auto& t : mesh.ranks) t->Close();
  uint8_t byte = 0;
  if (n >= 2) {
    ExpectCode(mesh.ranks[0]->Send(1, &byte, 1), HORO_ERR_SHUT_DOWN, tag + "Send after Close");
    ExpectCode(mesh.ranks[1]->Recv(0, &byte, 1), HORO_ERR_SHUT_DOWN, tag + "Recv after Close");
  }
  std::vector<ControlMessage> messages;
  std::vector<int> lost;
  ExpectCode(mesh.ranks[0]->PollControl(0, &messages, &lost), HORO_ERR_SHUT_DOWN, tag + "PollControl after Close");
  mesh.ranks[0]->Close();  // idempotent
  Pass(tag + "Close() is idempotent; calls afterwards return ShutDown");
}

// ---------------------------------------------------------------------------------------------
// Authentication failures and strangers.

void TestWrongSecret() {
  Mesh mesh;
  ListenAll(2, &mesh, [](TcpOptions* options) {
    if (options->rank == 1) options->secret = "not the job secret";
    if (options->rank == 0) options->connect_timeout_seconds = 1.5;
  });
  auto start = Clock::now();
  std::vector<double> seconds(2);
  std::vector<Status> results(2);
  RunRanks(2, [&](int rank) {
    results[rank] = mesh.ranks[rank]->Connect(mesh.addresses);
    seconds[rank] = SecondsSince(start);
  });
  ExpectCode(results[1], HORO_ERR_AUTH, "connector with a wrong secret",
             {"rank 1", "rank 0", "rejected", "wrong secret", "or it exited"});
  ExpectCode(results[0], HORO_ERR_AUTH, "acceptor facing a wrong secret",
             {"rank 0", "connection from 127.0.0.1:", "failed authentication: wrong secret?", "rank 1"});
  std::printf("time wrong secret: rank 1 failed after %.3f s, rank 0 after %.3f s (its connect timeout 1.5 s)\n",
              seconds[1], seconds[0]);
  std::printf("     rank 0: %s\n     rank 1: %s\n", results[0].message().c_str(), results[1].message().c_str());
  Pass("wrong secret: Status::Auth on both sides, nobody hangs");
}

int RawConnect(const std::string& address) {
  std::string host;
  int port = 0;
  ExpectOk(SocketAddress::SplitHostPort(address, &host, &port), "split address");
  std::vector<SocketAddress> resolved;
  ExpectOk(SocketAddress::Resolve(host, port, false, &resolved), "resolve");
  int fd = ::socket(resolved[0].family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  Check(fd >= 0, "socket()");
  Check(::connect(fd, resolved[0].get(), resolved[0].length()) == 0, "stranger connect to " + address);
  return fd;
}

bool ReadExactly(int fd, uint8_t* data, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::read(fd, data + done, len - done);  // sockets and pipes
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += n;
  }
  return true;
}

// Waits (bounded) for the far end to close fd; returns how many bytes arrived first.
long DrainUntilClosed(int fd, int timeout_ms) {
  long total = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (left <= 0) return -1;
    pollfd p = {fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) continue;
    char buffer[256];
    ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return total;
    total += n;
  }
}

void TestStrangers() {
  const int n = 3;
  Mesh mesh;
  ListenAll(n, &mesh);
  std::vector<int> garbage_senders, silent;
  for (int target : {0, 1}) {
    // Garbage, longer than any handshake message.
    int garbage = RawConnect(mesh.addresses[target]);
    std::string junk(300, 'G');
    Check(::send(garbage, junk.data(), junk.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(junk.size()), "send junk");
    garbage_senders.push_back(garbage);
    // Silent: connects and never speaks.
    silent.push_back(RawConnect(mesh.addresses[target]));
    // Connects and hangs up at once.
    ::close(RawConnect(mesh.addresses[target]));
  }
  // A replayed hello: well-formed, MAC made with the real secret, but over a stale nonce (as if
  // captured from an earlier handshake). It claims to be rank 2's data connection to rank 0. It
  // queues before the real peers; it gets its greeting once rank 0 starts Connect().
  int replay = RawConnect(mesh.addresses[0]);
  long replay_after_greeting = -2;
  std::thread replayer([&] {
    uint8_t greeting[Handshake::kGreetingSize];
    if (!ReadExactly(replay, greeting, sizeof(greeting)) || std::memcmp(greeting, "HOROTCP1", 8) != 0) return;
    uint8_t header[16] = {0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3};
    uint8_t stale_nonce[32] = {}, nonce_c[32] = {};
    HmacSha256 mac(kSecret);
    mac.Update("horo-tcp-v1/connector", std::strlen("horo-tcp-v1/connector"));
    mac.Update(stale_nonce, 32);
    mac.Update(header, 16);
    mac.Update(nonce_c, 32);
    Sha256Digest digest = mac.Final();
    uint8_t hello[Handshake::kHelloSize];
    std::memcpy(hello, header, 16);
    std::memcpy(hello + 16, nonce_c, 32);
    std::memcpy(hello + 48, digest.data(), 32);
    if (::send(replay, hello, sizeof(hello), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(hello))) return;
    replay_after_greeting = DrainUntilClosed(replay, 10000);
  });

  std::vector<Status> results = ConnectAll(&mesh);
  for (int rank = 0; rank < n; ++rank) ExpectOk(results[rank], "Connect with strangers around, rank " + std::to_string(rank));
  // The mesh works.
  RunRanks(n, [&](int rank) {
    uint32_t out = 100 + rank, in = 0;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    ExpectOk(mesh.ranks[rank]->SendRecv(next, &out, 4, prev, &in, 4), "SendRecv after strangers");
    Check(in == static_cast<uint32_t>(100 + prev), "SendRecv value after strangers");
  });
  // Every stranger was dropped: garbage senders right away (an RST may overtake the greeting, as
  // their junk was left unread), silent ones once the mesh was up (the greeting, then EOF).
  for (int fd : garbage_senders) {
    long got = DrainUntilClosed(fd, 5000);
    Check(got == 0 || got == static_cast<long>(Handshake::kGreetingSize),
          "a garbage sender saw " + std::to_string(got) + " bytes before being dropped");
    ::close(fd);
  }
  for (int fd : silent) {
    long got = DrainUntilClosed(fd, 5000);
    Check(got == static_cast<long>(Handshake::kGreetingSize),
          "a silent stranger saw " + std::to_string(got) + " bytes before being dropped (want the 40-byte greeting, then EOF)");
    ::close(fd);
  }
  // Nothing listens any more.
  std::string host;
  int port = 0;
  ExpectOk(SocketAddress::SplitHostPort(mesh.addresses[0], &host, &port), "split");
  std::vector<SocketAddress> resolved;
  ExpectOk(SocketAddress::Resolve(host, port, false, &resolved), "resolve");
  int late = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  Check(::connect(late, resolved[0].get(), resolved[0].length()) != 0, "the listening port still accepts after Connect");
  ::close(late);
  replayer.join();
  ::close(replay);
  Check(replay_after_greeting == 0, "a replayed hello was not dropped right after the greeting (" +
                                        std::to_string(replay_after_greeting) + ")");
  for (auto& t : mesh.ranks) t->Close();
  Pass("strangers (garbage, silent, hang-up, replayed hello) are dropped and the mesh still forms; listener closed");
}

// ---------------------------------------------------------------------------------------------
// Failures after the mesh is up.

void TestPeerClose() {
  const int n = 3;
  Mesh mesh = BuildMesh(n);
  mesh.ranks[2]->Close();
  uint8_t buffer[100];
  auto start = Clock::now();
  ExpectCode(mesh.ranks[0]->Recv(2, buffer, sizeof(buffer)), HORO_ERR_PEER_LOST, "Recv from a closed peer",
             {"rank 0", "rank 2", "lost during recv", "peer closed the connection"});
  ExpectCode(mesh.ranks[1]->Recv(2, buffer, sizeof(buffer)), HORO_ERR_PEER_LOST, "rank 1 Recv from a closed peer", {"rank 2"});
  ExpectCode(mesh.ranks[0]->Recv(2, buffer, 1), HORO_ERR_PEER_LOST, "Recv again from a lost peer", {"rank 2"});
  std::vector<int> lost;
  std::vector<ControlMessage> messages;
  while (lost.empty()) ExpectOk(mesh.ranks[0]->PollControl(5000, &messages, &lost), "PollControl with a lost peer");
  std::printf("time peer Close() seen by Recv and PollControl within %.3f ms\n", SecondsSince(start) * 1e3);
  Check(lost == std::vector<int>{2}, "lost_peers should be {2}");
  lost.clear();
  ExpectOk(mesh.ranks[0]->PollControl(50, &messages, &lost), "PollControl after the loss was reported");
  Check(lost.empty(), "a lost peer was reported twice");
  Pass("a peer that Close()s: PeerLost on Recv naming it, reported once in lost_peers");
}

void TestCloseUnblocks() {
  Mesh mesh = BuildMesh(2);
  std::vector<uint8_t> big(kLarge);
  Status recv_status, poll_status, send_status;
  std::thread receiver([&] { recv_status = mesh.ranks[0]->Recv(1, big.data(), 100); });
  std::thread poller([&] {
    std::vector<ControlMessage> m;
    std::vector<int> l;
    // Rank 1 closing first may show up as a lost peer before rank 0's own Close().
    do {
      poll_status = mesh.ranks[0]->PollControl(-1, &m, &l);
    } while (poll_status.ok());
  });
  // Rank 1 fills its socket buffers towards rank 0 (which never reads them) and blocks.
  std::thread sender([&] {
    std::vector<uint8_t> data(kLarge, 3);
    send_status = mesh.ranks[1]->Send(0, data.data(), data.size());
  });
  // Close the sender's own transport first: its Send must end with ShutDown whether it was blocked
  // or not started yet. Rank 0's Recv may still see rank 1's first bytes or its closing.
  mesh.ranks[1]->Close();
  mesh.ranks[0]->Close();
  receiver.join();
  poller.join();
  sender.join();
  Check(recv_status.code() == HORO_OK || recv_status.code() == HORO_ERR_SHUT_DOWN ||
            recv_status.code() == HORO_ERR_PEER_LOST,
        "blocked Recv after Close: " + recv_status.message());
  ExpectCode(poll_status, HORO_ERR_SHUT_DOWN, "PollControl(-1) interrupted by Close");
  ExpectCode(send_status, HORO_ERR_SHUT_DOWN, "blocked Send interrupted by Close", {"rank 1"});
  Pass("Close() from another thread makes blocked Send and PollControl(-1) return ShutDown");
}

void TestDataTimeout() {
  Mesh mesh = BuildMesh(2, [](TcpOptions* options) { options->data_timeout_seconds = 0.3; });
  uint8_t buffer[1000];
  auto start = Clock::now();
  ExpectCode(mesh.ranks[0]->Recv(1, buffer, sizeof(buffer)), HORO_ERR_TIMEOUT, "Recv from a silent peer",
             {"rank 0", "recv from rank 1", "0.3 s", "0 of 1000 bytes received"});
  double recv_seconds = SecondsSince(start);
  ExpectCode(mesh.ranks[0]->Recv(1, buffer, 1), HORO_ERR_TIMEOUT, "Recv after a timeout (stream out of step)");
  // A sender whose peer never reads stalls once the socket buffers are full.
  std::vector<uint8_t> big(kLarge, 5);
  start = Clock::now();
  ExpectCode(mesh.ranks[1]->Send(0, big.data(), big.size()), HORO_ERR_TIMEOUT, "Send to a peer that never reads",
             {"rank 1", "send to rank 0", "bytes sent"});
  double send_seconds = SecondsSince(start);
  // SendRecv names both directions.
  Mesh mesh2 = BuildMesh(2, [](TcpOptions* options) { options->data_timeout_seconds = 0.3; });
  ExpectCode(mesh2.ranks[0]->SendRecv(1, big.data(), big.size(), 1, buffer, 10), HORO_ERR_TIMEOUT,
             "SendRecv with a silent peer", {"send to rank 1", "recv from rank 1"});
  std::printf("time data timeout 0.3 s: recv returned after %.3f s, send after %.3f s\n", recv_seconds, send_seconds);
  Pass("no progress for data_timeout_seconds: Timeout on Recv, Send and SendRecv, naming the peer");
}

// ---------------------------------------------------------------------------------------------
// Forked ranks that die mid-transfer. Run first, while the program has a single thread.

enum class ChildDeath { kSigkillWhileSending, kExitWhileReceiving };

void TestForkedPeerDies(ChildDeath how) {
  const char* name = how == ChildDeath::kSigkillWhileSending ? "child SIGKILLed while sending"
                                                             : "child _exit()s while receiving";
  std::unique_ptr<TcpTransport> parent;
  ExpectOk(TcpTransport::Listen(Options(0, 2), &parent), "parent Listen");
  int pipe_fds[2];
  Check(::pipe(pipe_fds) == 0, "pipe");
  std::fflush(stdout);
  pid_t child = ::fork();
  Check(child >= 0, "fork");
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::unique_ptr<TcpTransport> t;
    if (!TcpTransport::Listen(Options(1, 2), &t).ok()) ::_exit(3);
    char address[128] = {};
    std::snprintf(address, sizeof(address), "%s", t->address().c_str());
    if (::write(pipe_fds[1], address, sizeof(address)) != sizeof(address)) ::_exit(4);
    if (!t->Connect({parent->address(), t->address()}).ok()) ::_exit(5);
    std::vector<uint8_t> data(8 << 20, 9);
    if (how == ChildDeath::kSigkillWhileSending) {
      t->Send(0, data.data(), data.size());  // 8 MB of the 64 MB the parent expects
      ::raise(SIGKILL);
    } else {
      t->Recv(0, data.data(), data.size());  // 8 MB of the 256 MB the parent sends
      ::_exit(0);
    }
    ::_exit(6);
  }
  ::close(pipe_fds[1]);
  char address[128] = {};
  Check(ReadExactly(pipe_fds[0], reinterpret_cast<uint8_t*>(address), sizeof(address)), "child address");
  ::close(pipe_fds[0]);
  ExpectOk(parent->Connect({parent->address(), address}), "parent Connect to child");
  auto start = Clock::now();
  if (how == ChildDeath::kSigkillWhileSending) {
    std::vector<uint8_t> buffer(kLarge);
    ExpectCode(parent->Recv(1, buffer.data(), buffer.size()), HORO_ERR_PEER_LOST, name,
               {"rank 0", "rank 1", "lost during recv"});
  } else {
    std::vector<uint8_t> buffer(size_t{256} << 20, 1);
    ExpectCode(parent->Send(1, buffer.data(), buffer.size()), HORO_ERR_PEER_LOST, name,
               {"rank 0", "rank 1", "lost during send"});
  }
  double seconds = SecondsSince(start);
  std::vector<int> lost;
  std::vector<ControlMessage> messages;
  while (lost.empty()) ExpectOk(parent->PollControl(5000, &messages, &lost), "parent PollControl");
  Check(lost == std::vector<int>{1}, std::string(name) + ": lost_peers should be {1}");
  int wstatus = 0;
  Check(::waitpid(child, &wstatus, 0) == child, "waitpid");
  if (how == ChildDeath::kSigkillWhileSending) {
    Check(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL, "child did not die of SIGKILL");
  } else {
    Check(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0, "child exit status " + std::to_string(wstatus));
  }
  parent->Close();
  std::printf("time %s: PeerLost after %.3f s\n", name, seconds);
  Pass(std::string("forked ") + name + ": parent gets PeerLost and lost_peers {1}");
}

}  // namespace

int main() {
  SetLogLevel(LogLevel::kError);
  auto start = Clock::now();
  TestForkedPeerDies(ChildDeath::kSigkillWhileSending);
  TestForkedPeerDies(ChildDeath::kExitWhileReceiving);
  TestCrypto();
  TestOptionsAndAddresses();
  for (int n : {1, 2, 3, 5}) TestMesh(n, /*measure=*/true);
  TestWrongSecret();
  TestStrangers();
  TestPeerClose();
  TestCloseUnblocks();
  TestDataTimeout();
  std::printf("all tcp transport checks passed in %.1f s\n", SecondsSince(start));
  return 0;
}
