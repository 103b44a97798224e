// ProcessSetTable: the process sets this runtime knows, id -> global ranks (sorted). Id 0 is the
// global set. Read from user threads (enqueue validation), changed only inside the runtime loop's
// passes when an add/remove response arrives, hence the lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace horo {

class ProcessSetTable {
 public:
  explicit ProcessSetTable(int world_size);

  // Members of the set, or false if it does not exist.
  bool Members(int32_t id, std::vector<int32_t>* ranks) const;
  bool Contains(int32_t id, int32_t rank) const;
  bool Exists(int32_t id) const;
  // The set's id if a set with exactly these members exists.
  bool Find(const std::vector<int32_t>& ranks, int32_t* id) const;
  int32_t Add(const std::vector<int32_t>& ranks);  // returns the new id
  bool Remove(int32_t id);
  // Changes with every Add and Remove.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

 private:
  std::atomic<uint64_t> generation_{0};
  mutable std::mutex mutex_;
  std::map<int32_t, std::vector<int32_t>> sets_;
  int32_t next_id_ = 1;
};

// The members of one set, read from the table again only when the set asked for or the table's
// generation changed: for the runtime loop's per-step paths, which run under its progress lock as
// do the table's changes, so that a step reads its set without a lock or a copy.
class MembersView {
 public:
  explicit MembersView(const ProcessSetTable* table) : table_(table) {}
  // The set's members, sorted; null when it does not exist. Valid until the next call.
  const std::vector<int32_t>* Get(int32_t id) {
    const uint64_t generation = table_->generation();
    if (id != id_ || generation != generation_ || !read_) {
      exists_ = table_->Members(id, &members_);
      id_ = id;
      generation_ = generation;
      read_ = true;
    }
    return exists_ ? &members_ : nullptr;
  }

 private:
  const ProcessSetTable* table_;
  bool read_ = false;
  int32_t id_ = 0;
  uint64_t generation_ = 0;
  bool exists_ = false;
  std::vector<int32_t> members_;
};

}  // namespace horo
