// ProcessSetTable: the process sets this runtime knows, id -> global ranks (sorted). Id 0 is the
// global set. Read from user threads (enqueue validation), changed only inside the runtime loop's
// passes when an add/remove response arrives, hence the lock.
#pragma once

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
  // The set's id if a set with exactly these members exists.
  bool Find(const std::vector<int32_t>& ranks, int32_t* id) const;
  int32_t Add(const std::vector<int32_t>& ranks);  // returns the new id
  bool Remove(int32_t id);

 private:
  mutable std::mutex mutex_;
  std::map<int32_t, std::vector<int32_t>> sets_;
  int32_t next_id_ = 1;
};

}  // namespace horo
