#include "coordinator/response_cache.h"

namespace horo {

int64_t ResponseCache::Lookup(int32_t process_set_id, const std::string& name, const std::string& signature) {
  auto it = by_name_.find({process_set_id, name});
  if (it == by_name_.end()) return -1;
  Entry& e = entries_.at(it->second);
  if (e.signature != signature) return -1;
  lru_.splice(lru_.begin(), lru_, e.lru_position);
  return it->second;
}

int64_t ResponseCache::Put(const Response& response, const std::string& signature, std::vector<int64_t>* evicted) {
  auto old = by_name_.find({response.process_set_id, response.name});
  if (old != by_name_.end()) {
    evicted->push_back(old->second);
    Erase(old->second);
  }
  while (static_cast<int64_t>(entries_.size()) >= capacity_ && !lru_.empty()) {
    int64_t victim = lru_.back();
    evicted->push_back(victim);
    Erase(victim);
  }
  int64_t id = next_id_++;
  lru_.push_front(id);
  entries_[id] = Entry{response, signature, lru_.begin()};
  by_name_[{response.process_set_id, response.name}] = id;
  return id;
}

void ResponseCache::EraseProcessSet(int32_t process_set_id, std::vector<int64_t>* evicted) {
  std::vector<int64_t> ids;
  for (const auto& kv : by_name_) {
    if (kv.first.first == process_set_id) ids.push_back(kv.second);
  }
  for (int64_t id : ids) {
    evicted->push_back(id);
    Erase(id);
  }
}

void ResponseCache::MirrorPut(int64_t id, const Response& response) {
  Erase(id);
  lru_.push_front(id);
  entries_[id] = Entry{response, std::string(), lru_.begin()};
  by_name_[{response.process_set_id, response.name}] = id;
}

void ResponseCache::MirrorErase(int64_t id) { Erase(id); }

int64_t ResponseCache::Find(int32_t process_set_id, const std::string& name) const {
  auto it = by_name_.find({process_set_id, name});
  return it == by_name_.end() ? -1 : it->second;
}

void ResponseCache::Touch(int64_t id) {
  auto it = entries_.find(id);
  if (it != entries_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru_position);
}

const Response* ResponseCache::Get(int64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : &it->second.response;
}

void ResponseCache::Erase(int64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  auto name_it = by_name_.find({it->second.response.process_set_id, it->second.response.name});
  if (name_it != by_name_.end() && name_it->second == id) by_name_.erase(name_it);
  lru_.erase(it->second.lru_position);
  entries_.erase(it);
}

}  // namespace horo
