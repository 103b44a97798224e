// LinkBuilder: the Connect() phase of ShmTransport. After the TCP mesh is up it finds the peers on
// this host and sets up a shared-memory Link with each, over the already authenticated TCP data
// connections, in three rounds of fixed-size messages. Every round first sends to every peer
// concerned and then receives from each (the messages are tiny, so no send waits for a receive):
//
//   1. hello  (every peer):  "HOROSHM1" | enabled | SHA-256(host name "\n" boot id)
//      Peers with equal digests that both enabled shared memory are candidates. The digests also
//      give every rank the same map of which ranks share a host (LinkSet::host_ids), whether or
//      not shared memory is enabled.
//   2. offer  (candidates):  ok | slot | ring_bytes | token | segment name
//      Each rank creates one Segment with a slot per candidate and tells each candidate its slot;
//      ok = 0 when the segment could not be created.
//   3. reply  (candidates):  ok = "I mapped your segment and its token matched"
//      Then every rank unlinks its segment's name. A rank that loses a peer in this round unlinks
//      the name of the peer's segment (if it mapped it): a peer killed before the end of round 3
//      cannot, and the segment would stay in /dev/shm. hororun removes what its ranks leave too.
//
// A pair uses shared memory iff both replies are ok, which both ranks know after round 3, so they
// always agree; any other outcome leaves the pair on TCP (with a warning naming the peer), never
// fails Connect. Only TCP errors (a peer lost during setup) do.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/options.h"
#include "transport/shm/ring.h"
#include "transport/shm/segment.h"
#include "transport/tcp/transport.h"

namespace horo {
namespace shm {

// The shared-memory channel to one same-host peer: out lives in the peer's segment (this rank
// produces), in lives in this rank's segment (this rank consumes).
struct Link {
  int peer = -1;
  Ring out;
  Ring in;
  Status broken;  // once set, the byte streams are out of step and every later call fails so

  // The control plane between this pair (rank 0 and a worker), framed as on TCP: an 8-byte
  // little-endian length, then the payload. A frame may be larger than the ring; it streams.
  Ring control_out;
  Ring control_in;
  // The frame being read from control_in: its header bytes, then its payload.
  char control_header[8] = {};
  size_t control_header_have = 0;
  std::string control_frame;
  size_t control_frame_have = 0;
  Status control_broken;  // a corrupt frame arrived: the control stream is out of step for good
};

struct LinkSet {
  std::vector<int> host_ids;                      // host_ids[p]: the lowest rank on rank p's host
  std::unique_ptr<Segment> own;                   // this rank's segment; null when no link uses it
  std::vector<std::unique_ptr<Segment>> mapped;   // mapped[p]: peer p's segment, or null
  std::vector<std::unique_ptr<Link>> links;       // links[p]: the link to peer p, or null (TCP)
};

class LinkBuilder {
 public:
  LinkBuilder(const ShmOptions& options, TcpTransport* tcp);
  // Fills *result (size() entries per vector).
  Status Run(LinkSet* result);

 private:
  Status HostDigest(uint8_t digest[32]) const;
  std::string Who() const { return "rank " + std::to_string(tcp_->rank()); }

  const ShmOptions& options_;
  TcpTransport* tcp_;
};

}  // namespace shm
}  // namespace horo
