#include "coordinator/tensor_queue.h"

#include <set>

#include "common/coarse_clock.h"

namespace horo {

namespace {
constexpr size_t kMostSpareNodes = 64;
}  // namespace

Status TensorQueue::Add(std::vector<TensorEntry>* entries) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::string> seen;
  for (const TensorEntry& e : *entries) {
    const Request& r = e.request;
    const bool reserved = reserved_ && reserved_key_.first == r.process_set_id && reserved_key_.second == r.name;
    if (reserved || table_.count(Lookup(r.process_set_id, &r.name)) ||
        (entries->size() > 1 && !seen.insert(r.name).second)) {
      const std::string op = OpTypeName(r.op_type);
      const std::string article = op.find_first_of("aeiou") == 0 ? "an " : "a ";
      return Status(HORO_ERR_DUPLICATE_NAME,
                    article + op + " of a tensor named '" + r.name +
                        "' is already in flight; names of concurrent operations must be unique");
    }
  }
  const int64_t now = CoarseNanos();
  for (TensorEntry& e : *entries) {
    e.enqueued_ns = now;
    unsent_.push_back(e.request);
    Insert(&e);
  }
  has_unsent_.store(!unsent_.empty(), std::memory_order_release);
  return Status::OK();
}

void TensorQueue::Insert(TensorEntry* entry) {
  if (spare_.empty()) {
    Key key(entry->request.process_set_id, entry->request.name);
    table_.emplace(std::move(key), std::move(*entry));
    return;
  }
  auto node = std::move(spare_.back());
  spare_.pop_back();
  node.key().first = entry->request.process_set_id;
  node.key().second = entry->request.name;
  node.mapped() = std::move(*entry);
  table_.insert(std::move(node));
}

bool TensorQueue::Reserve(int32_t process_set_id, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reserved_ || table_.count(Lookup(process_set_id, &name))) return false;
  reserved_ = true;
  reserved_key_.first = process_set_id;
  reserved_key_.second = name;  // keeps its storage from call to call
  return true;
}

void TensorQueue::AddReserved(TensorEntry* entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ = false;
  entry->enqueued_ns = CoarseNanos();
  Insert(entry);
}

void TensorQueue::EndReservation() {
  std::lock_guard<std::mutex> lock(mutex_);
  reserved_ = false;
}

void TensorQueue::TakeRequests(std::vector<Request>* out) {
  out->clear();
  std::lock_guard<std::mutex> lock(mutex_);
  out->swap(unsent_);
  has_unsent_.store(false, std::memory_order_release);
}

bool TensorQueue::Take(int32_t process_set_id, const std::string& name, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = table_.find(Lookup(process_set_id, &name));
  if (it == table_.end()) return false;
  *out = std::move(it->second);
  if (spare_.size() < kMostSpareNodes) {
    spare_.push_back(table_.extract(it));
  } else {
    table_.erase(it);
  }
  return true;
}

std::vector<int64_t> TensorQueue::TakeAllHandles() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int64_t> handles;
  for (auto& kv : table_) handles.push_back(kv.second.handle);
  table_.clear();
  unsent_.clear();
  has_unsent_.store(false, std::memory_order_release);
  return handles;
}

int64_t TensorQueue::OldestEnqueued(std::string* name) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t oldest = 0;
  for (const auto& kv : table_) {
    if (kv.second.request.op_type == OpType::kJoin) continue;
    if (oldest == 0 || kv.second.enqueued_ns < oldest) {
      oldest = kv.second.enqueued_ns;
      *name = kv.first.second;
    }
  }
  return oldest;
}

}  // namespace horo
