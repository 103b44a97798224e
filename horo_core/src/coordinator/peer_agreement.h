// PeerAgreement: steady-state steps without the coordinator.
//
// Once a tensor has been negotiated, every rank holds its response under the same cache id
// (response_cache.h). When a rank submits that tensor again with the same parameters, it sends the
// coordinator no request: it announces the id to every peer in a numbered round message, and every
// rank runs the cached responses that all members of their process set have announced. Rank 0
// takes part like any other rank; nothing is validated, built or sent by the coordinator.
//
// Rounds keep the order alike on every rank. A rank sends its message for round k once it has
// completed round k - 1 and it has news, or once a peer's message for round k arrived (it must
// answer, if need be with an empty message). Round k completes when a rank holds the message of
// every rank, and then every rank takes the same steps on the same inputs:
//   1. the coordinator's response lists made right after round k - 1 (ResponseList::after_round),
//      which the runtime applies before calling CompleteRound;
//   2. invalidations: a rank that submitted a cached name with other parameters (a new shape, say)
//      names the id, sends the coordinator the full request, and every rank forgets the id; joins:
//      a rank that joined a process set stops cached steps in it until the join completes;
//   3. announcements of ids still cached; the ids that every member has announced run, in id order,
//      fused as the coordinator fuses (up to the threshold stamped in the responses, so that ranks
//      with different settings still fuse alike).
// A small host allreduce, reducescatter, allgather, alltoall or broadcast (Eager) travels with its
// data: each rank puts its input bytes in the announcement (the root alone, for a broadcast), so
// once every member's announcement is in, every rank holds every contribution and reduces them (in
// member order: the same arithmetic on every rank; a reducescatter only the rows of its own part),
// lays them end to end itself (an alltoall only the rows each member sent it) or copies the root's,
// with no data-plane step at all.
// An id this rank announced that is forgotten before it runs (evicted by the coordinator, dropped in
// step 2, its set being joined or removed) becomes a full request to the coordinator instead, so
// nothing waits forever. The members of a grouped call are announced together or not at all, run in
// the same round, and fall back together. Everything else (first steps, changed tensors, barriers,
// joins, process-set changes, shutdown) goes through the coordinator as before; rank 0 sees every
// announcement and reports cached tensors that some members never announce as stalls.
//
// Needs a control channel between every pair of ranks (Transport::ControlToEveryPeer). Not
// thread-safe: used by whichever thread runs the runtime's pass.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "coordinator/process_set_table.h"
#include "coordinator/request.h"
#include "coordinator/response.h"
#include "coordinator/response_cache.h"
#include "coordinator/round_message.h"
#include "coordinator/stall_inspector.h"

namespace horo {

// One step every rank runs after a round: a fused response for the executor, or (contributions
// not empty) one small collective (PeerAgreement::Eager) whose every member's input bytes are
// here, in member order.
struct AgreedStep {
  FusedResponse fused;  // empty for a step from contributions
  std::vector<std::string> contributions;
  const Response* contributed = nullptr;  // with contributions: the cached response (valid until
                                          // the cache next changes)
};

class PeerAgreement {
 public:
  // Largest allreduce, reducescatter, alltoall or broadcast input (and allgather result) announced
  // with its data, and the data one message carries at most.
  static constexpr int64_t kEagerBytes = 4096;
  static constexpr int64_t kEagerBytesPerMessage = 64 << 10;
  // Whether this cached response travels with its data in the announcements rather than on the
  // data plane: host allreduces and reducescatters (not Adasum) up to kEagerBytes and the
  // response's latency-optimal crossover, host allgathers whose result is at most kEagerBytes,
  // host alltoalls whose every member's input is at most kEagerBytes, host broadcasts of at most
  // kEagerBytes. Then EagerBytes is what the member at member_index of the set (members, in rank
  // order) announces: the whole tensor of an allreduce, a reducescatter or an alltoall (all the
  // rows it sends), its own rows of an allgather (which may be none), and of a broadcast the whole
  // tensor from the root and nothing from the other members.
  static bool Eager(const Response& response);
  static int64_t EagerBytes(const Response& response, const std::vector<int32_t>& members, size_t member_index);

  PeerAgreement(int rank, int size, ResponseCache* cache, ProcessSetTable* sets);

  // A request taken from the tensor queue: true when it is announced (a cached step; *request is
  // moved from), false when it goes to the coordinator (perhaps with an invalidation or a join
  // announced). A join while this rank's sent announcements in its set are pending is held back
  // (true as well) and comes out of TakeFallbacks once they ran or fell back.
  bool Offer(Request* request);
  // The requests of one grouped call (consecutive in the queue): announced together, or (false)
  // all sent to the coordinator, which emits a group only once every member is in.
  bool OfferGroup(const std::vector<Request>& members);
  // A peer's round message.
  Status Receive(int peer, const std::string& payload);
  // The message this rank must send to every peer now, if any. With answer false, a message that
  // would carry no news, only answer a peer's round, is not made (AnswerOwed() then says so): the
  // caller expects news soon and lets it travel in that round instead of the one after.
  bool NextMessage(std::string* payload, bool answer = true);
  // A peer's message for the next round is in and this rank has not sent its own.
  bool AnswerOwed() const;
  // True when the next round has every rank's message; *round is its number. The runtime then
  // applies the coordinator's lists made before it and calls CompleteRound.
  bool RoundReady(int64_t* round) const;
  // Completes that round: *run receives the steps every rank runs now, in order.
  void CompleteRound(std::vector<AgreedStep>* run);

  // A round of one synchronous collective, for a caller that runs it by itself
  // (Runtime::RunExpress): with nothing else pending on this rank (Idle), a cached small host
  // allreduce or broadcast that request matches (FitsAlone: its id) is announced alone
  // (AnnounceAlone, which makes the round's message; *payload then goes to every peer). When the
  // round is ready and every member announced just that, with its data (EagerBytes), and no rank
  // sent anything else, CompleteAlone completes it: true, and *contributions points to every
  // member's input bytes, in member order, until EndAlone. Otherwise the caller hands the request
  // over (AdoptAlone), and the round completes as any other.
  bool Idle() const;
  int64_t FitsAlone(const Request& request) const;
  void AnnounceAlone(int64_t id, const void* input, std::string* payload);
  bool CompleteAlone(int64_t id, std::vector<const char*>* contributions);
  void EndAlone();
  void AdoptAlone(int64_t id, Request request);

  // The coordinator's list evicted id (already gone from the cache).
  void Forget(int64_t id);
  // A join of the process set completed: cached steps in it resume.
  void JoinDone(int32_t process_set_id);
  // Requests of this rank that must go to the coordinator after all (see above).
  std::vector<Request> TakeFallbacks();
  bool has_fallbacks() const { return !fallbacks_.empty(); }
  // Cached tensors waiting to run, for the stall inspector: announced by some members only, or
  // held by the round in progress (see OpenRoundOwedBy), which then names the ranks it waits for
  // once it has been open for kRoundHeldSeconds.
  std::vector<StalledTensor> Waiting() const;
  // Ranks whose message for the round in progress has not arrived, once some rank's has (this
  // rank's own included); empty otherwise. No step of that round runs anywhere without them: a
  // rank that stopped (SIGSTOP, a debugger) holds every rank here.
  std::vector<int32_t> OpenRoundOwedBy() const;
  static constexpr double kRoundHeldSeconds = 1.0;

  bool mid_round() const { return round_sent_ > round_done_; }
  int64_t round_done() const { return round_done_; }
  int64_t responses_run() const { return responses_run_; }

 private:
  struct Announced {
    std::vector<char> ranks;          // by global rank: announced it (sized at the first announcement)
    std::vector<std::string> data;    // by global rank: eager allreduce input bytes (sized at the first)
    std::vector<int64_t> unit;        // the ids announced as one group with it (empty: alone)
    std::chrono::steady_clock::time_point since;
  };
  // The messages of one round, by rank. A peer is at most one round ahead of this rank's unfinished
  // one, so two of these, by the round's parity, hold every message that can be pending; their
  // messages keep their storage from round to round.
  struct Inbox {
    int64_t round = 0;  // 0: holds nothing
    int count = 0;
    std::vector<char> have;
    std::vector<RoundMessage> messages;
  };
  Inbox& InboxOf(int64_t round) { return inbox_[round & 1]; }
  const Inbox& InboxOf(int64_t round) const { return inbox_[round & 1]; }
  // Makes slot hold round (it must hold none).
  void OpenInbox(Inbox* slot, int64_t round);
  // announced_ and mine_ entries come from and go back to nodes kept aside, so that a steady
  // state of the same tensors step after step allocates no map node.
  Announced& AnnouncedEntry(int64_t id);
  void EraseAnnounced(std::map<int64_t, Announced>::iterator it);
  void KeepMine(int64_t id, Request request);
  void EraseMine(std::map<int64_t, Request>::iterator it);
  // Whether this rank's request asks for exactly what the cached response does.
  bool Matches(const Response& cached, const Request& request) const;
  // Adds this rank's announcement of id (unit: its group's first id) to the next message.
  void Announce(int64_t id, Request request, int64_t unit);
  // Stops waiting for id and the rest of its group; this rank's announcements of them, sent or
  // not, become fallbacks.
  void Drop(int64_t id);
  // This rank's announcements in a set, sent or not (the unsent ones are taken out of next_),
  // become fallbacks; returns their ids.
  std::vector<int64_t> Withdraw(int32_t process_set_id);
  // Joins of this rank held back while announcements it sent in their set are pending become
  // fallbacks once none is.
  void ReleaseJoins();

  int rank_;
  int size_;
  ResponseCache* cache_;
  ProcessSetTable* sets_;
  int64_t round_sent_ = 0;  // the last round this rank sent its message for
  int64_t round_done_ = 0;  // the last round completed
  RoundMessage next_;       // news for the next message
  int64_t next_data_bytes_ = 0;
  Inbox inbox_[2];
  std::map<int64_t, Request> mine_;                       // ids this rank announced, not yet run
  std::map<int64_t, std::vector<int64_t>> my_units_;      // of those, the ones announced as a group
  std::map<int64_t, Announced> announced_;                // every rank's announcements, not yet run
  std::set<int32_t> joining_;                             // sets with a join in progress
  // Per set: joins completed (join responses applied), and joins this rank made. A rank's n-th
  // join completes with the set's n-th join response, so an announcement of it that is read after
  // that response is stale (the ranks joining last announce after the join completed).
  std::map<int32_t, int64_t> joins_done_;
  std::map<int32_t, int64_t> my_joins_;
  std::vector<Request> fallbacks_;
  std::vector<Request> deferred_joins_;  // see Offer
  int64_t responses_run_ = 0;
  int64_t alone_round_ = 0;  // CompleteAlone's, for EndAlone
  // Waiting's record of the round in progress: its number, and when Waiting first saw it open.
  mutable int64_t held_round_ = 0;
  mutable std::chrono::steady_clock::time_point held_since_;
  // Scratch of CompleteRound and Matches, kept for its capacity.
  std::vector<int64_t> scratch_ready_;
  std::vector<int64_t> scratch_orphaned_;
  std::vector<int64_t> scratch_whole_;
  std::vector<int64_t> scratch_regrouped_;
  mutable MembersView members_view_;
  std::vector<std::map<int64_t, Announced>::node_type> spare_announced_;
  std::vector<std::map<int64_t, Request>::node_type> spare_mine_;
};

}  // namespace horo
