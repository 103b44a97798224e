#include "coordinator/process_set_table.h"

#include <algorithm>

namespace horo {

ProcessSetTable::ProcessSetTable(int world_size) {
  std::vector<int32_t> all(world_size);
  for (int i = 0; i < world_size; ++i) all[i] = i;
  sets_[0] = all;
}

bool ProcessSetTable::Members(int32_t id, std::vector<int32_t>* ranks) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  *ranks = it->second;
  return true;
}

bool ProcessSetTable::Contains(int32_t id, int32_t rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  return it != sets_.end() && std::binary_search(it->second.begin(), it->second.end(), rank);
}

bool ProcessSetTable::Exists(int32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_.count(id) > 0;
}

bool ProcessSetTable::Find(const std::vector<int32_t>& ranks, int32_t* id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& kv : sets_) {
    if (kv.second == ranks) {
      *id = kv.first;
      return true;
    }
  }
  return false;
}

int32_t ProcessSetTable::Add(const std::vector<int32_t>& ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  int32_t id = next_id_++;
  sets_[id] = ranks;
  generation_.fetch_add(1, std::memory_order_release);
  return id;
}

bool ProcessSetTable::Remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const bool removed = id != 0 && sets_.erase(id) > 0;
  if (removed) generation_.fetch_add(1, std::memory_order_release);
  return removed;
}

}  // namespace horo
