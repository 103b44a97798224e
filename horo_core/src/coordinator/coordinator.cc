#include "coordinator/coordinator.h"

#include <algorithm>
#include <sstream>

#include "common/logging.h"
#include "coordinator/request_checks.h"
#include "coordinator/wire.h"

namespace horo {

using request_checks::ErrorResponse;
using request_checks::FindMismatch;
using request_checks::GroupOf;
using request_checks::GroupsDiffer;
using request_checks::MembersText;

Coordinator::Coordinator(const Config& config, int world_size, ProcessSetTable* sets, ResponseCache* cache,
                         Timeline* timeline)
    : config_(config),
      fusion_threshold_bytes_(config.fusion_threshold_bytes),
      world_size_(world_size),
      sets_(sets),
      cache_(cache),
      timeline_(timeline),
      stall_inspector_(config.stall_check_time_seconds, config.stall_shutdown_time_seconds,
                       config.stall_check_disable, config.VariableName("STALL_SHUTDOWN_TIME_SECONDS")) {}

void Coordinator::AddRequests(int rank, const RequestList& list) {
  changed_ = true;
  if (list.shutdown) shutdown_requested_.insert(rank);
  if (!list.failure.empty()) failures_[rank] = list.failure;
  timeline_->Receive(rank, list.timeline);
  for (const Request& r : list.requests) {
    if (r.kind == RequestKind::kTensor) {
      AddTensorRequest(r);
    } else {
      AddSetChange(r);
    }
  }
}

void Coordinator::PeerLost(int rank, const std::string& reason) {
  lost_.push_back(rank);
  if (!reason.empty()) cut_off_.emplace(rank, reason);
  changed_ = true;
}

bool Coordinator::HasDeadRank() const {
  for (int32_t r : lost_) {
    if (!shutdown_requested_.count(r) && !failures_.count(r)) return true;
  }
  return false;
}

std::string Coordinator::DescribeUnexpectedLosses() const {
  std::ostringstream dead;
  std::ostringstream failed;
  for (int32_t r : lost_) {
    if (shutdown_requested_.count(r)) continue;
    auto f = failures_.find(r);
    auto cut = cut_off_.find(r);
    if (cut != cut_off_.end()) {
      failed << (failed.tellp() > 0 ? "; " : "") << cut->second;
    } else if (f == failures_.end()) {
      dead << (dead.tellp() > 0 ? " " : "rank ") << r;
    } else {
      failed << (failed.tellp() > 0 ? "; " : "") << "rank " << r << " failed: " << f->second;
    }
  }
  std::string text = dead.str();
  if (!text.empty()) text += " exited or lost its connection without calling shutdown(); the job cannot continue";
  if (failed.tellp() > 0) text += (text.empty() ? "" : ". Then ") + failed.str();
  return text;
}

void Coordinator::AddTensorRequest(const Request& request) {
  SetState& state = states_[request.process_set_id];
  if (request.op_type == OpType::kJoin) {
    if (std::find(state.joined.begin(), state.joined.end(), request.rank) == state.joined.end()) {
      state.joined.push_back(request.rank);
    }
    std::vector<std::string> names;
    for (const auto& kv : state.pending) names.push_back(kv.first);
    for (const std::string& name : names) MarkReadyIfComplete(request.process_set_id, name);
    return;
  }
  Pending& pending = state.pending[request.name];
  timeline_->NegotiationRequest(request, pending.by_rank);
  if (pending.by_rank.empty()) pending.first_seen = std::chrono::steady_clock::now();
  pending.by_rank[request.rank] = request;
  MarkReadyIfComplete(request.process_set_id, request.name);
}

void Coordinator::AddSetChange(const Request& request) {
  Pending& pending = states_[0].pending[request.name];
  if (pending.by_rank.empty()) pending.first_seen = std::chrono::steady_clock::now();
  pending.by_rank[request.rank] = request;
  if (static_cast<int>(pending.by_rank.size()) == world_size_ && !pending.queued_ready) {
    pending.queued_ready = true;
    ready_.emplace_back(0, request.name);
  }
}

void Coordinator::MarkReadyIfComplete(int32_t set_id, const std::string& name) {
  SetState& state = states_[set_id];
  Pending& pending = state.pending[name];
  if (pending.queued_ready || pending.by_rank.empty()) return;
  if (pending.by_rank.begin()->second.kind != RequestKind::kTensor) return;
  std::vector<int32_t> members;
  if (sets_->Members(set_id, &members)) {
    for (int32_t m : members) {
      bool joined = std::find(state.joined.begin(), state.joined.end(), m) != state.joined.end();
      if (!joined && !pending.by_rank.count(m)) return;
    }
  }
  // An unknown set is "ready" at once so that Construct reports it.
  pending.queued_ready = true;
  ready_.emplace_back(set_id, name);
}

std::string Coordinator::Signature(const Pending& pending, const std::vector<int32_t>& joined) const {
  WireWriter w;
  w.I32Vec(joined);
  for (const auto& kv : pending.by_rank) WriteRequest(w, kv.second);
  return w.Take();
}

bool Coordinator::BuildResponses(ResponseList* out) {
  // Nothing arrived since the last build that found nothing: it would find nothing again (most
  // passes, once steady-state steps are agreed between the ranks).
  if (shut_down_ || !changed_) return false;
  *out = ResponseList();
  // Groups are emitted only once every member is ready.
  std::map<std::pair<int32_t, std::string>, int> ready_in_group;
  for (const auto& key : ready_) {
    const auto& pending = states_[key.first].pending;
    auto it = pending.find(key.second);
    if (it == pending.end() || it->second.by_rank.empty()) continue;
    const Request& first = it->second.by_rank.begin()->second;
    if (first.group_size > 1) ready_in_group[{key.first, first.group_leader}]++;
  }
  std::vector<ResponsePart> parts;
  std::vector<Response> resolved;
  std::vector<std::pair<int32_t, std::string>> deferred;
  // Set changes take effect when the ranks apply this list, so the table still shows the old sets:
  // track this round's changes to answer later parts of the same round consistently.
  std::set<int32_t> removed;
  std::set<std::vector<int32_t>> added;
  for (const auto& key : ready_) {
    SetState& state = states_[key.first];
    auto pending_it = state.pending.find(key.second);
    if (pending_it == state.pending.end()) continue;  // failed with its group (FailMismatchedGroups)
    Pending& pending = pending_it->second;
    const Request& first = pending.by_rank.begin()->second;
    if (first.kind == RequestKind::kTensor && GroupsDiffer(pending.by_rank)) {
      std::string message;
      FindMismatch(pending.by_rank, "grouped calls", GroupOf, &message);
      FailMismatchedGroups(key.first, key.second, message, &parts, &resolved);
      // Members of those groups deferred earlier in this round are gone too.
      deferred.erase(std::remove_if(deferred.begin(), deferred.end(),
                                    [this](const std::pair<int32_t, std::string>& k) {
                                      return states_[k.first].pending.count(k.second) == 0;
                                    }),
                     deferred.end());
      continue;
    }
    if (first.group_size > 1 && ready_in_group[{key.first, first.group_leader}] < first.group_size) {
      deferred.push_back(key);
      continue;
    }
    ResponsePart part;
    if (first.kind != RequestKind::kTensor) {
      part.response = ConstructSetChange(key.second, pending);
      Response& r = part.response;
      if (r.kind == ResponseKind::kProcessSetAdd && !added.insert(r.ranks).second) {
        r = ErrorResponse(0, key.second, HORO_ERR_INVALID_ARGUMENT,
                          "a process set with ranks " + MembersText(r.ranks) + " is being added already");
      } else if (r.kind == ResponseKind::kProcessSetRemove && !removed.insert(r.process_set_id).second) {
        r = ErrorResponse(0, key.second, HORO_ERR_INVALID_ARGUMENT,
                          "process set " + std::to_string(r.process_set_id) + " is being removed already");
      } else if (r.kind == ResponseKind::kProcessSetRemove) {
        cache_->EraseProcessSet(r.process_set_id, &out->evicted_ids);
        ResolveRemovedSet(r.process_set_id, &parts, &resolved, &deferred);
      }
    } else {
      std::vector<int32_t> members;
      if (!removed.count(key.first)) sets_->Members(key.first, &members);
      const bool cacheable = !members.empty() && cache_->enabled() && ResponseCache::Holds(first.op_type) &&
                             state.joined.empty();
      std::string signature = cacheable ? Signature(pending, state.joined) : std::string();
      int64_t id = cacheable ? cache_->Lookup(key.first, key.second, signature) : -1;
      if (id >= 0) {
        part.cache_id = id;
        part.response = *cache_->Get(id);
      } else {
        part.response = Construct(key.first, key.second, pending, members, state.joined);
        if (cacheable && part.response.kind == ResponseKind::kOp) {
          part.assign_id = cache_->Put(part.response, signature, &out->evicted_ids);
        }
      }
      timeline_->NegotiationEnd(key.first, key.second);
    }
    resolved.push_back(part.response);
    parts.push_back(std::move(part));
    state.pending.erase(pending_it);
  }
  ready_ = std::move(deferred);

  // Joins complete once every member of the set has joined. A removed set's state goes once its
  // last tensors are answered: a job that adds and removes sets would otherwise walk (here and in
  // CheckStalls) and keep one entry for every set it ever had.
  for (auto it = states_.begin(); it != states_.end();) {
    SetState& state = it->second;
    if (state.pending.empty() && state.joined.empty() && it->first != 0 && !sets_->Exists(it->first)) {
      it = states_.erase(it);
      continue;
    }
    std::vector<int32_t> members;
    if (state.joined.empty() || !sets_->Members(it->first, &members) || state.joined.size() < members.size()) {
      ++it;
      continue;
    }
    ResponsePart part;
    part.response.kind = ResponseKind::kOp;
    part.response.op_type = OpType::kJoin;
    part.response.process_set_id = it->first;
    part.response.name = "join";
    part.response.last_joined_rank = state.joined.back();
    state.joined.clear();
    resolved.push_back(part.response);
    parts.push_back(std::move(part));
    ++it;
  }
  Fuse(std::move(parts), resolved, out);

  AppendShutdownIfDue(out);
  // Tensors of a set removed in this round are answered in the next; a group still waiting for
  // members needs new requests.
  changed_ = !removed.empty();
  return !out->fused.empty() || !out->evicted_ids.empty();
}

bool Coordinator::BuildFailureShutdown(ResponseList* out) {
  if (shut_down_ || (!stall_shutdown_ && (lost_.empty() || DescribeUnexpectedLosses().empty()))) return false;
  *out = ResponseList();
  return AppendShutdownIfDue(out);
}

bool Coordinator::AppendShutdownIfDue(ResponseList* out) {
  const std::string losses = lost_.empty() ? std::string() : DescribeUnexpectedLosses();
  if (!losses.empty()) {
    EmitShutdown(HORO_ERR_PEER_LOST, losses, out);
  } else if (stall_shutdown_) {
    EmitShutdown(HORO_ERR_SHUT_DOWN, stall_message_, out);
  } else if (!shutdown_requested_.empty()) {
    std::ostringstream os;
    os << "Horo has been shut down: rank " << *shutdown_requested_.begin()
       << " called shutdown() or finished: its script ended, or raised an exception (which that rank's log "
          "shows). Collectives submitted after one of the ranks finished cannot complete";
    EmitShutdown(HORO_ERR_SHUT_DOWN, os.str(), out);
  } else {
    return false;
  }
  return true;
}

void Coordinator::FailMismatchedGroups(int32_t set_id, const std::string& name, const std::string& message,
                                       std::vector<ResponsePart>* parts, std::vector<Response>* resolved) {
  SetState& state = states_[set_id];
  std::set<std::string> leaders;
  for (const auto& kv : state.pending[name].by_rank) {
    if (kv.second.group_size > 1) leaders.insert(kv.second.group_leader);
  }
  // A rank submits all members of a grouped call in one request list, so by the time one member
  // is ready everywhere, every member of each rank's group has arrived.
  for (auto it = state.pending.begin(); it != state.pending.end();) {
    bool member = it->first == name;
    for (const auto& kv : it->second.by_rank) {
      member = member || (kv.second.group_size > 1 && leaders.count(kv.second.group_leader) > 0);
    }
    if (!member) {
      ++it;
      continue;
    }
    ResponsePart part;
    part.response = ErrorResponse(set_id, it->first, HORO_ERR_MISMATCH, message);
    timeline_->NegotiationEnd(set_id, it->first);
    resolved->push_back(part.response);
    parts->push_back(std::move(part));
    it = state.pending.erase(it);
  }
}

void Coordinator::ResolveRemovedSet(int32_t set_id, std::vector<ResponsePart>* parts,
                                    std::vector<Response>* resolved,
                                    std::vector<std::pair<int32_t, std::string>>* deferred) {
  // Tensors some members submitted to the set before it was removed would wait forever: queue them
  // for the next round, where the set no longer exists and each gets an error on its ranks.
  SetState& state = states_[set_id];
  for (auto& kv : state.pending) {
    if (kv.second.queued_ready) continue;
    kv.second.queued_ready = true;
    deferred->emplace_back(set_id, kv.first);
  }
  if (!state.joined.empty()) {
    ResponsePart part;
    part.response = ErrorResponse(set_id, "join", HORO_ERR_INVALID_ARGUMENT,
                                  "process set " + std::to_string(set_id) + " was removed while ranks had joined it");
    state.joined.clear();
    resolved->push_back(part.response);
    parts->push_back(std::move(part));
  }
}

void Coordinator::Fuse(std::vector<ResponsePart> parts, const std::vector<Response>& resolved, ResponseList* out) {
  int64_t group_bytes = 0;
  const Response* group_head = nullptr;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Response& r = resolved[i];
    const int64_t bytes = r.NumElements() * static_cast<int64_t>(DataTypeSize(r.dtype));
    const bool fusable = r.kind == ResponseKind::kOp && r.op_type == OpType::kAllreduce;
    const bool joins_group = group_head != nullptr && Fusable(*group_head, r) &&
                             group_bytes + bytes <= fusion_threshold_bytes_;
    if (joins_group) {
      out->fused.back().push_back(std::move(parts[i]));
      group_bytes += bytes;
      continue;
    }
    out->fused.push_back({std::move(parts[i])});
    group_head = fusable ? &r : nullptr;
    group_bytes = bytes;
  }
}

void Coordinator::EmitShutdown(horo_status_t code, const std::string& message, ResponseList* out) {
  ResponsePart part;
  part.response.kind = ResponseKind::kShutdown;
  part.response.error_code = code;
  part.response.error_message = message;
  out->fused.push_back({std::move(part)});
  shut_down_ = true;
}

int Coordinator::CheckStalls(std::vector<StalledTensor> waiting) {
  if (!stall_inspector_.enabled() || shut_down_) return 1000;
  auto now = std::chrono::steady_clock::now();
  for (const auto& kv : states_) {
    std::vector<int32_t> members;
    if (!sets_->Members(kv.first, &members)) continue;
    for (const auto& p : kv.second.pending) {
      if (p.second.queued_ready) continue;
      StalledTensor t;
      t.process_set_id = kv.first;
      t.name = p.first;
      t.waited_seconds = std::chrono::duration<double>(now - p.second.first_seen).count();
      for (int32_t m : members) {
        bool joined = std::find(kv.second.joined.begin(), kv.second.joined.end(), m) != kv.second.joined.end();
        if (!joined && !p.second.by_rank.count(m)) t.missing_ranks.push_back(m);
      }
      waiting.push_back(std::move(t));
    }
  }
  StallInspector::Report report = stall_inspector_.Inspect(waiting);
  for (const std::string& warning : report.warnings) HORO_LOG(kWarning, 0) << warning;
  if (!report.shutdown.empty()) {
    stall_shutdown_ = true;
    changed_ = true;
    stall_message_ = report.shutdown;
    HORO_LOG(kError, 0) << report.shutdown;
  }
  return stall_inspector_.PeriodMs();
}

}  // namespace horo
