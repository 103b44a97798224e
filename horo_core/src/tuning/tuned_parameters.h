// TunedParameters: the settings the autotuner may change while a job runs. Rank 0 decides them
// and sends them inside a ResponseList; every rank applies them before the responses of that
// list, so that all ranks switch at the same response (the allreduce algorithm must be the same
// on every rank for every response, or the ranks exchange different byte counts and deadlock).
#pragma once

#include <cstdint>

namespace horo {

struct TunedParameters {
  int64_t fusion_threshold_bytes = 0;  // used by the coordinator only (rank 0)
  double cycle_time_ms = 0.0;          // batching delay of every rank's background loop
  int64_t small_message_bytes = 0;     // allreduce: recursive doubling up to this size, ring above

  bool operator==(const TunedParameters& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes && cycle_time_ms == o.cycle_time_ms &&
           small_message_bytes == o.small_message_bytes;
  }
  bool operator!=(const TunedParameters& o) const { return !(*this == o); }
};

}  // namespace horo
