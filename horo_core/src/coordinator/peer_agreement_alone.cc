// PeerAgreement's rounds of one synchronous allreduce or broadcast announced alone
// (peer_agreement.h, "A round of one synchronous collective"; runtime/runtime_express.cc runs
// them): the checks that the rank has nothing else pending and that the request matches its cached
// response, the announcement, and the completion of a round in which every member announced that
// tensor alone, with its data, which skips the general bookkeeping of CompleteRound. Any other
// round completes there, after the caller hands its request over (AdoptAlone).
#include <algorithm>

#include "coordinator/peer_agreement.h"

namespace horo {

bool PeerAgreement::Idle() const {
  return round_sent_ == round_done_ && next_.empty() && mine_.empty() && announced_.empty() && fallbacks_.empty() &&
         deferred_joins_.empty() && joining_.empty();
}

int64_t PeerAgreement::FitsAlone(const Request& request) const {
  if ((request.op_type != OpType::kAllreduce && request.op_type != OpType::kBroadcast) || request.device != 0 ||
      request.input == nullptr) {
    return -1;
  }
  const int64_t id = cache_->Find(request.process_set_id, request.name);
  if (id < 0) return -1;
  const Response& cached = *cache_->Get(id);
  if (!Matches(cached, request) || !Eager(cached)) return -1;
  return id;
}

void PeerAgreement::AnnounceAlone(int64_t id, const void* input, std::string* payload) {
  const Response& cached = *cache_->Get(id);
  const std::vector<int32_t>& members = *members_view_.Get(cached.process_set_id);  // this rank is one (Matches)
  const size_t me = static_cast<size_t>(std::find(members.begin(), members.end(), rank_) - members.begin());
  next_.hits.push_back(id);
  next_.units.push_back(id);
  next_.data.emplace_back();
  next_.data.back().assign(static_cast<const char*>(input), static_cast<size_t>(EagerBytes(cached, members, me)));
  NextMessage(payload, /*answer=*/true);
}

void PeerAgreement::AdoptAlone(int64_t id, Request request) { KeepMine(id, std::move(request)); }

bool PeerAgreement::CompleteAlone(int64_t id, std::vector<const char*>* contributions) {
  int64_t round = 0;
  if (!RoundReady(&round)) return false;
  const Response* cached = cache_->Get(id);
  const std::vector<int32_t>* members = cached ? members_view_.Get(cached->process_set_id) : nullptr;
  if (members == nullptr) return false;
  Inbox& slot = InboxOf(round);
  // Every member announced id alone, with its bytes; the other ranks sent nothing but an answer.
  size_t next_member = 0;
  for (int sender = 0; sender < size_; ++sender) {
    const RoundMessage& m = slot.messages[static_cast<size_t>(sender)];
    if (!m.invalid.empty() || !m.joined_sets.empty()) return false;
    const bool member = next_member < members->size() && (*members)[next_member] == sender;
    if (!member) {
      if (!m.hits.empty()) return false;
      continue;
    }
    if (m.hits.size() != 1 || m.hits[0] != id || m.units[0] != id ||
        static_cast<int64_t>(m.data[0].size()) != EagerBytes(*cached, *members, next_member)) {
      return false;
    }
    ++next_member;
  }
  round_done_ = round;
  alone_round_ = round;
  contributions->clear();
  for (int32_t m : *members) contributions->push_back(slot.messages[static_cast<size_t>(m)].data[0].data());
  cache_->Touch(id);
  ++responses_run_;
  return true;
}

void PeerAgreement::EndAlone() {
  OpenInbox(&InboxOf(alone_round_), 0);  // read; its messages keep their storage for a later round
}

}  // namespace horo
