#include "common/config.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>

namespace horo {
namespace {

enum class Kind { kInt, kFloat, kBool, kString };

struct Setting {
  const char* name;
  Kind kind;
  const char* doc;
  // Reads the text into the config, returns false if it does not parse.
  std::function<bool(const std::string&, Config*)> parse;
  // Prints the current value.
  std::function<std::string(const Config&)> print;
};

// Whether two texts of one setting give it the same value ("60" and "60.0"): then the one that
// applies hides nothing worth a note.
bool SameValue(const Setting& s, const std::string& a, const std::string& b) {
  Config with_a;
  Config with_b;
  return s.parse(a, &with_a) && s.parse(b, &with_b) && s.print(with_a) == s.print(with_b);
}

bool ParseInt(const std::string& text, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || errno == ERANGE) return false;  // ERANGE: out of int64's range
  *out = v;
  return true;
}

bool ParseFloat(const std::string& text, double* out) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  // NaN compares false with every bound, so it would slip past the range checks below.
  if (end == text.c_str() || *end != '\0' || std::isnan(v)) return false;
  *out = v;
  return true;
}

bool ParseBool(const std::string& text, bool* out) {
  std::string t;
  for (char c : text) t += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  if (t == "1" || t == "true" || t == "yes" || t == "on") {
    *out = true;
    return true;
  }
  if (t == "0" || t == "false" || t == "no" || t == "off" || t.empty()) {
    *out = false;
    return true;
  }
  // Any other integer: Horovod reads these settings with strtol(...) != 0, so "2" means on.
  char* end = nullptr;
  errno = 0;
  const long long number = std::strtoll(t.c_str(), &end, 10);
  if (end == t.c_str() || *end != '\0' || errno == ERANGE) return false;
  *out = number != 0;
  return true;
}

// "auto" (or empty) leaves the choice to the core; otherwise a boolean forces it.
bool ParseToggle(const std::string& text, Toggle* out) {
  std::string t;
  for (char c : text) t += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  if (t == "auto" || t.empty()) {
    *out = Toggle::kAuto;
    return true;
  }
  bool on = false;
  if (!ParseBool(t, &on)) return false;
  *out = on ? Toggle::kOn : Toggle::kOff;
  return true;
}

std::string FormatToggle(Toggle value) {
  return value == Toggle::kAuto ? "auto" : value == Toggle::kOn ? "1" : "0";
}

std::string FormatDouble(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

#define HORO_INT_SETTING(NAME, FIELD, DOC)                                                      \
  Setting{NAME, Kind::kInt, DOC,                                                                \
          [](const std::string& t, Config* c) { return ParseInt(t, &c->FIELD); },               \
          [](const Config& c) { return std::to_string(c.FIELD); }}
#define HORO_FLOAT_SETTING(NAME, FIELD, DOC)                                                    \
  Setting{NAME, Kind::kFloat, DOC,                                                              \
          [](const std::string& t, Config* c) { return ParseFloat(t, &c->FIELD); },             \
          [](const Config& c) { return FormatDouble(c.FIELD); }}
#define HORO_BOOL_SETTING(NAME, FIELD, DOC)                                                     \
  Setting{NAME, Kind::kBool, DOC,                                                               \
          [](const std::string& t, Config* c) { return ParseBool(t, &c->FIELD); },              \
          [](const Config& c) { return std::string(c.FIELD ? "1" : "0"); }}
#define HORO_STRING_SETTING(NAME, FIELD, DOC)                                                   \
  Setting{NAME, Kind::kString, DOC,                                                             \
          [](const std::string& t, Config* c) { c->FIELD = t; return true; },                   \
          [](const Config& c) { return c.FIELD; }}

const std::vector<Setting>& Table() {
  static const std::vector<Setting> table = {
      HORO_INT_SETTING("FUSION_THRESHOLD", fusion_threshold_bytes,
                       "Fusion buffer size in bytes; tensors negotiated together are packed up to this size. 0 disables fusion."),
      HORO_FLOAT_SETTING("CYCLE_TIME", cycle_time_ms,
                         "Batching delay in milliseconds: how long the background thread waits for more tensors before a negotiation round. 0 negotiates as soon as a tensor is enqueued. At most 1e6."),
      HORO_INT_SETTING("CACHE_CAPACITY", cache_capacity,
                       "Entries of the response cache that shortens negotiation of repeated tensors. 0 disables the cache."),
      HORO_BOOL_SETTING("STALL_CHECK_DISABLE", stall_check_disable, "Disable the stall warning."),
      HORO_FLOAT_SETTING("STALL_CHECK_TIME_SECONDS", stall_check_time_seconds,
                         "Seconds a tensor may wait for other ranks before a warning names the missing ranks (0 to 1e6)."),
      HORO_FLOAT_SETTING("STALL_SHUTDOWN_TIME_SECONDS", stall_shutdown_time_seconds,
                         "Seconds after which a stalled tensor shuts the job down with an error on every rank (at most 1e6). 0: never."),
      HORO_FLOAT_SETTING("PEER_TIMEOUT_SECONDS", peer_timeout_seconds,
                         "A collective in which a peer makes no progress for this long fails on every rank (at most 1e6)."),
      HORO_FLOAT_SETTING("START_TIMEOUT", start_timeout_seconds,
                         "Seconds within which every rank must have connected at init (at most 1e6)."),
      HORO_INT_SETTING("SMALL_MESSAGE_BYTES", small_message_bytes,
                       "Allreduces of at most this many bytes use the latency-optimal algorithm, larger ones the ring. "
                       "Rank 0's value applies to the whole job."),
      HORO_INT_SETTING("CHUNK_BYTES", chunk_bytes, "Pipeline chunk of the ring algorithms, in bytes."),
      HORO_INT_SETTING("RING_SLICE_BYTES", ring_slice_bytes,
                       "A ring allreduce among ranks of one host runs its scatter-reduce and allgather on one slice of "
                       "this many bytes (at least 4096) of every block at a time, so that reduced bytes are sent on from "
                       "the cache. Rank 0's value applies to the whole job; none with HORO_SHM_DISABLE on rank 0."),
      Setting{"HIERARCHICAL_ALLREDUCE", Kind::kString,
              "auto, 1 or 0. Allreduce of a process set that spans hosts reduces inside each host over shared memory, "
              "then across hosts among one rank per host and shard, then shares the result inside each host. auto "
              "(the default) and 1 do so whenever a set spans hosts and some host has several of its ranks; 0 always "
              "uses the flat algorithms. Rank 0's value applies to the whole job.",
              [](const std::string& t, Config* c) { return ParseToggle(t, &c->hierarchical_allreduce); },
              [](const Config& c) { return FormatToggle(c.hierarchical_allreduce); }},
      Setting{"HIERARCHICAL_ALLGATHER", Kind::kString,
              "auto, 1 or 0. Allgather of a process set that spans hosts gathers inside each host, then across hosts "
              "among one rank per host and shard (every byte crosses to each other host once), then shares inside "
              "each host. auto (the default) and 1 do so whenever a set spans hosts and some host has several of its "
              "ranks; 0 always uses the ring. Rank 0's value applies to the whole job.",
              [](const std::string& t, Config* c) { return ParseToggle(t, &c->hierarchical_allgather); },
              [](const Config& c) { return FormatToggle(c.hierarchical_allgather); }},
      HORO_BOOL_SETTING("DYNAMIC_PROCESS_SETS", dynamic_process_sets,
                        "Allow add_process_set/remove_process_set after init."),
      HORO_STRING_SETTING("HOSTNAME", hostname,
                          "This rank's host name. Ranks with the same name and the same kernel boot id exchange data through shared memory; set different names to make ranks of one machine act as separate hosts (tests). Empty: the system host name."),
      HORO_BOOL_SETTING("SHM_DISABLE", shm_disable,
                        "Exchange data between ranks of one host over TCP instead of shared memory."),
      HORO_STRING_SETTING("NCCL_LIBRARY", nccl_library,
                          "Path of the NCCL library used for CUDA tensors. Empty: the nvidia/nccl/lib folder of an installed nvidia-nccl-cu13/cu12 wheel, then the system libnccl.so.2. A path that does not load is an error, not a fallback."),
      HORO_INT_SETTING("SHM_RING_BYTES", shm_ring_bytes,
                       "Bytes of the shared-memory ring per direction between two ranks of one host (a power of two >= 65536). "
                       "0 (the default): a core's level-2 cache shared out among the rank's same-host peers, rounded "
                       "down to a power of two, from 524288 to 4194304."),
      HORO_FLOAT_SETTING("SPIN_MICROSECONDS", spin_microseconds,
                         "How long a waiting thread (the background thread waiting for a same-host peer, a caller in synchronize()) spins, yielding its core, before it sleeps. Short waits then cost microseconds; 0 always sleeps at once. At most 1e6."),
      HORO_BOOL_SETTING("CALLER_PROGRESS", caller_progress,
                        "A caller waiting for a collective (synchronize(), a synchronous op) runs the negotiation and the data movement itself while they make progress, instead of waking the background thread and sleeping; after SPIN_MICROSECONDS without progress it hands over. 0: only the background thread works."),
      HORO_BOOL_SETTING("COORDINATOR_FREE", coordinator_free,
                        "Repeated tensors (same name and parameters as a step before) are agreed between the ranks, each announcing the cached response's id to every peer, without the coordinator (rank 0) negotiating them. Needs every pair of ranks on one host (shared memory); with autotune, or ranks on several hosts, every step goes through the coordinator. 0: always through the coordinator."),
      HORO_STRING_SETTING("TIMELINE", timeline,
                          "Path of the timeline (Chrome trace JSON, opened by ui.perfetto.dev) that rank 0 writes with the events of every rank; DYNAMIC enables start_timeline()/stop_timeline() without starting one. Empty: off."),
      HORO_BOOL_SETTING("TIMELINE_MARK_CYCLES", timeline_mark_cycles,
                        "Mark the start of every negotiation round (CYCLE_START) in the timeline."),
      Setting{"LOG_LEVEL", Kind::kString, "TRACE, DEBUG, INFO, WARNING, ERROR or FATAL.",
              [](const std::string& t, Config* c) { return ParseLogLevel(t, &c->log_level); },
              [](const Config& c) {
                static const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
                return std::string(kNames[static_cast<int>(c.log_level)]);
              }},
      HORO_BOOL_SETTING("LOG_HIDE_TIME", log_hide_time, "Omit timestamps from log lines."),
      HORO_BOOL_SETTING("AUTOTUNE", autotune,
                        "Tune FUSION_THRESHOLD, CYCLE_TIME and SMALL_MESSAGE_BYTES online during the first steps (those set explicitly stay fixed)."),
      HORO_STRING_SETTING("AUTOTUNE_LOG", autotune_log,
                          "CSV file that rank 0 writes with the parameters and score of every autotune sample, then the chosen setting."),
      HORO_INT_SETTING("AUTOTUNE_WARMUP_SAMPLES", autotune_warmup_samples,
                       "Autotune samples discarded before tuning starts."),
      HORO_INT_SETTING("AUTOTUNE_STEPS_PER_SAMPLE", autotune_steps_per_sample,
                       "Training steps per autotune measurement; a sample's score is the median of 5 measurements."),
      HORO_INT_SETTING("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", autotune_bayes_opt_max_samples,
                       "Samples of the Bayesian optimisation of fusion threshold and cycle time."),
      HORO_FLOAT_SETTING("AUTOTUNE_GAUSSIAN_PROCESS_NOISE", autotune_gaussian_process_noise,
                         "Measurement noise the autotuner's Gaussian process assumes, relative to the spread of the scores, in [0, 1]."),
  };
  return table;
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kBool: return "bool";
    case Kind::kString: return "string";
  }
  return "?";
}

// What a value that does not parse should have been: the kind, or for the settings read from
// words the first sentence of their description (e.g. "auto, 1 or 0").
std::string Expected(const Setting& s) {
  if (s.kind != Kind::kString) return std::string("a valid ") + KindName(s.kind);
  const std::string doc = s.doc;
  return "one of: " + doc.substr(0, doc.find('.'));
}

// Horovod's run-time variables for parts of Horovod that Horo does not have. Setting one changes
// nothing here; init says so (horovodrun's matching flags get hororun's "ignoring" warning), so
// that a job tuned for Horovod does not run as if the value applied.
struct HorovodOnly {
  const char* name;
  const char* instead;
};

const HorovodOnly kHorovodOnly[] = {
    {"HOROVOD_GLOO_TIMEOUT_SECONDS", "connection timeouts are HORO_START_TIMEOUT and HORO_PEER_TIMEOUT_SECONDS"},
    {"HOROVOD_CONTROLLER", "Horo has one controller"},
    {"HOROVOD_CPU_OPERATIONS", "host tensors always use Horo's own collectives"},
    {"HOROVOD_MPI_THREADS_DISABLE", "Horo moves no data through MPI"},
    {"HOROVOD_NUM_NCCL_STREAMS", nullptr},
    {"HOROVOD_BATCH_D2D_MEMCOPIES", nullptr},
    {"HOROVOD_DISABLE_GROUP_FUSION", nullptr},
    {"HOROVOD_TORUS_ALLREDUCE", nullptr},
    {"HOROVOD_THREAD_AFFINITY", nullptr},
    {"HOROVOD_CCL_BGT_AFFINITY", nullptr},
    {"HOROVOD_ADASUM_MPI_CHUNK_SIZE", nullptr},
    {"HOROVOD_ENABLE_XLA_OPS", nullptr},
};

}  // namespace

Status LoadConfigFromEnv(Config* config) {
  Config parsed;
  // The variable to name in an error: the one the user set (HOROVOD_... counts), else HORO_....
  const auto var_of = [&parsed](const std::string& name) { return parsed.VariableName(name); };
  for (const Setting& s : Table()) {
    // HORO_<name> wins over HOROVOD_<name>; a variable set to the empty string counts as not set,
    // so that an empty HORO_<name> (a script's export HORO_TIMELINE=) does not hide HOROVOD_<name>.
    for (const char* prefix : {"HORO_", "HOROVOD_"}) {
      std::string var = std::string(prefix) + s.name;
      const char* text = std::getenv(var.c_str());
      if (text == nullptr || *text == '\0') continue;
      if (!s.parse(text, &parsed)) {
        return Status::InvalidArgument("environment variable " + var + "='" + text + "' is not " + Expected(s));
      }
      parsed.from_environment.insert(s.name);
      parsed.set_by[s.name] = var;
      const char* other = std::getenv(("HOROVOD_" + std::string(s.name)).c_str());
      if (prefix == std::string("HORO_") && other != nullptr && *other != '\0' && std::string(other) != text &&
          !SameValue(s, text, other)) {
        parsed.notes.push_back(var + "='" + text + "' applies; HOROVOD_" + s.name + "='" + other + "' is ignored");
      }
      break;
    }
  }
  for (const HorovodOnly& h : kHorovodOnly) {
    const char* text = std::getenv(h.name);
    if (text == nullptr || *text == '\0') continue;
    parsed.notes.push_back(std::string(h.name) + "='" + text + "' has no effect in Horo" +
                           (h.instead != nullptr ? std::string(": ") + h.instead : std::string()));
  }
  if (parsed.fusion_threshold_bytes < 0) {
    return Status::InvalidArgument(var_of("FUSION_THRESHOLD") + " must be >= 0, got " +
                                   std::to_string(parsed.fusion_threshold_bytes));
  }
  if (parsed.cache_capacity < 0) {
    return Status::InvalidArgument(var_of("CACHE_CAPACITY") + " must be >= 0 (0 disables the cache), got " +
                                   std::to_string(parsed.cache_capacity));
  }
  if (parsed.chunk_bytes <= 0) {
    return Status::InvalidArgument(var_of("CHUNK_BYTES") + " must be > 0, got " + std::to_string(parsed.chunk_bytes));
  }
  if (parsed.ring_slice_bytes < 4096) {
    // Each slice costs 2 (N-1) steps: tiny ones would turn a large allreduce into millions of steps.
    return Status::InvalidArgument(var_of("RING_SLICE_BYTES") + " must be at least 4096, got " +
                                   std::to_string(parsed.ring_slice_bytes));
  }
  if (parsed.shm_ring_bytes != 0 &&
      (parsed.shm_ring_bytes < (64 << 10) || (parsed.shm_ring_bytes & (parsed.shm_ring_bytes - 1)) != 0 ||
       parsed.shm_ring_bytes > (int64_t{1} << 40))) {
    return Status::InvalidArgument(var_of("SHM_RING_BYTES") + " must be 0 (sized by the cache) or a power of two "
                                   "between 65536 and 2^40");
  }
  // Bounded (11.6 days) so that every deadline made from it fits a clock's 64-bit count; NaN fails too.
  if (!(parsed.peer_timeout_seconds > 0 && parsed.peer_timeout_seconds <= 1e6)) {
    return Status::InvalidArgument(var_of("PEER_TIMEOUT_SECONDS") + " must be > 0 and at most 1000000, got " +
                                   FormatDouble(parsed.peer_timeout_seconds));
  }
  if (!(parsed.start_timeout_seconds > 0 && parsed.start_timeout_seconds <= 1e6)) {
    return Status::InvalidArgument(var_of("START_TIMEOUT") + " must be > 0 and at most 1000000, got " +
                                   FormatDouble(parsed.start_timeout_seconds));
  }
  // The bounds below keep every duration made from a setting within a clock's count, and keep a
  // cycle time within what a worker accepts from rank 0 (response.cc).
  for (const auto& [name, value] : {std::pair<const char*, double>{"SPIN_MICROSECONDS", parsed.spin_microseconds},
                                    {"CYCLE_TIME", parsed.cycle_time_ms},
                                    {"STALL_CHECK_TIME_SECONDS", parsed.stall_check_time_seconds},
                                    {"STALL_SHUTDOWN_TIME_SECONDS", parsed.stall_shutdown_time_seconds}}) {
    if (!(value >= 0 && value <= 1e6)) {
      return Status::InvalidArgument(var_of(name) + " must be between 0 and 1000000, got " +
                                     FormatDouble(value));
    }
  }
  if (parsed.small_message_bytes < 0) {
    return Status::InvalidArgument(var_of("SMALL_MESSAGE_BYTES") + " must be >= 0, got " +
                                   std::to_string(parsed.small_message_bytes));
  }
  if (parsed.autotune_warmup_samples < 0) {
    return Status::InvalidArgument(var_of("AUTOTUNE_WARMUP_SAMPLES") + " must be >= 0, got " +
                                   std::to_string(parsed.autotune_warmup_samples));
  }
  if (parsed.autotune_steps_per_sample < 1) {
    return Status::InvalidArgument(var_of("AUTOTUNE_STEPS_PER_SAMPLE") + " must be >= 1, got " +
                                   std::to_string(parsed.autotune_steps_per_sample));
  }
  if (parsed.autotune_bayes_opt_max_samples < 1) {
    return Status::InvalidArgument(var_of("AUTOTUNE_BAYES_OPT_MAX_SAMPLES") + " must be >= 1, got " +
                                   std::to_string(parsed.autotune_bayes_opt_max_samples));
  }
  if (!(parsed.autotune_gaussian_process_noise >= 0 && parsed.autotune_gaussian_process_noise <= 1)) {
    return Status::InvalidArgument(var_of("AUTOTUNE_GAUSSIAN_PROCESS_NOISE") + " must be between 0 and 1, got " +
                                   FormatDouble(parsed.autotune_gaussian_process_noise));
  }
  *config = parsed;
  return Status::OK();
}

std::vector<SettingInfo> DescribeConfig(const Config& config) {
  static const Config defaults;
  std::vector<SettingInfo> out;
  for (const Setting& s : Table()) {
    out.push_back(SettingInfo{s.name, KindName(s.kind), s.print(defaults), s.print(config), s.doc});
  }
  return out;
}

}  // namespace horo
