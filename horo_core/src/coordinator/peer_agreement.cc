#include "coordinator/peer_agreement.h"

#include <algorithm>

namespace horo {
namespace {

std::vector<int64_t> Trailing(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
}

// Bytes of one first-dimension row of a tensor of this shape.
int64_t RowBytes(const Response& r) {
  int64_t n = static_cast<int64_t>(DataTypeSize(r.dtype));
  for (size_t i = 1; i < r.shape.size(); ++i) n *= r.shape[i];
  return n;
}

// An alltoall's members: member_dims holds n * n splits.
size_t AlltoallMembers(const Response& r) {
  size_t n = 0;
  while (n * n < r.member_dims.size()) ++n;
  return n * n == r.member_dims.size() ? n : 0;
}

// The rows member m of an alltoall sends in all: the sum of its splits.
int64_t AlltoallRowsOf(const Response& r, size_t n, size_t m) {
  int64_t rows = 0;
  for (size_t j = 0; j < n; ++j) rows += r.member_dims[m * n + j];
  return rows;
}

}  // namespace

PeerAgreement::PeerAgreement(int rank, int size, ResponseCache* cache, ProcessSetTable* sets)
    : rank_(rank), size_(size), cache_(cache), sets_(sets), members_view_(sets) {
  for (Inbox& slot : inbox_) {
    slot.have.assign(static_cast<size_t>(size), 0);
    slot.messages.resize(static_cast<size_t>(size));
  }
}

namespace {
constexpr size_t kMostSpareNodes = 64;
}  // namespace

PeerAgreement::Announced& PeerAgreement::AnnouncedEntry(int64_t id) {
  auto it = announced_.find(id);
  if (it != announced_.end()) return it->second;
  if (spare_announced_.empty()) return announced_[id];
  auto node = std::move(spare_announced_.back());
  spare_announced_.pop_back();
  node.key() = id;  // its Announced was emptied, storage kept, by EraseAnnounced
  return announced_.insert(std::move(node)).position->second;
}

void PeerAgreement::EraseAnnounced(std::map<int64_t, Announced>::iterator it) {
  if (spare_announced_.size() >= kMostSpareNodes) {
    announced_.erase(it);
    return;
  }
  auto node = announced_.extract(it);
  Announced& a = node.mapped();
  a.ranks.clear();
  a.data.clear();
  a.unit.clear();
  spare_announced_.push_back(std::move(node));
}

void PeerAgreement::KeepMine(int64_t id, Request request) {
  auto it = mine_.find(id);
  if (it != mine_.end()) {
    it->second = std::move(request);
  } else if (spare_mine_.empty()) {
    mine_.emplace(id, std::move(request));
  } else {
    auto node = std::move(spare_mine_.back());
    spare_mine_.pop_back();
    node.key() = id;
    node.mapped() = std::move(request);
    mine_.insert(std::move(node));
  }
}

void PeerAgreement::EraseMine(std::map<int64_t, Request>::iterator it) {
  if (spare_mine_.size() >= kMostSpareNodes) {
    mine_.erase(it);
    return;
  }
  spare_mine_.push_back(mine_.extract(it));
}

void PeerAgreement::OpenInbox(Inbox* slot, int64_t round) {
  slot->round = round;
  slot->count = 0;
  std::fill(slot->have.begin(), slot->have.end(), 0);
}

bool PeerAgreement::Offer(Request* offered) {
  const Request& request = *offered;
  if (request.kind != RequestKind::kTensor) return false;
  if (request.op_type == OpType::kJoin) {
    // Tensors this rank announced in the set and that have not run go to the coordinator, which
    // runs them with the joined ranks; the ids are invalidated so that the others' announcements
    // of them fall back too (the join announcement may be read after the join completed). Only
    // the announcements not sent yet are taken back here: a sent one is read by every rank in the
    // round still open, where it may complete a step that the others then run, so this rank
    // keeps it, and if it does not run there, the invalidation drops it on every rank at once in
    // the next round. The join waits for those (ReleaseJoins), so that the coordinator still gets
    // this rank's tensors before its join.
    const int32_t set = request.process_set_id;
    bool sent_pending = false;
    std::vector<int64_t> ids;
    for (const auto& kv : mine_) {
      if (kv.second.process_set_id == set) ids.push_back(kv.first);
    }
    for (int64_t id : ids) {
      next_.invalid.push_back(id);
      if (!mine_.count(id)) continue;  // dropped with its group
      if (std::find(next_.hits.begin(), next_.hits.end(), id) != next_.hits.end()) {
        Drop(id);
      } else {
        sent_pending = true;
      }
    }
    next_.joined_sets.push_back(set);
    next_.join_numbers.push_back(++my_joins_[set]);
    if (!sent_pending) return false;
    deferred_joins_.push_back(std::move(*offered));
    return true;
  }
  // Tensors of a set that a rank is joining go to the coordinator; groups go through OfferGroup.
  if (!ResponseCache::Holds(request.op_type) || request.group_size > 1 || joining_.count(request.process_set_id)) {
    return false;
  }
  const int64_t id = cache_->Find(request.process_set_id, request.name);
  if (id < 0) return false;
  if (!Matches(*cache_->Get(id), request)) {
    // The other members may announce the old id: make them send full requests too, so that the
    // coordinator sees every rank's parameters (and names the mismatch, if there is one).
    next_.invalid.push_back(id);
    return false;
  }
  Announce(id, std::move(*offered), id);
  return true;
}

bool PeerAgreement::OfferGroup(const std::vector<Request>& members) {
  std::vector<int64_t> ids;
  bool all = true;
  for (const Request& r : members) {
    const bool usable =
        r.kind == RequestKind::kTensor && ResponseCache::Holds(r.op_type) && !joining_.count(r.process_set_id);
    const int64_t id = usable ? cache_->Find(r.process_set_id, r.name) : -1;
    if (id >= 0) ids.push_back(id);
    all = all && id >= 0 && Matches(*cache_->Get(id), r);
  }
  if (!all) {
    // The whole group goes to the coordinator; ranks that announced its members (their group still
    // matched) must send theirs too.
    for (int64_t id : ids) next_.invalid.push_back(id);
    return false;
  }
  for (size_t i = 0; i < members.size(); ++i) {
    Announce(ids[i], members[i], ids[0]);
    my_units_[ids[i]] = ids;
  }
  return true;
}

void PeerAgreement::Announce(int64_t id, Request request, int64_t unit) {
  const void* input = request.input;
  const int32_t set = request.process_set_id;
  KeepMine(id, std::move(request));
  next_.hits.push_back(id);
  next_.units.push_back(unit);
  const Response& cached = *cache_->Get(id);
  int64_t eager = -1;  // on the data plane, for every rank (see CompleteRound)
  if (Eager(cached)) {
    const std::vector<int32_t>* members = members_view_.Get(set);  // this rank is one (Matches)
    const auto me = members ? std::find(members->begin(), members->end(), rank_) : std::vector<int32_t>::const_iterator();
    if (members && me != members->end()) {
      eager = EagerBytes(cached, *members, static_cast<size_t>(me - members->begin()));
    }
  }
  if (eager > 0 && input != nullptr && next_data_bytes_ + eager <= kEagerBytesPerMessage) {
    next_.data.emplace_back(static_cast<const char*>(input), static_cast<size_t>(eager));
    next_data_bytes_ += eager;
  } else {
    next_.data.emplace_back();  // none, or on the data plane
  }
}

bool PeerAgreement::Eager(const Response& r) {
  if (r.kind != ResponseKind::kOp || r.on_device || !r.joined_ranks.empty()) return false;
  if (r.op_type == OpType::kAllreduce) {
    return r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype)) <= std::min(kEagerBytes, r.small_message_bytes);
  }
  if (r.op_type == OpType::kReducescatter) {  // every member's whole input; each keeps its part
    return !r.shape.empty() && r.reduce_op != ReduceOp::kAdasum &&
           r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype)) <= std::min(kEagerBytes, r.small_message_bytes);
  }
  if (r.op_type == OpType::kAllgather && !r.shape.empty()) {
    int64_t rows = 0;
    for (int64_t d : r.member_dims) rows += d;
    return rows * RowBytes(r) <= kEagerBytes;
  }
  if (r.op_type == OpType::kAlltoall && !r.shape.empty()) {  // every member's whole input; each takes its rows
    const size_t n = AlltoallMembers(r);
    if (n == 0) return false;
    for (size_t m = 0; m < n; ++m) {
      if (AlltoallRowsOf(r, n, m) * RowBytes(r) > kEagerBytes) return false;
    }
    return true;
  }
  if (r.op_type == OpType::kBroadcast) {  // the root's whole tensor; every member copies it
    return r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype)) <= kEagerBytes;
  }
  return false;
}

int64_t PeerAgreement::EagerBytes(const Response& r, const std::vector<int32_t>& members, size_t member_index) {
  if (r.op_type == OpType::kAllgather) {
    return member_index < r.member_dims.size() ? r.member_dims[member_index] * RowBytes(r) : 0;
  }
  if (r.op_type == OpType::kAlltoall) {
    const size_t n = AlltoallMembers(r);
    return member_index < n ? AlltoallRowsOf(r, n, member_index) * RowBytes(r) : 0;
  }
  if (r.op_type == OpType::kBroadcast && (member_index >= members.size() || members[member_index] != r.root_rank)) {
    return 0;
  }
  return r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype));
}

bool PeerAgreement::Matches(const Response& c, const Request& r) const {
  // A refusal never runs from the cache: the others must send full requests, for the coordinator
  // to fail the tensor everywhere.
  if (!r.refusal.empty()) return false;
  if (c.kind != ResponseKind::kOp || c.op_type != r.op_type || c.dtype != r.dtype ||
      c.on_device != (r.device != 0) || !c.joined_ranks.empty()) {
    return false;
  }
  const std::vector<int32_t>* found = members_view_.Get(r.process_set_id);
  if (found == nullptr) return false;
  const std::vector<int32_t>& members = *found;
  const auto me = std::find(members.begin(), members.end(), rank_);
  if (me == members.end()) return false;
  const size_t index = static_cast<size_t>(me - members.begin());
  const size_t n = members.size();
  switch (r.op_type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      return c.reduce_op == r.reduce_op && c.prescale_factor == r.prescale_factor &&
             c.postscale_factor == r.postscale_factor && c.shape == r.shape;
    case OpType::kBroadcast:
      return c.root_rank == r.root_rank && c.shape == r.shape;
    case OpType::kAllgather:
      return !r.shape.empty() && c.member_dims.size() == n && c.member_dims[index] == r.shape[0] &&
             Trailing(c.shape) == Trailing(r.shape) && c.shape.size() == r.shape.size();
    case OpType::kAlltoall: {
      if (r.shape.empty() || c.member_dims.size() != n * n || c.shape.size() != r.shape.size() ||
          Trailing(c.shape) != Trailing(r.shape)) {
        return false;
      }
      const int64_t rows = r.shape[0];
      for (size_t j = 0; j < n; ++j) {
        const int64_t want = r.splits.empty() ? rows / static_cast<int64_t>(n) : r.splits[j];
        if (r.splits.size() != 0 && r.splits.size() != n) return false;
        if (c.member_dims[index * n + j] != want) return false;
      }
      if (r.splits.empty()) return rows % static_cast<int64_t>(n) == 0;
      int64_t sum = 0;
      for (int64_t v : r.splits) sum += v;
      return sum == rows;  // else the coordinator names the bad splits
    }
    default:
      return false;
  }
}

Status PeerAgreement::Receive(int peer, const std::string& payload) {
  // The message is parsed straight into its round's inbox.
  int64_t round = 0;
  if (!RoundOfMessage(payload, &round)) {
    return Status::Internal("malformed round message from rank " + std::to_string(peer) + " (" +
                            std::to_string(payload.size()) + " bytes)");
  }
  // A peer is at most one round ahead of this rank's unfinished one (it needs this rank's message
  // to complete it). The inbox of that round holds an older round only if it never completed.
  const bool in_step = peer >= 0 && peer < size_ && peer != rank_ && round > round_done_ && round <= round_done_ + 2;
  Inbox* slot = in_step ? &InboxOf(round) : nullptr;
  if (slot != nullptr && slot->round != round) {
    if (slot->count == 0) {
      OpenInbox(slot, round);
    } else {
      slot = nullptr;
    }
  }
  if (slot == nullptr || slot->have[peer]) {
    return Status::Internal("round message " + std::to_string(round) + " from rank " + std::to_string(peer) +
                            " is out of step (rank " + std::to_string(rank_) + " completed round " +
                            std::to_string(round_done_) + ")");
  }
  Status parsed = ParseRoundMessage(payload, &slot->messages[peer]);
  if (!parsed.ok()) return Status::Internal(parsed.message() + " from rank " + std::to_string(peer));
  slot->have[peer] = 1;
  ++slot->count;
  return Status::OK();
}

bool PeerAgreement::NextMessage(std::string* payload, bool answer) {
  const int64_t k = round_done_ + 1;
  if (round_sent_ >= k) return false;
  Inbox& slot = InboxOf(k);
  const bool asked = slot.round == k && slot.count > 0;
  if (next_.empty() && (!asked || !answer)) return false;
  next_.round = k;
  SerializeRoundMessage(next_, payload);
  if (slot.round != k) OpenInbox(&slot, k);  // its last round completed
  // This rank's message joins the others; next_ takes over the storage of the one it replaces.
  std::swap(slot.messages[rank_], next_);
  slot.have[rank_] = 1;
  ++slot.count;
  next_.Clear();
  next_data_bytes_ = 0;
  round_sent_ = k;
  return true;
}

bool PeerAgreement::AnswerOwed() const {
  const int64_t k = round_done_ + 1;
  const Inbox& slot = InboxOf(k);
  return round_sent_ < k && slot.round == k && slot.count > 0;
}

bool PeerAgreement::RoundReady(int64_t* round) const {
  if (round_sent_ <= round_done_) return false;
  const Inbox& slot = InboxOf(round_done_ + 1);
  if (slot.round != round_done_ + 1 || slot.count < size_) return false;
  *round = slot.round;
  return true;
}

void PeerAgreement::Drop(int64_t id) {
  std::vector<int64_t> unit;
  auto a = announced_.find(id);
  if (a != announced_.end()) {
    unit = a->second.unit;
    EraseAnnounced(a);
  }
  auto u = my_units_.find(id);
  if (u != my_units_.end()) {
    if (unit.empty()) unit = u->second;
    my_units_.erase(u);
  }
  auto it = mine_.find(id);
  if (it != mine_.end()) {
    // Not sent yet: it leaves the next message too.
    for (size_t i = 0; i < next_.hits.size(); ++i) {
      if (next_.hits[i] != id) continue;
      next_data_bytes_ -= static_cast<int64_t>(next_.data[i].size());
      next_.hits.erase(next_.hits.begin() + static_cast<std::ptrdiff_t>(i));
      next_.data.erase(next_.data.begin() + static_cast<std::ptrdiff_t>(i));
      next_.units.erase(next_.units.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
    fallbacks_.push_back(std::move(it->second));
    EraseMine(it);
  }
  for (int64_t member : unit) {
    if (member != id && (announced_.count(member) || mine_.count(member))) Drop(member);
  }
}

void PeerAgreement::Forget(int64_t id) {
  Drop(id);
  ReleaseJoins();
}

void PeerAgreement::ReleaseJoins() {
  for (auto it = deferred_joins_.begin(); it != deferred_joins_.end();) {
    bool waits = false;
    for (const auto& kv : mine_) waits = waits || kv.second.process_set_id == it->process_set_id;
    if (waits) {
      ++it;
      continue;
    }
    fallbacks_.push_back(std::move(*it));  // after the tensors that fell back before it
    it = deferred_joins_.erase(it);
  }
}

std::vector<int64_t> PeerAgreement::Withdraw(int32_t process_set_id) {
  std::vector<int64_t> ids;
  for (const auto& kv : mine_) {
    if (kv.second.process_set_id == process_set_id) ids.push_back(kv.first);
  }
  for (int64_t id : ids) Drop(id);
  return ids;
}

void PeerAgreement::JoinDone(int32_t process_set_id) {
  ++joins_done_[process_set_id];
  joining_.erase(process_set_id);
}

std::vector<Request> PeerAgreement::TakeFallbacks() {
  std::vector<Request> out;
  out.swap(fallbacks_);
  return out;
}

std::vector<int32_t> PeerAgreement::OpenRoundOwedBy() const {
  std::vector<int32_t> owed;
  const Inbox& open = InboxOf(round_done_ + 1);
  if (open.round != round_done_ + 1 || open.count == 0) return owed;
  for (int r = 0; r < size_; ++r) {
    if (!open.have[static_cast<size_t>(r)]) owed.push_back(r);
  }
  return owed;
}

std::vector<StalledTensor> PeerAgreement::Waiting() const {
  std::vector<StalledTensor> out;
  const auto now = std::chrono::steady_clock::now();
  // A round that some rank never sends its message for never completes, so what the others
  // announced in it never reaches announced_: counting only announced_, a stopped rank went
  // unnamed, and the ranks that had announced late in the round before were blamed. The open
  // round's announcements count too, and once it has been open for kRoundHeldSeconds (longer than
  // any round of a live job), the ranks it waits for are the ones missing for every tensor
  // waiting: the others may have submitted a tensor whose announcement waits for the next round.
  const Inbox& open = InboxOf(round_done_ + 1);
  const std::vector<int32_t> owed = OpenRoundOwedBy();
  if (owed.empty()) {
    held_round_ = 0;
  } else if (held_round_ != open.round) {
    held_round_ = open.round;
    held_since_ = now;
  }
  const bool held = !owed.empty() && now - held_since_ >= std::chrono::duration<double>(kRoundHeldSeconds);
  std::map<int64_t, std::vector<char>> in_open;  // id -> by rank: announced it in the open round
  if (!owed.empty()) {
    for (int r = 0; r < size_; ++r) {
      if (!open.have[static_cast<size_t>(r)]) continue;
      for (int64_t id : open.messages[static_cast<size_t>(r)].hits) {
        std::vector<char>& ranks = in_open[id];
        if (ranks.empty()) ranks.assign(static_cast<size_t>(size_), 0);
        ranks[static_cast<size_t>(r)] = 1;
      }
    }
  }
  // This rank's announcements that wait for the open round to complete before they are sent
  // (the tensors it submitted after sending its message) wait for the same ranks.
  std::set<int64_t> unsent;
  if (!owed.empty()) unsent.insert(next_.hits.begin(), next_.hits.end());
  std::set<int64_t> ids(unsent);
  for (const auto& a : announced_) ids.insert(a.first);
  for (const auto& o : in_open) ids.insert(o.first);
  for (int64_t id : ids) {
    const Response* c = cache_->Get(id);
    std::vector<int32_t> members;
    if (c == nullptr || !sets_->Members(c->process_set_id, &members)) continue;
    const auto a = announced_.find(id);
    const auto o = in_open.find(id);
    std::vector<char> missing(static_cast<size_t>(size_), 0);
    if (held) {
      for (int32_t r : owed) missing[static_cast<size_t>(r)] = 1;
    } else {
      for (int32_t m : members) {
        const size_t i = static_cast<size_t>(m);
        const bool before = a != announced_.end() && !a->second.ranks.empty() && a->second.ranks[i];
        missing[i] = !before && !(o != in_open.end() && o->second[i]) && !(m == rank_ && unsent.count(id));
      }
    }
    StalledTensor t;
    for (int r = 0; r < size_; ++r) {
      if (missing[static_cast<size_t>(r)]) t.missing_ranks.push_back(r);
    }
    if (t.missing_ranks.empty()) continue;  // only the round in flight holds it, for now
    t.process_set_id = c->process_set_id;
    t.name = c->name;
    const auto since = a != announced_.end() ? a->second.since : held_since_;
    t.waited_seconds = std::chrono::duration<double>(now - since).count();
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace horo
