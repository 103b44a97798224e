// ResponseCache: remembers the responses of tensors negotiated before, so that a repeated step
// (the same names with the same shapes and parameters on every rank) skips validation on the
// coordinator and travels as 8-byte ids instead of whole responses.
//
// The coordinator owns the authoritative copy: it decides ids and evictions (least recently used
// beyond the capacity) and announces both in the response list. Every other rank keeps a mirror
// that applies those announcements in message order, so an id is always known when it is read.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/response.h"

namespace horo {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity) : capacity_(capacity) {}

  bool enabled() const { return capacity_ > 0; }
  // The operations whose responses are cached: those on tensors (not barriers, joins, set changes).
  static bool Holds(OpType op) {
    return op == OpType::kAllreduce || op == OpType::kAllgather || op == OpType::kBroadcast ||
           op == OpType::kAlltoall || op == OpType::kReducescatter;
  }

  // Coordinator: the id cached for (process set, name) whose signature equals signature, else -1.
  int64_t Lookup(int32_t process_set_id, const std::string& name, const std::string& signature);
  // Coordinator: caches response under a new id, evicting the least recently used entries beyond
  // the capacity (their ids are appended to *evicted). Returns the new id.
  int64_t Put(const Response& response, const std::string& signature, std::vector<int64_t>* evicted);
  // Coordinator: forgets every entry of a process set (on removal).
  void EraseProcessSet(int32_t process_set_id, std::vector<int64_t>* evicted);

  // Mirror: applies the coordinator's announcements.
  void MirrorPut(int64_t id, const Response& response);
  void MirrorErase(int64_t id);

  // Both, for cached steps agreed between the ranks (coordinator/peer_agreement.h): the id cached
  // for (process set, name), else -1; forgetting an id every rank agreed to drop; and (coordinator)
  // marking an id as just used, for the eviction order.
  int64_t Find(int32_t process_set_id, const std::string& name) const;
  void Forget(int64_t id) { Erase(id); }
  void Touch(int64_t id);

  // Both: the response stored under id, or nullptr.
  const Response* Get(int64_t id) const;

 private:
  struct Entry {
    Response response;
    std::string signature;
    std::list<int64_t>::iterator lru_position;
  };
  void Erase(int64_t id);

  int64_t capacity_;
  int64_t next_id_ = 0;
  std::unordered_map<int64_t, Entry> entries_;
  std::map<std::pair<int32_t, std::string>, int64_t> by_name_;
  std::list<int64_t> lru_;  // front = most recently used
};

}  // namespace horo
