// sources: common/sha256.cc common/hmac.cc common/logging.cc transport/tcp/connection.cc
//
// The MACs of TCP control frames (transport/tcp/connection.h), on the two ends of a socketpair
// with the keys a handshake gives each end. Checks: frames of every size arrive intact and in
// order (one of several MiB, which the socket takes in many partial sends); and whatever else is
// written into the stream is refused with kForgedFrame, while the frames before it are still
// delivered: a frame replayed (its bytes sent again), one altered in its payload or in its length,
// one made under another connection's key, one from the other direction reflected back, and one
// left out of the stream (the next one arrives under the wrong sequence number). Exits 1 on the
// first failure.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "transport/tcp/connection.h"
#include "unit_check.h"

using namespace horo;
using namespace horo_test;
using tcp::Connection;

namespace {

const tcp::FrameKeys kKeys{"key of frames from a to b (32 B)", "key of frames from b to a (32 B)"};
const tcp::FrameKeys kOtherConnection{"another connection's a-to-b key", "another connection's b-to-a key"};

tcp::FrameKeys Reversed(const tcp::FrameKeys& keys) { return {keys.receive, keys.send}; }

struct Pair {
  std::unique_ptr<Connection> a, b;
};

Pair Connect() {
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
  return {std::make_unique<Connection>(fds[0], 1, tcp::ChannelKind::kControl, "end a", kKeys),
          std::make_unique<Connection>(fds[1], 0, tcp::ChannelKind::kControl, "end b", Reversed(kKeys))};
}

// The bytes of the frame that `sender` would send next (its sequence number advances).
std::string FrameBytes(Connection* sender, const std::string& payload) {
  uint8_t header[Connection::kControlHeaderSize];
  for (size_t i = 0; i < sizeof(header); ++i) header[i] = static_cast<uint8_t>(uint64_t{payload.size()} >> (8 * i));
  uint8_t mac[Connection::kControlMacSize];
  sender->Seal(header, payload, mac);
  return std::string(reinterpret_cast<char*>(header), sizeof(header)) + payload +
         std::string(reinterpret_cast<char*>(mac), sizeof(mac));
}

// Writes raw bytes into the stream towards the reader, as someone on the path could.
void Inject(Connection* writer_end, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(writer_end->fd(), bytes.data() + done, bytes.size() - done);
    Check(n > 0, "write into the socket");
    done += static_cast<size_t>(n);
  }
}

// Sends one frame through the connection's own path, reading on the other end whenever the socket
// is full (a socketpair holds far less than the largest payload here).
void Send(Connection* from, Connection* to, const std::string& payload, std::vector<ControlMessage>* received) {
  uint8_t header[Connection::kControlHeaderSize];
  for (size_t i = 0; i < sizeof(header); ++i) header[i] = static_cast<uint8_t>(uint64_t{payload.size()} >> (8 * i));
  uint8_t mac[Connection::kControlMacSize];
  from->Seal(header, payload, mac);
  const size_t total = sizeof(header) + payload.size() + sizeof(mac);
  size_t offset = 0;
  while (offset < total) {
    int error = 0;
    Check(from->SendFrameSome(header, payload, mac, &offset, &error) == Connection::Io::kOk, "SendFrameSome");
    if (offset < total) Check(to->ReadFrames(received, &error) == Connection::Io::kOk, "ReadFrames while sending");
  }
}

// Reads what is in the socket: the status and the fault code.
Connection::Io Read(Connection* to, std::vector<ControlMessage>* received, int* error) {
  *error = 0;
  return to->ReadFrames(received, error);
}

void ExpectPayloads(const std::vector<ControlMessage>& received, const std::vector<std::string>& expected,
                    const std::string& tag) {
  Check(received.size() == expected.size(), tag + ": " + std::to_string(received.size()) +
                                                " frames delivered, expected " + std::to_string(expected.size()));
  for (size_t i = 0; i < expected.size(); ++i) {
    Check(received[i].payload == expected[i], tag + ": frame " + std::to_string(i) + " differs");
  }
}

void ExpectForged(Connection* to, const std::vector<std::string>& delivered_first, const std::string& tag) {
  std::vector<ControlMessage> received;
  int error = 0;
  Connection::Io io = Read(to, &received, &error);
  Check(io == Connection::Io::kError && error == Connection::kForgedFrame,
        tag + ": the stream was accepted (io " + std::to_string(static_cast<int>(io)) + ", error " +
            std::to_string(error) + ")");
  Check(std::strstr(Connection::FrameFault(error), "failed authentication") != nullptr, tag + ": fault text");
  ExpectPayloads(received, delivered_first, tag);
}

void TestFramesArriveIntact() {
  Pair p = Connect();
  std::string large(size_t{6} << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>((i * 131) >> 3);
  const std::vector<std::string> payloads = {"", "one", large, std::string(1000, 'x'), "last"};
  std::vector<ControlMessage> received;
  for (const std::string& payload : payloads) Send(p.a.get(), p.b.get(), payload, &received);
  int error = 0;
  Check(Read(p.b.get(), &received, &error) == Connection::Io::kOk, "[intact] final read");
  ExpectPayloads(received, payloads, "[intact]");
  // The other direction has its own key and count.
  std::vector<ControlMessage> back;
  Send(p.b.get(), p.a.get(), "answer", &back);
  Check(Read(p.a.get(), &back, &error) == Connection::Io::kOk, "[intact] read the answer");
  ExpectPayloads(back, {"answer"}, "[intact, other direction]");
  std::printf("ok: frames of 0 B to 6 MiB arrive intact and in order, both ways\n");
}

// Each case: two genuine frames go through, then the case writes something into the stream.
void TestTampering(const std::string& tag, const std::function<void(Pair*, const std::string&)>& tamper) {
  Pair p = Connect();
  std::vector<ControlMessage> received;
  const std::string first = "first";
  Send(p.a.get(), p.b.get(), first, &received);
  Send(p.a.get(), p.b.get(), "second", &received);
  tamper(&p, first);
  std::vector<std::string> delivered = {first, "second"};
  for (size_t i = 0; i < received.size(); ++i) delivered.erase(delivered.begin());  // read while sending
  ExpectForged(p.b.get(), delivered, "[" + tag + "]");
  std::printf("ok: %s is refused\n", tag.c_str());
}

}  // namespace

int main() {
  TestFramesArriveIntact();
  TestTampering("a frame replayed", [](Pair* p, const std::string& first) {
    // Its bytes as they went by first: frame 0 of this direction, made again by a sender at 0.
    Connection twin(-1, 1, tcp::ChannelKind::kControl, "twin", kKeys);
    Inject(p->a.get(), FrameBytes(&twin, first));
  });
  TestTampering("a frame with its payload altered", [](Pair* p, const std::string&) {
    std::string bytes = FrameBytes(p->a.get(), "rank 1 reduces tensor 'w'");
    bytes[Connection::kControlHeaderSize + 5] ^= 0x01;
    Inject(p->a.get(), bytes);
  });
  TestTampering("a frame with its length altered", [](Pair* p, const std::string&) {
    std::string bytes = FrameBytes(p->a.get(), "0123456789");
    bytes[0] = 9;  // one byte shorter: the MAC is read one byte early, and covers another length
    Inject(p->a.get(), bytes);
  });
  TestTampering("a frame under another connection's key", [](Pair* p, const std::string&) {
    Connection stranger(-1, 1, tcp::ChannelKind::kControl, "stranger", kOtherConnection);
    for (int i = 0; i < 2; ++i) FrameBytes(&stranger, "skip");  // at the right sequence number
    Inject(p->a.get(), FrameBytes(&stranger, "forged"));
  });
  TestTampering("a frame of the other direction reflected back", [](Pair* p, const std::string&) {
    Connection b_twin(-1, 0, tcp::ChannelKind::kControl, "b twin", Reversed(kKeys));
    for (int i = 0; i < 2; ++i) FrameBytes(&b_twin, "skip");
    Inject(p->a.get(), FrameBytes(&b_twin, "reflected"));
  });
  TestTampering("a frame left out", [](Pair* p, const std::string&) {
    FrameBytes(p->a.get(), "dropped on the way");  // made and counted, never sent
    Inject(p->a.get(), FrameBytes(p->a.get(), "after the gap"));
  });
  TestTampering("a frame with a MAC of zeros", [](Pair* p, const std::string&) {
    std::string bytes = FrameBytes(p->a.get(), "zeros");
    std::memset(&bytes[bytes.size() - Connection::kControlMacSize], 0, Connection::kControlMacSize);
    Inject(p->a.get(), bytes);
  });
  return 0;
}
