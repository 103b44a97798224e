#include "coordinator/peer_agreement.h"

#include <algorithm>

#include "coordinator/wire.h"

namespace horo {
namespace {

constexpr uint8_t kRoundTag = 'R';

std::vector<int64_t> Trailing(const std::vector<int64_t>& shape) {
  return std::vector<int64_t>(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
}

}  // namespace

bool IsRoundMessage(const std::string& payload) {
  return !payload.empty() && static_cast<uint8_t>(payload[0]) == kRoundTag;
}

std::string SerializeRoundMessage(const RoundMessage& message) {
  WireWriter w;
  size_t data_bytes = 0;
  for (const std::string& d : message.data) data_bytes += d.size();
  w.Reserve(1 + 8 + 8 * 6 + 8 * 3 * message.hits.size() + data_bytes + 8 * message.invalid.size() +
            12 * message.joined_sets.size());
  w.U8(kRoundTag);
  w.I64(message.round);
  w.I64Vec(message.hits);
  for (size_t i = 0; i < message.hits.size(); ++i) w.Str(i < message.data.size() ? message.data[i] : std::string());
  if (message.units.size() == message.hits.size()) {
    w.I64Vec(message.units);
  } else {  // a hit without a unit is a group of its own
    std::vector<int64_t> units = message.units;
    for (size_t i = units.size(); i < message.hits.size(); ++i) units.push_back(message.hits[i]);
    w.I64Vec(units);
  }
  w.I64Vec(message.invalid);
  w.I32Vec(message.joined_sets);
  w.I64Vec(message.join_numbers);
  return w.Take();
}

Status ParseRoundMessage(const std::string& bytes, RoundMessage* out) {
  WireReader rd(bytes);
  RoundMessage m;
  const uint8_t tag = rd.U8();
  m.round = rd.I64();
  m.hits = rd.I64Vec();
  if (rd.ok()) {
    m.data.resize(m.hits.size());
    for (std::string& d : m.data) d = rd.Str();
  }
  m.units = rd.I64Vec();
  if (m.units.size() != m.hits.size()) return Status::Internal("malformed round message: groups");
  m.invalid = rd.I64Vec();
  m.joined_sets = rd.I32Vec();
  m.join_numbers = rd.I64Vec();
  if (m.join_numbers.size() != m.joined_sets.size()) return Status::Internal("malformed round message: joins");
  if (!rd.ok() || !rd.AtEnd() || tag != kRoundTag || m.round < 1) return Status::Internal("malformed round message");
  *out = std::move(m);
  return Status::OK();
}

PeerAgreement::PeerAgreement(int rank, int size, ResponseCache* cache, ProcessSetTable* sets)
    : rank_(rank), size_(size), cache_(cache), sets_(sets) {}

bool PeerAgreement::Offer(const Request& request) {
  if (request.kind != RequestKind::kTensor) return false;
  if (request.op_type == OpType::kJoin) {
    // Tensors this rank announced in the set and that have not run go to the coordinator, which
    // runs them with the joined ranks; the ids are invalidated so that the others' announcements
    // of them fall back too (the join announcement may be read after the join completed).
    for (int64_t id : Withdraw(request.process_set_id)) next_.invalid.push_back(id);
    next_.joined_sets.push_back(request.process_set_id);
    next_.join_numbers.push_back(++my_joins_[request.process_set_id]);
    return false;
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
  Announce(id, request, id);
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

void PeerAgreement::Announce(int64_t id, const Request& request, int64_t unit) {
  mine_[id] = request;
  next_.hits.push_back(id);
  next_.units.push_back(unit);
  const int64_t eager = EagerBytes(*cache_->Get(id));
  if (eager > 0 && request.input != nullptr && next_data_bytes_ + eager <= kEagerBytesPerMessage) {
    next_.data.emplace_back(static_cast<const char*>(request.input), static_cast<size_t>(eager));
    next_data_bytes_ += eager;
  } else {
    next_.data.emplace_back();  // on the data plane, for every rank (see CompleteRound)
  }
}

int64_t PeerAgreement::EagerBytes(const Response& r) {
  if (r.kind != ResponseKind::kOp || r.op_type != OpType::kAllreduce || r.on_device || !r.joined_ranks.empty()) {
    return 0;
  }
  const int64_t bytes = r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype));
  return bytes <= std::min(kEagerBytes, r.small_message_bytes) ? bytes : 0;
}

bool PeerAgreement::Matches(const Response& c, const Request& r) const {
  if (c.kind != ResponseKind::kOp || c.op_type != r.op_type || c.dtype != r.dtype ||
      c.on_device != (r.device != 0) || !c.joined_ranks.empty()) {
    return false;
  }
  std::vector<int32_t>& members = scratch_match_members_;
  if (!sets_->Members(r.process_set_id, &members)) return false;
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
  RoundMessage m;
  HORO_RETURN_IF_ERROR(ParseRoundMessage(payload, &m));
  // A peer is at most one round ahead of this rank's unfinished one (it needs this rank's message
  // to complete it).
  if (peer < 0 || peer >= size_ || peer == rank_ || m.round <= round_done_ || m.round > round_done_ + 2 ||
      inbox_[m.round].count(peer)) {
    return Status::Internal("round message " + std::to_string(m.round) + " from rank " + std::to_string(peer) +
                            " is out of step (rank " + std::to_string(rank_) + " completed round " +
                            std::to_string(round_done_) + ")");
  }
  inbox_[m.round][peer] = std::move(m);
  return Status::OK();
}

bool PeerAgreement::NextMessage(std::string* payload) {
  const int64_t k = round_done_ + 1;
  if (round_sent_ >= k) return false;
  auto asked = inbox_.find(k);
  if (next_.empty() && asked == inbox_.end()) return false;
  next_.round = k;
  *payload = SerializeRoundMessage(next_);
  inbox_[k][rank_] = std::move(next_);
  next_ = RoundMessage();
  next_data_bytes_ = 0;
  round_sent_ = k;
  return true;
}

bool PeerAgreement::RoundReady(int64_t* round) const {
  if (round_sent_ <= round_done_) return false;
  auto it = inbox_.find(round_done_ + 1);
  if (it == inbox_.end() || static_cast<int>(it->second.size()) < size_) return false;
  *round = it->first;
  return true;
}

void PeerAgreement::CompleteRound(std::vector<AgreedStep>* run) {
  run->clear();
  const int64_t k = ++round_done_;
  std::map<int, RoundMessage> messages = std::move(inbox_[k]);
  inbox_.erase(k);
  for (const auto& kv : messages) {
    for (int64_t id : kv.second.invalid) {
      cache_->Forget(id);
      Drop(id);
    }
  }
  for (const auto& kv : messages) {
    for (size_t i = 0; i < kv.second.joined_sets.size(); ++i) {
      const int32_t set = kv.second.joined_sets[i];
      // This rank's announcements in the set that are not sent yet are withdrawn (sent ones are
      // dropped below): they would otherwise be read after the join completed.
      if (kv.second.join_numbers[i] > joins_done_[set] && joining_.insert(set).second) Withdraw(set);
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
  const auto now = std::chrono::steady_clock::now();
  for (auto& kv : messages) {
    RoundMessage& m = kv.second;
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
        if (kv.first == rank_) Drop(m.hits[begin]);  // with the rest of its group
        continue;
      }
      for (size_t i = begin; i < end; ++i) {
        Announced& a = announced_[m.hits[i]];
        if (a.ranks.empty()) a.since = now;
        a.ranks.insert(kv.first);
        a.unit = unit;
        if (!m.data[i].empty()) a.data[kv.first] = std::move(m.data[i]);
      }
    }
  }
  // Ready: every member announced. Ids only grow, so id order is first-negotiated order, and
  // ready is sorted. The vectors are members, kept between rounds, so that a round in the steady
  // state allocates none of them.
  std::vector<int64_t>& ready = scratch_ready_;
  std::vector<int64_t>& orphaned = scratch_orphaned_;
  std::vector<int32_t>& members = scratch_members_;
  ready.clear();
  orphaned.clear();
  for (const auto& a : announced_) {
    if (!sets_->Members(cache_->Get(a.first)->process_set_id, &members)) {
      orphaned.push_back(a.first);
      continue;
    }
    bool all = true;
    for (int32_t m : members) all = all && a.second.ranks.count(m) > 0;
    if (all) ready.push_back(a.first);
  }
  for (int64_t id : orphaned) Drop(id);
  // A group runs whole (its members are announced in the same messages, so they are ready together
  // unless ranks disagree on its members).
  std::vector<int64_t>& whole = scratch_whole_;
  whole.clear();
  for (int64_t id : ready) {
    bool complete = true;
    for (int64_t member : announced_[id].unit) {
      complete = complete && std::binary_search(ready.begin(), ready.end(), member);
    }
    if (complete) whole.push_back(id);
  }
  int64_t group_bytes = 0;
  bool fusing = false;  // run->back() is a fused response that may grow
  for (int64_t id : whole) {
    cache_->Touch(id);
    const Response& r = *cache_->Get(id);
    Announced& a = announced_[id];
    if (!sets_->Members(r.process_set_id, &members)) members.clear();  // passed above; never stale
    // Every member sent its bytes (all ranks see the same messages, so all decide alike).
    const int64_t eager = EagerBytes(r);
    bool with_data = eager > 0;
    for (int32_t m : members) {
      auto d = a.data.find(m);
      with_data = with_data && d != a.data.end() && static_cast<int64_t>(d->second.size()) == eager;
    }
    const int64_t bytes = r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype));
    if (with_data) {
      AgreedStep step;
      step.fused.push_back(r);
      for (int32_t m : members) step.contributions.push_back(std::move(a.data[m]));
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
    announced_.erase(id);
    mine_.erase(id);
    my_units_.erase(id);
    ++responses_run_;
  }
}

void PeerAgreement::Drop(int64_t id) {
  std::vector<int64_t> unit;
  auto a = announced_.find(id);
  if (a != announced_.end()) {
    unit = a->second.unit;
    announced_.erase(a);
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
    mine_.erase(it);
  }
  for (int64_t member : unit) {
    if (member != id && (announced_.count(member) || mine_.count(member))) Drop(member);
  }
}

void PeerAgreement::Forget(int64_t id) { Drop(id); }

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

std::vector<StalledTensor> PeerAgreement::Waiting() const {
  std::vector<StalledTensor> out;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& a : announced_) {
    const Response* c = cache_->Get(a.first);
    std::vector<int32_t> members;
    if (c == nullptr || !sets_->Members(c->process_set_id, &members)) continue;
    StalledTensor t;
    t.process_set_id = c->process_set_id;
    t.name = c->name;
    t.waited_seconds = std::chrono::duration<double>(now - a.second.since).count();
    for (int32_t m : members) {
      if (!a.second.ranks.count(m)) t.missing_ranks.push_back(m);
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace horo
