// PeerAgreement::CompleteRound: what every rank runs once it holds every rank's message of a
// round (peer_agreement.h, steps 2 and 3): invalidations and joins first, then the ids every member
// of their set announced, in id order, fused as the coordinator fuses or, for a small collective
// that travelled with its data, as one step from the contributions.
#include "coordinator/peer_agreement.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace horo {

void PeerAgreement::CompleteRound(std::vector<AgreedStep>* run) {
  run->clear();
  const int64_t k = ++round_done_;
  Inbox& slot = InboxOf(k);
  std::vector<RoundMessage>& messages = slot.messages;  // by rank, every one present (RoundReady)
  for (const RoundMessage& m : messages) {
    for (int64_t id : m.invalid) {
      cache_->Forget(id);
      Drop(id);
    }
  }
  for (const RoundMessage& m : messages) {
    for (size_t i = 0; i < m.joined_sets.size(); ++i) {
      const int32_t set = m.joined_sets[i];
      // This rank's announcements in the set that are not sent yet are withdrawn (sent ones are
      // dropped below): they would otherwise be read after the join completed.
      if (m.join_numbers[i] > joins_done_[set] && joining_.insert(set).second) Withdraw(set);
    }
  }
  if (!joining_.empty()) {
    std::vector<int64_t> stopped;
    for (const auto& a : announced_) {
      const Response* c = cache_->Get(a.first);
      if (c == nullptr || joining_.count(c->process_set_id)) stopped.push_back(a.first);
    }
    for (int64_t id : stopped) Drop(id);
  }
  // Read once, and only for an id announced for the first time (a wait's start, for stall reports).
  std::chrono::steady_clock::time_point now{};
  // Ids that ranks announced in different groups (a grouped call of one size on one rank and of
  // another size on the next, under one name): forgotten below, so that every rank sends full
  // requests and the coordinator reports the mismatch, instead of each waiting for the others' group.
  std::vector<int64_t>& regrouped = scratch_regrouped_;
  regrouped.clear();
  for (int sender = 0; sender < size_; ++sender) {
    RoundMessage& m = messages[static_cast<size_t>(sender)];
    // A group's members are consecutive and share their first member's id in units.
    for (size_t begin = 0, end = 0; begin < m.hits.size(); begin = end) {
      end = begin + 1;
      while (end < m.hits.size() && m.units[end] == m.units[begin] && m.units[begin] != m.hits[end]) ++end;
      std::vector<int64_t> unit;
      bool usable = true;
      for (size_t i = begin; i < end; ++i) {
        const Response* c = cache_->Get(m.hits[i]);
        usable = usable && c != nullptr && !joining_.count(c->process_set_id);
        if (end - begin > 1) unit.push_back(m.hits[i]);
      }
      if (!usable) {
        if (sender == rank_) Drop(m.hits[begin]);  // with the rest of its group
        continue;
      }
      for (size_t i = begin; i < end; ++i) {
        Announced& a = AnnouncedEntry(m.hits[i]);
        if (a.ranks.empty()) {
          if (now == std::chrono::steady_clock::time_point{}) now = std::chrono::steady_clock::now();
          a.ranks.assign(static_cast<size_t>(size_), 0);
          a.since = now;
        }
        if (a.unit != unit) {
          if (std::find(a.ranks.begin(), a.ranks.end(), 1) != a.ranks.end()) {
            regrouped.push_back(m.hits[i]);
            regrouped.insert(regrouped.end(), a.unit.begin(), a.unit.end());
            regrouped.insert(regrouped.end(), unit.begin(), unit.end());
          }
          a.unit = unit;
        }
        a.ranks[static_cast<size_t>(sender)] = 1;
        if (!m.data[i].empty()) {
          if (a.data.empty()) a.data.resize(static_cast<size_t>(size_));
          a.data[static_cast<size_t>(sender)] = std::move(m.data[i]);
        }
      }
    }
  }
  for (int64_t id : regrouped) {
    cache_->Forget(id);
    Drop(id);
  }
  OpenInbox(&slot, 0);  // read; its messages keep their storage for a later round
  // Ready: every member announced. Ids only grow, so id order is first-negotiated order, and
  // ready is sorted. The vectors are members, kept between rounds, so that a round in the steady
  // state allocates none of them.
  std::vector<int64_t>& ready = scratch_ready_;
  std::vector<int64_t>& orphaned = scratch_orphaned_;
  ready.clear();
  orphaned.clear();
  for (const auto& a : announced_) {
    const std::vector<int32_t>* members = members_view_.Get(cache_->Get(a.first)->process_set_id);
    if (members == nullptr) {
      orphaned.push_back(a.first);
      continue;
    }
    bool all = true;
    for (int32_t m : *members) all = all && a.second.ranks[static_cast<size_t>(m)];
    if (all) ready.push_back(a.first);
  }
  for (int64_t id : orphaned) Drop(id);
  // A group runs whole (its members are announced in the same messages, so they are ready together
  // unless ranks disagree on its members).
  std::vector<int64_t>& whole = scratch_whole_;
  whole.clear();
  for (int64_t id : ready) {
    bool complete = true;
    const auto entry = announced_.find(id);
    if (entry == announced_.end()) continue;  // dropped with an orphaned group (never, as sets match)
    for (int64_t member : entry->second.unit) {
      complete = complete && std::binary_search(ready.begin(), ready.end(), member) && announced_.count(member);
    }
    if (complete) whole.push_back(id);
  }
  int64_t group_bytes = 0;
  bool fusing = false;  // run->back() is a fused response that may grow
  for (int64_t id : whole) {
    cache_->Touch(id);
    const Response& r = *cache_->Get(id);
    const auto entry = announced_.find(id);  // present: whole is a subset of what is listed
    Announced& a = entry->second;
    static const std::vector<int32_t> kNone;
    const std::vector<int32_t>* found = members_view_.Get(r.process_set_id);
    const std::vector<int32_t>& members = found ? *found : kNone;  // found above; never gone
    // Every member sent its bytes (all ranks see the same messages, so all decide alike). A member
    // of an allgather or an alltoall may have no rows, and a broadcast's members but the root send
    // none: an empty contribution then counts as sent.
    bool with_data = Eager(r) && !a.data.empty();
    for (size_t i = 0; i < members.size() && with_data; ++i) {
      with_data = static_cast<int64_t>(a.data[static_cast<size_t>(members[i])].size()) == EagerBytes(r, members, i);
    }
    const int64_t bytes = r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype));
    if (with_data) {
      AgreedStep step;
      step.contributed = &r;
      step.contributions.reserve(members.size());
      for (int32_t m : members) step.contributions.push_back(std::move(a.data[static_cast<size_t>(m)]));
      run->push_back(std::move(step));
      fusing = false;
    } else if (fusing && Fusable(run->back().fused.front(), r) &&
               group_bytes + bytes <= run->back().fused.front().fusion_threshold_bytes) {
      run->back().fused.push_back(r);
      group_bytes += bytes;
    } else {
      run->push_back(AgreedStep{{r}, {}});
      group_bytes = bytes;
      fusing = true;
    }
    EraseAnnounced(entry);
    auto my = mine_.find(id);
    if (my != mine_.end()) EraseMine(my);
    my_units_.erase(id);
    ++responses_run_;
  }
  if (!deferred_joins_.empty()) ReleaseJoins();
}

}  // namespace horo
