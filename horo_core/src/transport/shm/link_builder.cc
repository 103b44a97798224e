#include "transport/shm/link_builder.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "common/cpu_cache.h"
#include "common/logging.h"
#include "common/sha256.h"

namespace horo {
namespace shm {
namespace {

constexpr char kHelloMagic[8] = {'H', 'O', 'R', 'O', 'S', 'H', 'M', '1'};
constexpr size_t kNameCapacity = 64;

struct Hello {
  char magic[8];
  uint8_t enabled;
  uint8_t reserved[7];
  uint8_t host_digest[32];
};

struct Offer {
  uint32_t ok;
  uint32_t slot;
  uint64_t ring_bytes;
  uint64_t token;
  char name[kNameCapacity];
};

struct Reply {
  uint32_t ok;
  uint32_t reserved;
};

}  // namespace

LinkBuilder::LinkBuilder(const ShmOptions& options, TcpTransport* tcp) : options_(options), tcp_(tcp) {}

Status LinkBuilder::HostDigest(uint8_t digest[32]) const {
  std::string host = options_.host;
  if (host.empty()) {
    char name[256] = "";
    if (::gethostname(name, sizeof(name) - 1) != 0) return Status::Internal(Who() + ": gethostname failed");
    host = name;
  }
  // The boot id tells apart hosts (or containers on different machines) that share a name.
  std::string boot_id;
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::getline(file, boot_id);
  const std::string identity = host + "\n" + boot_id;
  Sha256Digest hash = Sha256::Hash(identity.data(), identity.size());
  std::memcpy(digest, hash.data(), 32);
  return Status::OK();
}

Status LinkBuilder::Run(LinkSet* result) {
  const int rank = tcp_->rank(), size = tcp_->size();
  result->own.reset();
  result->mapped.clear();
  result->mapped.resize(size);
  result->links.clear();
  result->links.resize(size);
  result->host_ids.assign(size, 0);

  // Round 1: hello to everyone. Disabled ranks take part too, so that the byte streams agree.
  Hello mine{};
  std::memcpy(mine.magic, kHelloMagic, sizeof(kHelloMagic));
  mine.enabled = options_.enabled ? 1 : 0;
  HORO_RETURN_IF_ERROR(HostDigest(mine.host_digest));
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) HORO_RETURN_IF_ERROR(tcp_->Send(peer, &mine, sizeof(mine)));
  }
  std::vector<int> candidates;
  std::vector<Hello> hellos(size);
  hellos[rank] = mine;
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    Hello& theirs = hellos[peer];
    HORO_RETURN_IF_ERROR(tcp_->Recv(peer, &theirs, sizeof(theirs)));
    if (std::memcmp(theirs.magic, kHelloMagic, sizeof(kHelloMagic)) != 0) {
      return Status::Internal(Who() + ": rank " + std::to_string(peer) +
                              " sent a malformed shared-memory hello (different Horo versions?)");
    }
    if (mine.enabled && theirs.enabled && std::memcmp(mine.host_digest, theirs.host_digest, 32) == 0) {
      candidates.push_back(peer);
    }
  }
  // Every rank saw the same hellos, so every rank computes the same map.
  for (int peer = 0; peer < size; ++peer) {
    int first = 0;
    while (std::memcmp(hellos[first].host_digest, hellos[peer].host_digest, 32) != 0) ++first;
    result->host_ids[peer] = first;
  }
  if (candidates.empty()) return Status::OK();

  // Round 2: offer a slot of this rank's segment to every candidate.
  const uint64_t ring_bytes =
      options_.ring_bytes != 0 ? options_.ring_bytes : DefaultRingBytes(candidates.size(), CoreCacheBytes());
  Status created = Segment::Create(static_cast<uint32_t>(candidates.size()), ring_bytes, &result->own);
  if (!created.ok()) {
    HORO_LOG(kWarning, rank) << "shared memory unavailable, same-host peers use TCP: " << created.message();
  }
  for (size_t slot = 0; slot < candidates.size(); ++slot) {
    Offer offer{};
    if (created.ok()) {
      offer.ok = 1;
      offer.slot = static_cast<uint32_t>(slot);
      offer.ring_bytes = result->own->ring_bytes();
      offer.token = result->own->token();
      std::strncpy(offer.name, result->own->name().c_str(), kNameCapacity - 1);
    }
    HORO_RETURN_IF_ERROR(tcp_->Send(candidates[slot], &offer, sizeof(offer)));
  }
  std::vector<uint32_t> their_slot(size, 0);
  std::vector<bool> mapped_ok(size, false);
  // A peer lost from here on may have died with its segment's name still linked (it unlinks it
  // after round 3), and nothing else would remove the segment from /dev/shm: unlink it for the
  // peer. Only a name whose segment held the peer's token, so never another process's object.
  std::vector<std::string> verified_name(size);
  auto lost = [&](int peer, const Status& status) {
    if (!verified_name[peer].empty()) ::shm_unlink(verified_name[peer].c_str());
    return status;
  };
  for (int peer : candidates) {
    Offer offer{};
    HORO_RETURN_IF_ERROR(tcp_->Recv(peer, &offer, sizeof(offer)));
    if (!offer.ok) continue;
    offer.name[kNameCapacity - 1] = '\0';
    Status opened = Segment::Open(offer.name, offer.token, &result->mapped[peer]);
    if (opened.ok() && offer.slot >= result->mapped[peer]->slots()) {
      opened = Status::Internal("slot " + std::to_string(offer.slot) + " is out of range");
    }
    if (!opened.ok()) {
      HORO_LOG(kWarning, rank) << "cannot map the shared memory of rank " << peer
                               << " (it claims the same host), using TCP with it: " << opened.message();
      result->mapped[peer].reset();
      continue;
    }
    their_slot[peer] = offer.slot;
    mapped_ok[peer] = true;
    verified_name[peer] = offer.name;
  }

  // Round 3: tell every candidate whether its segment was mapped; a pair needs both.
  for (int peer : candidates) {
    Reply reply{};
    reply.ok = mapped_ok[peer] ? 1 : 0;
    Status sent = tcp_->Send(peer, &reply, sizeof(reply));
    if (!sent.ok()) return lost(peer, sent);
  }
  std::vector<bool> active(size, false);
  for (int peer : candidates) {
    Reply reply{};
    Status received = tcp_->Recv(peer, &reply, sizeof(reply));
    if (!received.ok()) return lost(peer, received);
    active[peer] = mapped_ok[peer] && reply.ok == 1;
  }
  if (result->own) result->own->Unlink();  // every candidate has mapped it or given up

  int linked = 0;
  for (size_t slot = 0; slot < candidates.size(); ++slot) {
    const int peer = candidates[slot];
    if (!active[peer]) {
      result->mapped[peer].reset();
      continue;
    }
    Segment* theirs = result->mapped[peer].get();
    Segment* own = result->own.get();
    auto link = std::make_unique<Link>();
    link->peer = peer;
    link->out = Ring(theirs->ring_shared(their_slot[peer]), theirs->ring_data(their_slot[peer]),
                     theirs->ring_bytes(), theirs->doorbell());
    link->in = Ring(own->ring_shared(static_cast<uint32_t>(slot)), own->ring_data(static_cast<uint32_t>(slot)),
                    own->ring_bytes(), theirs->doorbell());
    link->control_out = Ring(theirs->control_shared(their_slot[peer]), theirs->control_data(their_slot[peer]),
                             Segment::kControlRingBytes, theirs->doorbell());
    link->control_in = Ring(own->control_shared(static_cast<uint32_t>(slot)),
                            own->control_data(static_cast<uint32_t>(slot)), Segment::kControlRingBytes,
                            theirs->doorbell());
    result->links[peer] = std::move(link);
    ++linked;
  }
  if (linked == 0) result->own.reset();
  HORO_LOG(kDebug, rank) << "shared memory with " << linked << " of " << size - 1 << " peers";
  return Status::OK();
}

}  // namespace shm
}  // namespace horo
