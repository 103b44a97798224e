// TensorQueue: tensors enqueued by user threads and not yet completed, keyed by (process set,
// name), plus the requests not yet sent to the coordinator. User threads add; the background
// thread takes requests and, when a response arrives, removes the entries it executes.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coordinator/request.h"

namespace horo {

struct TensorEntry {
  Request request;
  const void* input = nullptr;
  void* output = nullptr;
  int64_t output_bytes = 0;     // allgather, alltoall, reducescatter: the bytes output holds (horo.h)
  void* ready_event = nullptr;  // CUDA tensors: CUevent the device work waits on (may be null)
  int64_t handle = 0;
  int64_t enqueued_ns = 0;  // CoarseNanos when added
};

class TensorQueue {
 public:
  // Adds every entry or none: a name already in flight in the same process set (or twice in
  // entries) is HORO_ERR_DUPLICATE_NAME. Added entries are moved from.
  Status Add(std::vector<TensorEntry>* entries);
  // Moves the requests not yet sent into *out (emptied first), whose storage the queue keeps for
  // the next ones.
  void TakeRequests(std::vector<Request>* out);
  // Lock-free: a caller that drives the negotiation looks on every spin round.
  bool HasRequests() const { return has_unsent_.load(std::memory_order_acquire); }
  // A synchronous call that runs without an entry (Runtime::RunExpress) holds its name meanwhile:
  // false when an entry or another reservation has it, or a reservation is held. While held, Add
  // refuses the name as in flight. AddReserved turns the reservation into an entry whose request
  // is not sent (it was announced already); EndReservation drops it.
  bool Reserve(int32_t process_set_id, const std::string& name);
  void AddReserved(TensorEntry* entry);
  void EndReservation();
  // Removes and returns the entry, false if absent.
  bool Take(int32_t process_set_id, const std::string& name, TensorEntry* out);
  // Removes every entry (failure/shutdown); returns their handles.
  std::vector<int64_t> TakeAllHandles();
  // The entry in flight longest, joins left out (they wait for the other ranks' training): its
  // enqueue time (CoarseNanos) and name; 0 when none is.
  int64_t OldestEnqueued(std::string* name);

 private:
  // Keyed by (process set, name); looked up without copying the name.
  using Key = std::pair<int32_t, std::string>;
  using Lookup = std::pair<int32_t, const std::string*>;
  struct KeyLess {
    using is_transparent = void;
    bool operator()(const Key& a, const Key& b) const { return a < b; }
    bool operator()(const Key& a, const Lookup& b) const {
      return a.first != b.first ? a.first < b.first : a.second < *b.second;
    }
    bool operator()(const Lookup& a, const Key& b) const {
      return a.first != b.first ? a.first < b.first : *a.second < b.second;
    }
  };

  // Puts the entry in table_, on a spare node if there is one; under mutex_.
  void Insert(TensorEntry* entry);

  std::mutex mutex_;
  std::map<Key, TensorEntry, KeyLess> table_;
  bool reserved_ = false;  // Reserve's name, in reserved_key_
  Key reserved_key_;
  // Nodes of taken entries, reused by Add: a tensor added and taken every step allocates no node.
  std::vector<std::map<Key, TensorEntry, KeyLess>::node_type> spare_;
  std::vector<Request> unsent_;
  std::atomic<bool> has_unsent_{false};  // !unsent_.empty(), written under mutex_
};

}  // namespace horo
