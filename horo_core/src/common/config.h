// Config: the one table of settings (name, type, default, doc), parsed once from the environment
// into an immutable value owned by the Runtime. HORO_<NAME> is read first, then Horovod's
// HOROVOD_<NAME>, so existing job scripts keep working. Nothing else in the core calls getenv.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status.h"

namespace horo {

// A choice the core makes on its own unless a setting forces it on or off.
enum class Toggle : int32_t { kAuto = 0, kOn = 1, kOff = 2 };

struct Config {
  int64_t fusion_threshold_bytes = 64LL << 20;
  double cycle_time_ms = 0.0;           // batching delay before a negotiation round; 0 = event-driven
  int64_t cache_capacity = 1024;
  bool stall_check_disable = false;
  double stall_check_time_seconds = 60.0;
  double stall_shutdown_time_seconds = 0.0;  // 0 = never shut down on a stall
  double peer_timeout_seconds = 30.0;   // a collective whose peer makes no progress this long fails
  double start_timeout_seconds = 30.0;  // the whole mesh must connect within this
  int64_t small_message_bytes = 64 * 1024;  // allreduce: latency-optimal algorithm up to this size
  int64_t chunk_bytes = 1 << 20;        // ring pipeline chunk
  int64_t ring_slice_bytes = 256 << 10; // same-host ring allreduce: slice per block
  Toggle hierarchical_allreduce = Toggle::kAuto;  // allreduce inside hosts first, then across them
  Toggle hierarchical_allgather = Toggle::kAuto;  // allgather inside hosts, across them, inside again
  bool dynamic_process_sets = false;
  std::string hostname;                 // host identity for same-host detection; empty = gethostname()
  bool shm_disable = false;             // ranks of one host exchange data over TCP, not shared memory
  int64_t shm_ring_bytes = 0;           // shared-memory ring per direction and same-host pair; 0: by the cache
  double spin_microseconds = 50.0;      // a waiting thread spins (yielding) this long before it sleeps
  bool caller_progress = true;          // a caller waiting on a handle runs the loop's passes itself
  bool coordinator_free = true;         // cached steps agreed between the ranks (coordinator/peer_agreement.h)
  std::string nccl_library;             // NCCL for CUDA tensors; empty: wheel, then system (horo_core/nccl.py)
  std::string timeline;                 // timeline file written by rank 0, or DYNAMIC; empty = off
  bool timeline_mark_cycles = false;    // CYCLE_START markers in the timeline
  LogLevel log_level = LogLevel::kWarning;
  bool log_hide_time = false;
  // Autotune (tuning/parameter_manager.h): rank 0 tunes the settings above that the user did not set.
  bool autotune = false;
  std::string autotune_log;             // CSV of every sample, written by rank 0; empty = none
  int64_t autotune_warmup_samples = 3;  // samples discarded before tuning starts
  int64_t autotune_steps_per_sample = 10;
  int64_t autotune_bayes_opt_max_samples = 20;
  double autotune_gaussian_process_noise = 0.8;

  // Settings given under both names with different values: which one applies (logged at init).
  std::vector<std::string> notes;
  // Names (without prefix) of the settings that came from the environment rather than defaults.
  std::set<std::string> from_environment;
  bool IsSetExplicitly(const std::string& name) const { return from_environment.count(name) > 0; }
  // The environment variable that set a setting (HORO_... or HOROVOD_...), for messages that name
  // it; HORO_<name> when the default applies.
  std::map<std::string, std::string> set_by;
  std::string VariableName(const std::string& name) const {
    auto it = set_by.find(name);
    return it != set_by.end() ? it->second : "HORO_" + name;
  }
};

struct SettingInfo {
  std::string name;
  std::string type;
  std::string default_value;
  std::string value;
  std::string doc;
};

// Reads every setting from the environment. A value that does not parse is an error naming the
// variable and the text.
Status LoadConfigFromEnv(Config* config);

// The table with the effective values of *config, in declaration order.
std::vector<SettingInfo> DescribeConfig(const Config& config);

}  // namespace horo
