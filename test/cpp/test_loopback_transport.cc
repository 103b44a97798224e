// sources: transport/loopback/*.cc common/dtype.cc
//
// Checks of the loopback transport: byte-stream semantics, argument errors, the control plane
// (delivery, Wake, routing rule), Close -> PeerLost on every path and lost_peers reported once,
// ShutDown on the closed rank itself, and the data timeout. Exits 1 on the first failure.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "transport/loopback/transport.h"
#include "unit_check.h"

using namespace horo;
using horo_test::Check;
using horo_test::CheckCode;
using horo_test::CheckOk;
using horo_test::Fail;

namespace {

std::vector<std::unique_ptr<LoopbackTransport>> MakeWorld(const std::shared_ptr<LoopbackHub>& hub, double timeout) {
  std::vector<std::unique_ptr<LoopbackTransport>> world;
  for (int rank = 0; rank < hub->size(); ++rank) world.push_back(std::make_unique<LoopbackTransport>(hub, rank, timeout));
  return world;
}

void CheckByteStream() {
  auto hub = std::make_shared<LoopbackHub>(3);
  auto world = MakeWorld(hub, 30.0);
  const std::string first = "hello", second = "", third = "loopback";
  CheckOk(world[0]->Send(1, first.data(), first.size()), "send 1");
  CheckOk(world[0]->Send(1, second.data(), second.size()), "send 2 (empty)");
  CheckOk(world[0]->Send(1, third.data(), third.size()), "send 3");
  std::string head(4, '\0'), tail(9, '\0');
  CheckOk(world[1]->Recv(0, &head[0], head.size()), "recv 4");
  CheckOk(world[1]->Recv(0, &tail[0], tail.size()), "recv 9");
  Check(head + tail == first + third, "byte stream must concatenate sends in order, got " + head + tail);

  // Streams of different pairs are independent.
  const uint8_t from2 = 2, from0 = 0;
  CheckOk(world[2]->Send(1, &from2, 1), "send 2->1");
  CheckOk(world[0]->Send(1, &from0, 1), "send 0->1");
  uint8_t got = 9;
  CheckOk(world[1]->Recv(2, &got, 1), "recv from 2");
  Check(got == 2, "receive from rank 2 must not see rank 0's byte");
  CheckOk(world[1]->Recv(0, &got, 1), "recv from 0");
  Check(got == 0, "rank 0's byte waits in its own stream");

  // A ring of SendRecv with a large buffer, every rank in its own thread.
  const size_t big = 3 << 20;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(3);
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      std::vector<uint8_t> out(big, static_cast<uint8_t>(rank + 1)), in(big, 0);
      Status status = world[rank]->SendRecv((rank + 1) % 3, out.data(), big, (rank + 2) % 3, in.data(), big);
      if (!status.ok()) errors[rank] = status.message();
      else if (in.front() != (rank + 2) % 3 + 1 || in.back() != (rank + 2) % 3 + 1) errors[rank] = "wrong bytes";
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 3; ++rank) Check(errors[rank].empty(), "ring SendRecv on rank " + std::to_string(rank) + ": " + errors[rank]);

  // Argument errors.
  uint8_t byte = 0;
  CheckCode(world[0]->Send(0, &byte, 1), HORO_ERR_INVALID_ARGUMENT, "peer rank 0", "send to self");
  CheckCode(world[0]->Recv(3, &byte, 1), HORO_ERR_INVALID_ARGUMENT, "peer rank 3", "recv from outside");
  CheckCode(world[0]->SendRecv(-2, &byte, 1, 1, &byte, 1), HORO_ERR_INVALID_ARGUMENT, "peer rank -2", "bad send peer");
  CheckOk(world[0]->SendRecv(-1, nullptr, 0, -1, nullptr, 0), "SendRecv with both directions skipped");
  bool threw = false;
  try {
    LoopbackTransport bad(hub, 3);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  Check(threw, "a rank outside the hub must be rejected");
  threw = false;
  try {
    LoopbackHub empty(0);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  Check(threw, "a hub of size 0 must be rejected");
  std::printf("ok  loopback data plane: ordered byte streams, independent pairs, 3 MiB ring, argument errors\n");
}

void CheckControlPlane() {
  auto hub = std::make_shared<LoopbackHub>(3);
  auto world = MakeWorld(hub, 30.0);
  CheckOk(world[1]->SendControl(0, "from one"), "control 1->0");
  CheckOk(world[2]->SendControl(0, std::string("two\0bytes", 9)), "control 2->0");
  CheckOk(world[0]->SendControl(2, "to two"), "control 0->2");
  // Loopback connects every pair of ranks (ControlToEveryPeer), as peer agreement needs.
  Check(world[2]->ControlToEveryPeer(), "loopback control reaches every peer");
  CheckOk(world[2]->SendControl(1, "peer to peer"), "control 2->1");

  std::vector<ControlMessage> messages;
  std::vector<int> lost;
  while (messages.size() < 2) CheckOk(world[0]->PollControl(-1, &messages, &lost), "poll rank 0");
  Check(messages.size() == 2 && lost.empty(), "rank 0 must receive exactly two messages");
  Check(messages[0].peer == 1 && messages[0].payload == "from one", "first control message");
  Check(messages[1].peer == 2 && messages[1].payload == std::string("two\0bytes", 9), "second message keeps NULs");
  messages.clear();
  CheckOk(world[2]->PollControl(-1, &messages, &lost), "poll rank 2");
  Check(messages.size() == 1 && messages[0].peer == 0 && messages[0].payload == "to two", "rank 2 message");

  messages.clear();
  CheckOk(world[1]->PollControl(-1, &messages, &lost), "poll rank 1");
  Check(messages.size() == 1 && messages[0].peer == 2 && messages[0].payload == "peer to peer", "rank 1 message");

  messages.clear();
  CheckOk(world[1]->PollControl(0, &messages, &lost), "poll with zero timeout");
  Check(messages.empty() && lost.empty(), "an empty poll returns nothing");

  // Wake releases a poll without limit, whether it comes before or during the wait.
  std::thread poller([&] {
    std::vector<ControlMessage> m;
    std::vector<int> l;
    CheckOk(world[1]->PollControl(-1, &m, &l), "woken poll");
    Check(m.empty() && l.empty(), "a woken poll returns nothing");
  });
  world[1]->Wake();
  poller.join();
  std::printf("ok  loopback control plane: delivery with sender, routing rule, zero timeout, Wake\n");
}

void CheckClose() {
  auto hub = std::make_shared<LoopbackHub>(3);
  auto world = MakeWorld(hub, 30.0);
  const uint8_t sent[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  CheckOk(world[0]->Send(1, sent, sizeof(sent)), "send before close");

  Status pending;
  std::thread waiter([&] {
    uint8_t sink[64];
    pending = world[2]->Recv(0, sink, sizeof(sink));
  });
  world[0]->Close();
  waiter.join();
  CheckCode(pending, HORO_ERR_PEER_LOST, "rank 0", "a receive waiting on the closed rank");

  uint8_t got[10] = {};
  CheckOk(world[1]->Recv(0, got, sizeof(got)), "bytes sent before the close are still delivered");
  Check(got[9] == 10, "delivered bytes are intact");
  uint8_t byte = 0;
  CheckCode(world[1]->Recv(0, &byte, 1), HORO_ERR_PEER_LOST, "rank 0", "a later receive from the closed rank");
  CheckCode(world[1]->Send(0, &byte, 1), HORO_ERR_PEER_LOST, "rank 0", "a send to the closed rank");
  CheckCode(world[1]->SendControl(0, "x"), HORO_ERR_PEER_LOST, "rank 0", "a control message to the closed rank");

  for (int rank = 1; rank < 3; ++rank) {
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    CheckOk(world[rank]->PollControl(-1, &messages, &lost), "poll after close");
    Check(lost.size() == 1 && lost[0] == 0, "rank " + std::to_string(rank) + " must see rank 0 lost");
    lost.clear();
    CheckOk(world[rank]->PollControl(0, &messages, &lost), "second poll after close");
    Check(lost.empty(), "a lost peer is reported once");
  }

  CheckCode(world[0]->Recv(1, &byte, 1), HORO_ERR_SHUT_DOWN, "rank 0", "receive on the closed rank");
  CheckCode(world[0]->Send(1, &byte, 1), HORO_ERR_SHUT_DOWN, "rank 0", "send on the closed rank");
  CheckCode(world[0]->SendControl(1, "x"), HORO_ERR_SHUT_DOWN, "rank 0", "control send on the closed rank");
  std::vector<ControlMessage> messages;
  std::vector<int> lost;
  CheckCode(world[0]->PollControl(-1, &messages, &lost), HORO_ERR_SHUT_DOWN, "rank 0", "poll on the closed rank");
  world[0]->Close();  // idempotent

  // Destroying a transport closes it too.
  world[2].reset();
  CheckCode(world[1]->Recv(2, &byte, 1), HORO_ERR_PEER_LOST, "rank 2", "receive from a destroyed transport");
  lost.clear();
  CheckOk(world[1]->PollControl(-1, &messages, &lost), "poll after destroy");
  Check(lost.size() == 1 && lost[0] == 2, "a destroyed transport is reported lost");
  std::printf("ok  loopback close: PeerLost on pending/later receive, send and control; lost once; ShutDown locally\n");
}

void CheckTimeout() {
  auto hub = std::make_shared<LoopbackHub>(2);
  auto world = MakeWorld(hub, 0.2);
  uint8_t buffer[8];
  CheckOk(world[0]->Send(1, buffer, 3), "partial send");
  CheckCode(world[1]->Recv(0, buffer, sizeof(buffer)), HORO_ERR_TIMEOUT, "rank 0", "a receive that stalls");
  CheckCode(world[0]->SendRecv(1, buffer, 1, 1, buffer, 1), HORO_ERR_TIMEOUT, "from rank 1", "a SendRecv that stalls");
  std::printf("ok  loopback timeout: a stalled receive fails with Timeout naming the peer\n");
}

}  // namespace

int main() {
  CheckByteStream();
  CheckControlPlane();
  CheckClose();
  CheckTimeout();
  std::printf("all loopback transport checks passed\n");
  return 0;
}
