#include "runtime/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "collectives/adasum.h"
#include "common/coarse_clock.h"
#include "common/logging.h"
#include "common/spin.h"
#include "transport/loopback/transport.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

namespace horo {
namespace {

std::string TensorLabel(OpType op, const char* name) {
  return std::string(OpTypeName(op)) + " tensor '" + (name ? name : "") + "'";
}

// Whether list carries the coordinator's last word, a shutdown (never cached); *reason gets why.
bool ShutdownIn(const ResponseList& list, Status* reason) {
  for (const auto& parts : list.fused) {
    const ResponsePart& first = parts.front();
    if (first.cache_id < 0 && first.response.kind == ResponseKind::kShutdown) {
      *reason = Status(first.response.error_code, first.response.error_message);
      return true;
    }
  }
  return false;
}

}  // namespace

Runtime::Runtime(const Config& config, int rank, int size)
    : config_(config),
      rank_(rank),
      size_(size),
      sets_(size),
      cache_(config.cache_capacity),
      handles_(config.spin_microseconds),
      cycle_time_ms_(config.cycle_time_ms) {}

Status Runtime::Create(const horo_init_options_t& options, std::shared_ptr<LoopbackHub> hub,
                       std::unique_ptr<Runtime>* out) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("invalid rank " + std::to_string(options.rank) + " for size " +
                                   std::to_string(options.size));
  }
  Config config;
  HORO_RETURN_IF_ERROR(LoadConfigFromEnv(&config));
  SetLogLevel(config.log_level);
  SetLogHideTime(config.log_hide_time);
  std::unique_ptr<Runtime> rt(new Runtime(config, options.rank, options.size));
  if (hub) {
    if (hub->size() != options.size) {
      return Status::InvalidArgument("loopback hub has " + std::to_string(hub->size()) + " ranks, options say " +
                                     std::to_string(options.size));
    }
    rt->transport_ = std::make_unique<LoopbackTransport>(hub, options.rank, config.peer_timeout_seconds);
    rt->address_ = "loopback:" + std::to_string(options.rank);
  } else {
    if (options.secret == nullptr || options.secret_len == 0) {
      return Status::InvalidArgument("a job secret is required for TCP connections between ranks");
    }
    TcpOptions tcp;
    tcp.rank = options.rank;
    tcp.size = options.size;
    tcp.bind_host = options.bind_host ? options.bind_host : "127.0.0.1";
    tcp.secret.assign(reinterpret_cast<const char*>(options.secret), options.secret_len);
    tcp.connect_timeout_seconds = config.start_timeout_seconds;
    tcp.data_timeout_seconds = config.peer_timeout_seconds;
    std::unique_ptr<TcpTransport> transport;
    HORO_RETURN_IF_ERROR(TcpTransport::Listen(tcp, &transport));
    // Shared memory carries the data plane between ranks of one host; TCP carries the rest.
    ShmOptions shm;
    shm.enabled = !config.shm_disable;
    shm.host = config.hostname;
    shm.ring_bytes = static_cast<uint64_t>(config.shm_ring_bytes);
    shm.spin_microseconds = config.spin_microseconds;
    auto network = std::make_unique<ShmTransport>(std::move(transport), shm);
    rt->address_ = network->address();
    rt->network_ = network.get();
    rt->transport_ = std::move(network);
  }
  rt->timeline_ = std::make_unique<Timeline>(options.rank, options.size, !config.timeline.empty(), rt->transport_.get());
  rt->executor_ = std::make_unique<Executor>(config, options.rank, rt->transport_.get(), &rt->sets_, &rt->queue_,
                                             &rt->handles_, rt->timeline_.get());
  if (options.rank == 0) {
    rt->coordinator_ = std::make_unique<Coordinator>(config, options.size, &rt->sets_, &rt->cache_,
                                                     rt->timeline_.get());
    if (config.autotune) rt->tuner_ = std::make_unique<ParameterManager>(config, options.rank);
  }
  if (!config.timeline.empty() && config.timeline != "DYNAMIC") {
    // As in Horovod, a timeline that cannot be written does not stop the job.
    Status st = rt->timeline_->Start(config.timeline, config.timeline_mark_cycles, false);
    if (!st.ok()) HORO_LOG(kError, options.rank) << st.message() << "; no timeline will be written";
  }
  *out = std::move(rt);
  return Status::OK();
}

Runtime::~Runtime() { Shutdown(); }

Status Runtime::Connect(const std::vector<std::string>& addresses) {
  if (started_) return Status::InvalidArgument("runtime is already connected");
  if (network_ != nullptr) {
    if (static_cast<int>(addresses.size()) != size_) {
      return Status::InvalidArgument("connect needs one address per rank: expected " + std::to_string(size_) +
                                     ", got " + std::to_string(addresses.size()));
    }
    HORO_RETURN_IF_ERROR(network_->Connect(addresses));
  }
  callers_drive_ = config_.caller_progress && config_.spin_microseconds > 0 && transport_->CanWaitControl();
  // With more ranks on this host than it has CPUs online, a busy poll can only hold a core that a
  // peer needs: Drive never polls then (PollAllowed). The ranks of an in-process (loopback) world
  // are all threads of this process, whatever hosts it emulates.
  const std::vector<int> hosts = transport_->HostIds();
  const long local_ranks = network_ == nullptr || rank_ >= static_cast<int>(hosts.size())
                               ? size_
                               : std::count(hosts.begin(), hosts.end(), hosts[rank_]);
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  poll_allowed_ = callers_drive_ && cpus > 0 && local_ranks <= cpus;
  HORO_RETURN_IF_ERROR(DecidePeerAgreement());
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
  return Status::OK();
}

Status Runtime::StoppedStatus() {
  std::lock_guard<std::mutex> lock(stop_mutex_);
  // The coordinator's shutdown notice says so itself; say it once.
  static const std::string kPrefix = "Horo has been shut down: ";
  const std::string& reason = stop_reason_.message();
  return Status(stop_reason_.code() == HORO_ERR_SHUT_DOWN ? HORO_ERR_SHUT_DOWN : stop_reason_.code(),
                reason.compare(0, kPrefix.size(), kPrefix) == 0 ? reason : kPrefix + reason);
}

Status Runtime::ValidateTensor(OpType op, const horo_tensor_t& t, const horo_op_options_t& options) const {
  // Built only for an error message: a valid call, every step, allocates nothing here.
  auto label = [&] { return TensorLabel(op, t.name); };
  if (t.name == nullptr || t.name[0] == '\0') return Status::InvalidArgument(OpTypeName(op) + std::string(": tensor name is empty"));
  if (!IsValidDataType(t.dtype)) return Status::InvalidArgument(label() + ": unknown dtype " + std::to_string(t.dtype));
  if (t.ndim < 0 || t.ndim > HORO_MAX_DIMS) {
    return Status::InvalidArgument(label() + ": rank must be between 0 and 16, got " + std::to_string(t.ndim));
  }
  int64_t count = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return Status::InvalidArgument(label() + ": negative dimension " + std::to_string(t.shape[i]));
    count *= t.shape[i];
  }
  const DataType dtype = static_cast<DataType>(t.dtype);
  if (t.device != HORO_DEVICE_HOST) HORO_RETURN_IF_ERROR(executor_->CheckDeviceTensor(op, t, label()));
  if (count > 0 && t.input == nullptr) return Status::InvalidArgument(label() + ": input pointer is null");
  switch (op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter: {
      if (!IsValidReduceOp(options.reduce_op)) {
        return Status::InvalidArgument(label() + ": unknown reduce op " + std::to_string(options.reduce_op));
      }
      const ReduceOp rop = static_cast<ReduceOp>(options.reduce_op);
      if (rop == ReduceOp::kAdasum) {
        if (op != OpType::kAllreduce) return Status::Unsupported(label() + ": Adasum applies to allreduce only");
        if (!AdasumSupports(dtype)) {
          return Status::InvalidArgument(label() + ": Adasum is defined for float16, bfloat16, float32 and float64 "
                                         "tensors, got " + DataTypeName(dtype));
        }
        if (t.device != HORO_DEVICE_HOST) {
          return Status::Unsupported(label() + ": Adasum of CUDA tensors is not supported; pass host tensors");
        }
      }
      if (dtype == DataType::kBool && rop == ReduceOp::kAverage) {
        return Status::InvalidArgument(label() + ": Average is not defined for bool tensors; use Sum, Min or Max");
      }
      if (dtype == DataType::kBool && (options.prescale_factor != 1.0 || options.postscale_factor != 1.0)) {
        return Status::InvalidArgument(label() + ": scale factors are not defined for bool tensors");
      }
      if (op == OpType::kAllreduce && count > 0 && t.output == nullptr) {
        return Status::InvalidArgument(label() + ": output pointer is null");
      }
      break;
    }
    case OpType::kBroadcast:
      // Root validity is checked by the coordinator, so that every rank gets the error.
      if (count > 0 && t.output == nullptr) return Status::InvalidArgument(label() + ": output pointer is null");
      break;
    case OpType::kAllgather:  // scalars are refused by the coordinator, so that every rank gets the error
      break;
    case OpType::kAlltoall:
      // Splits (and scalars) are checked by the coordinator, so that every rank gets the error.
      if (options.num_splits < 0 || (options.num_splits > 0 && options.splits == nullptr)) {
        return Status::InvalidArgument(label() + ": splits pointer is null or num_splits is negative");
      }
      break;
    default:
      break;
  }
  return Status::OK();
}

namespace {

// Per calling thread, kept for its storage (Enqueue's Add moves the entries out). Behind a call that
// is not inlined: in a shared library every use of a thread_local calls __tls_get_addr, and the
// compiler looked the address up again after each call Enqueue makes (seven times per call).
[[gnu::noinline]] std::vector<TensorEntry>& ThreadEntries() {
  thread_local std::vector<TensorEntry> entries;
  return entries;
}

}  // namespace

Status Runtime::Enqueue(OpType op, const horo_tensor_t* tensors, int32_t count, const horo_op_options_t& options,
                        horo_handle_t* handles) {
  if (!started_) return Status(HORO_ERR_NOT_INITIALIZED, "runtime is not connected");
  if (stopped_) return StoppedStatus();
  if (!sets_.Contains(options.process_set_id, rank_)) {
    std::vector<int32_t> members;
    if (!sets_.Members(options.process_set_id, &members)) {
      return Status::InvalidArgument("process set " + std::to_string(options.process_set_id) + " does not exist");
    }
    return Status::InvalidArgument("rank " + std::to_string(rank_) + " is not a member of process set " +
                                   std::to_string(options.process_set_id));
  }
  std::vector<TensorEntry>& entries = ThreadEntries();
  entries.clear();
  if (op == OpType::kBarrier || op == OpType::kJoin) {
    TensorEntry e;
    e.request.op_type = op;
    e.request.rank = rank_;
    e.request.process_set_id = options.process_set_id;
    e.request.dtype = DataType::kUInt8;
    if (op == OpType::kJoin) {
      e.request.name = "join";
    } else {
      std::lock_guard<std::mutex> lock(counter_mutex_);
      e.request.name = "barrier." + std::to_string(barrier_counts_[options.process_set_id]++);
    }
    entries.push_back(std::move(e));
  } else {
    if (count < 1 || tensors == nullptr) return Status::InvalidArgument(std::string(OpTypeName(op)) + ": no tensors");
    for (int32_t i = 0; i < count; ++i) {
      const horo_tensor_t& t = tensors[i];
      HORO_RETURN_IF_ERROR(ValidateTensor(op, t, options));
      TensorEntry e;
      Request& r = e.request;
      r.rank = rank_;
      r.process_set_id = options.process_set_id;
      r.op_type = op;
      r.name = t.name;
      r.dtype = static_cast<DataType>(t.dtype);
      r.shape.assign(t.shape, t.shape + t.ndim);
      r.reduce_op = static_cast<ReduceOp>(options.reduce_op);
      r.prescale_factor = options.prescale_factor;
      r.postscale_factor = options.postscale_factor;
      r.root_rank = options.root_rank;
      if (op == OpType::kAlltoall && options.num_splits > 0) {
        r.splits.assign(options.splits, options.splits + options.num_splits);
      }
      if (count > 1) {
        r.group_leader = tensors[0].name;
        r.group_size = count;
      }
      e.input = t.input;
      e.request.input = t.input;
      e.output = t.output;
      r.device = t.device;
      if (t.device != HORO_DEVICE_HOST) e.ready_event = options.ready_event;
      entries.push_back(std::move(e));
    }
  }
  const size_t n = entries.size();
  for (size_t i = 0; i < n; ++i) handles[i] = entries[i].handle = handles_.Allocate();
  Status st = queue_.Add(&entries);
  if (!st.ok()) {
    for (size_t i = 0; i < n; ++i) handles_.Release(handles[i]);
    return st;
  }
  FailIfStoppedMeanwhile(handles, n);
  if (!callers_drive_ || !options.caller_waits) WakeBackground();
  return Status::OK();
}

void Runtime::FailIfStoppedMeanwhile(const horo_handle_t* handles, size_t count) {
  // Stop() sets stopped_ before failing the queued handles, so an entry added after that sweep is
  // seen here and failed instead of waiting forever.
  if (!stopped_) return;
  Status status = StoppedStatus();
  for (size_t i = 0; i < count; ++i) handles_.Complete(handles[i], status);
}

Status Runtime::ChangeProcessSet(bool add, const std::vector<int32_t>& ranks, int32_t id, horo_handle_t* handle) {
  if (!started_) return Status(HORO_ERR_NOT_INITIALIZED, "runtime is not connected");
  if (stopped_) return StoppedStatus();
  TensorEntry e;
  Request& r = e.request;
  r.kind = add ? RequestKind::kProcessSetAdd : RequestKind::kProcessSetRemove;
  r.rank = rank_;
  r.process_set_id = 0;
  if (add) {
    std::vector<int32_t> sorted = ranks;
    std::sort(sorted.begin(), sorted.end());
    if (sorted.empty()) return Status::InvalidArgument("a process set needs at least one rank");
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return Status::InvalidArgument("process set ranks contain a duplicate");
    }
    if (sorted.front() < 0 || sorted.back() >= size_) {
      return Status::InvalidArgument("process set ranks must be between 0 and " + std::to_string(size_ - 1));
    }
    r.ranks = sorted;
  } else {
    if (id == 0) return Status::InvalidArgument("the global process set cannot be removed");
    r.ranks.push_back(id);  // set changes are routed through set 0; the set to remove travels here
  }
  {
    std::lock_guard<std::mutex> lock(counter_mutex_);
    r.name = std::string(add ? "process_set_add." : "process_set_remove.") + std::to_string(set_change_count_++);
  }
  e.handle = handles_.Allocate();
  *handle = e.handle;
  std::vector<TensorEntry> entries;
  entries.push_back(std::move(e));
  Status st = queue_.Add(&entries);
  if (!st.ok()) {
    handles_.Release(*handle);
    return st;
  }
  FailIfStoppedMeanwhile(handle, 1);
  WakeBackground();
  return Status::OK();
}

// Who makes progress. The background thread exists so that collectives move while the user
// computes (backward passes enqueue gradients and wait for them much later). But when a caller
// blocks on a handle right away (a synchronous allreduce, synchronize() at the end of a step), the
// hand-offs between the caller and the background thread dominate small collectives: each one is
// a wake-up, and on a host with more busy threads than cores a spinning thread that waits for
// another steals the core that thread needs. So a waiting caller runs the loop's passes itself
// (Drive), one thread at a time under progress_mutex_, for as long as they make progress within
// the spin time; then it leaves the work to the background thread and sleeps on its handle.
//
// While callers drive, the background thread stays off the transport's doorbell (it parks on a
// condition variable with a short timeout), so that peers publishing to this rank need no system
// call to wake a thread that has nothing to do. Enqueue wakes it, unless the caller says it will
// wait at once (horo_op_options_t.caller_waits); a caller that gives up, or leaves requests
// behind, wakes it too. Without a transport that can wait without reading (CanWaitControl), the
// background thread alone runs the passes, blocking in PollControl as before.
//
// A driving caller that finds nothing to do yields its core (SpinRound): on a host with more ranks
// than cores, the peer it waits for may need that very core. Where every rank has a core, the
// system call only adds to a wait of a microsecond or two for a peer on another core; so before
// yielding a drive may busy-poll the control plane for a few microseconds at a time, while doing
// so keeps paying off (drives then finish without yielding at all), and seldom otherwise: ranks
// sharing a core never see a message arrive while they poll, and stop within a few calls. With
// more ranks on the host than CPUs online it never polls.
namespace {

constexpr auto kParkTime = std::chrono::milliseconds(1);  // background thread: recheck after a drive
// Drive's busy poll before it yields: CPU pauses, looking for a control message (or its handle
// done) every kPollPausesPerLook, for at most kPollTime (capped by HORO_SPIN_MICROSECONDS), about
// what a peer on another core takes to announce its next call, with margin. A drive polls again
// after each pass that moved something, until it finishes or a poll comes back empty and it
// yields. Polling paid off when the drive finished without yielding; each drive that did raises
// the score (up to kPollScoreMax), each that did not lowers it by kPollPenalty. At 0 a drive polls
// only as a probe, to notice when the peers have cores of their own again: after kPollProbeFirst
// drives, and twice as many after each probe that fails, up to kPollProbeLongest (on a shared core
// a probe holds the core the peer needs for the whole kPollTime).
constexpr auto kPollTime = std::chrono::microseconds(20);
constexpr int kPollPausesPerLook = 4;
constexpr int kPollScoreMax = 16;
constexpr int kPollPenalty = 4;
constexpr int kPollProbeFirst = 64;
constexpr int kPollProbeLongest = 8192;
// The background thread's longest sleep between passes, so that a request whose caller said it
// would wait (caller_waits) but does not is still negotiated soon.
constexpr int kLongestWaitMs = 8;
constexpr int64_t kStallCheckNs = 5000000;  // rank 0 looks for stalls at most this often
constexpr int64_t kCoordinatorWatchNs = 250000000;  // a worker looks at rank 0's silence this often

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Runtime::Loop() {
  using Clock = std::chrono::steady_clock;
  const auto spin = std::chrono::nanoseconds(static_cast<int64_t>(config_.spin_microseconds * 1e3));
  Clock::time_point spin_until = Clock::now();
  int wait_ms = kLongestWaitMs;
  while (true) {
    if (callers_drive_) BackgroundWait(spin_until, wait_ms);
    bool progress = false;
    {
      // While a caller drives, one holding the lock is already making progress: blocking on it
      // would only cost that caller a wake-up of this thread when it lets go.
      std::unique_lock<std::mutex> lock(progress_mutex_, std::defer_lock);
      if (callers_drive_ && drivers_.load(std::memory_order_relaxed) > 0) {
        if (!lock.try_lock()) continue;
      } else {
        lock.lock();
      }
      if (loop_ended_) return;
      if (!Pass(callers_drive_ ? 0 : poll_ms_, &progress)) {
        loop_ended_ = true;
        return;
      }
      // poll_ms_ and the timeline belong to whoever runs a pass: read them here, under the lock.
      wait_ms = std::min(kLongestWaitMs, timeline_->PollTimeoutMs(poll_ms_));
    }
    if (progress) {
      background_passes_.fetch_add(1, std::memory_order_relaxed);
      spin_until = Clock::now() + spin;
    }
  }
}

void Runtime::BackgroundWait(std::chrono::steady_clock::time_point spin_until, int wait_ms) {
  const bool recently_driven =
      drivers_.load() > 0 ||
      SteadyNanos() - last_drive_ns_.load() < std::chrono::duration_cast<std::chrono::nanoseconds>(kParkTime).count();
  if (recently_driven) {
    std::unique_lock<std::mutex> lock(park_mutex_);
    park_cv_.wait_for(lock, kParkTime, [this] { return park_wake_; });
    park_wake_ = false;
    return;
  }
  if (answer_owed_.load(std::memory_order_relaxed)) return;  // its message was read: the doorbell is quiet
  if (std::chrono::steady_clock::now() < spin_until) {
    SpinRound();
    return;
  }
  transport_->WaitControl(wait_ms);
}

void Runtime::WakeBackground() {
  {
    std::lock_guard<std::mutex> lock(park_mutex_);
    park_wake_ = true;
  }
  park_cv_.notify_one();
  transport_->Wake();
}

Status Runtime::Wait(int64_t handle, double timeout_seconds) {
  using Clock = std::chrono::steady_clock;
  if (std::isnan(timeout_seconds)) return Status::InvalidArgument("wait: the timeout is NaN");
  // Beyond this (infinity included) a timeout means no timeout: converted to clock ticks it would
  // overflow, and the wait would end at once.
  if (timeout_seconds > 1e6) timeout_seconds = -1;
  if (callers_drive_ && timeout_seconds != 0) {
    std::shared_ptr<const std::atomic<bool>> done = handles_.DoneFlag(handle);
    if (done && !done->load(std::memory_order_acquire)) {
      const bool forever = timeout_seconds < 0;
      const Clock::time_point start = forever ? Clock::time_point() : Clock::now();
      const Clock::time_point deadline =
          forever ? Clock::time_point::max()
                  : start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
      Drive(*done, deadline);
      double left = timeout_seconds;
      if (!forever) {
        left = std::max(0.0, timeout_seconds - std::chrono::duration<double>(Clock::now() - start).count());
      }
      return handles_.Wait(handle, left, /*spin=*/false);
    }
  }
  return handles_.Wait(handle, timeout_seconds);
}

void Runtime::Drive(const std::atomic<bool>& done, std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  const auto spin = std::chrono::nanoseconds(static_cast<int64_t>(config_.spin_microseconds * 1e3));
  drivers_.fetch_add(1);
  // The clock is read only while idle, and there only every kRoundsPerLook rounds (each round
  // yields the core, a microsecond or more): a loop of small collectives read it on every round
  // before, a measurable part of their cost. A timed wait looks at its deadline on every round.
  constexpr int kRoundsPerLook = 4;
  const bool timed = deadline != Clock::time_point::max();
  Clock::time_point idle_since;
  int idle_rounds = 0;
  const auto poll_time = std::min<Clock::duration>(kPollTime, spin);
  int poll = -1;         // whether this drive may busy-poll before yielding: -1 not asked yet, 0, 1
  bool may_poll = true;  // once per idle stretch: a poll that found something, whose pass then moved
                         // nothing (another thread of this rank holds the lock), yields next
  bool polled = false;   // it did
  int yields = 0;
  // A pass already under way is not interrupted (it may move a large collective), so a timed wait
  // can overrun its deadline by one pass; it never starts another after it.
  while (!done.load(std::memory_order_acquire) && !loop_ended_ && (!timed || Clock::now() < deadline)) {
    bool progress = false;
    // A pass with nothing queued and no control message would only poll: look first, cheaply.
    if (queue_.HasRequests() || transport_->ControlPending() || answer_owed_.load(std::memory_order_relaxed)) {
      std::unique_lock<std::mutex> lock(progress_mutex_, std::try_to_lock);
      if (lock.owns_lock() && !loop_ended_ && !Pass(0, &progress, &done)) loop_ended_ = true;
    }
    if (progress) {
      caller_passes_.fetch_add(1, std::memory_order_relaxed);
      idle_rounds = 0;
      may_poll = true;
      continue;
    }
    if (idle_rounds++ % kRoundsPerLook == 0) {
      const Clock::time_point now = Clock::now();
      if (idle_rounds == 1) {
        idle_since = now;
      } else if (now - idle_since >= spin) {
        break;
      }
    }
    if (may_poll && yields == 0 && !timed) {
      may_poll = false;
      if (poll < 0) poll = PollAllowed() ? 1 : 0;
      if (poll == 1) {
        polled = true;
        if (PollForMessage(done, poll_time)) continue;
      }
    }
    SpinRound();
    ++yields;
  }
  if (yields > 0) caller_yields_.fetch_add(yields, std::memory_order_relaxed);
  if (polled) caller_polls_.fetch_add(1, std::memory_order_relaxed);
  const bool finished = done.load(std::memory_order_acquire);
  if (polled) ScorePoll(finished && yields == 0);
  // A caller that finished will likely be back soon (a loop of synchronous collectives): the
  // background thread stays parked a little longer. One that gives up leaves it the work, and it
  // must listen to the doorbell again at once.
  last_drive_ns_.store(finished ? SteadyNanos() : 0);
  drivers_.fetch_sub(1);
  if (!finished || loop_ended_ || queue_.HasRequests()) {
    WakeBackground();
  } else if (answer_owed_.load(std::memory_order_relaxed)) {
    // The background thread may have looked at answer_owed_ just before it was set and be about
    // to sleep on the doorbell, which the message already read will not ring: ring it (no system
    // call unless it sleeps).
    transport_->Wake();
  }
}

bool Runtime::PollAllowed() {
  if (!poll_allowed_) return false;
  if (poll_score_.load(std::memory_order_relaxed) > 0) return true;
  return poll_skip_.fetch_sub(1, std::memory_order_relaxed) <= 0;  // a probe
}

bool Runtime::PollForMessage(const std::atomic<bool>& done, std::chrono::steady_clock::duration limit) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + limit;
  while (true) {
    for (int i = 0; i < kPollPausesPerLook; ++i) CpuRelax();
    if (done.load(std::memory_order_acquire) || transport_->ControlPending()) return true;
    if (Clock::now() >= until) return false;
  }
}

void Runtime::ScorePoll(bool paid_off) {
  int score = poll_score_.load(std::memory_order_relaxed);
  int next = 0;
  do {
    next = paid_off ? std::min(score + 1, kPollScoreMax) : std::max(score - kPollPenalty, 0);
  } while (!poll_score_.compare_exchange_weak(score, next, std::memory_order_relaxed));
  if (paid_off) {
    poll_backoff_.store(kPollProbeFirst, std::memory_order_relaxed);
  } else if (next == 0) {
    const int backoff = std::max(poll_backoff_.load(std::memory_order_relaxed), kPollProbeFirst);
    poll_skip_.store(backoff, std::memory_order_relaxed);
    poll_backoff_.store(std::min(backoff * 2, kPollProbeLongest), std::memory_order_relaxed);
  }
}

bool Runtime::Pass(int poll_ms, bool* progress, const std::atomic<bool>* caller_done) {
  const bool is_coordinator = rank_ == 0;
  // Kept between passes for their storage; the last pass's messages go back to the transport now
  // (their payloads' storage receives the next ones).
  std::vector<ControlMessage>& messages = pass_messages_;
  std::vector<int>& lost = pass_lost_;
  if (!messages.empty()) transport_->RecycleControl(&messages);
  lost.clear();
  Status st = transport_->PollControl(timeline_->PollTimeoutMs(poll_ms), &messages, &lost);
  if (!st.ok()) {
    ReportAndStop(st);
    return false;
  }
  if (cycle_time_ms_ > 0 && queue_.HasRequests()) {
    // Batching delay: let more tensors arrive so that they are negotiated and fused together.
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(cycle_time_ms_));
  }
  RequestList mine;
  std::vector<Request>& taken = taken_;
  queue_.TakeRequests(&taken);
  const bool took = !taken.empty();
  if (agreement_) {
    // Repeated tensors are announced to the peers instead (coordinator/peer_agreement.h); the
    // members of a grouped call are consecutive here and go one way together.
    for (size_t begin = 0, end = 0; begin < taken.size(); begin = end) {
      const Request& first = taken[begin];
      end = begin + 1;
      while (first.group_size > 1 && end < taken.size() && taken[end].group_leader == first.group_leader &&
             taken[end].process_set_id == first.process_set_id && end - begin < static_cast<size_t>(first.group_size)) {
        ++end;
      }
      const bool announced =
          first.group_size > 1
              ? end - begin == static_cast<size_t>(first.group_size) &&
                    agreement_->OfferGroup(std::vector<Request>(taken.begin() + begin, taken.begin() + end))
              : agreement_->Offer(&taken[begin]);
      if (announced) continue;
      for (size_t i = begin; i < end; ++i) mine.requests.push_back(std::move(taken[i]));
    }
  } else {
    mine.requests = std::move(taken);
  }
  mine.shutdown = shutdown_requested_ && !shutdown_sent_;
  shutdown_sent_ = shutdown_sent_ || mine.shutdown;
  *progress = took || mine.shutdown || !messages.empty() || !lost.empty();

  if (is_coordinator) {
    if (!mine.requests.empty() || mine.shutdown) coordinator_->AddRequests(0, mine);
    for (const ControlMessage& m : messages) {
      bool taken = false;
      if (!TakeRoundMessage(m, &taken)) return false;
      if (taken) continue;
      RequestList list;
      Status parsed = ParseRequestList(m.payload, &list);
      if (!parsed.ok()) {
        Stop(Status::Internal("rank " + std::to_string(m.peer) + " sent a malformed request list"), true);
        return false;
      }
      coordinator_->AddRequests(m.peer, list);
    }
    for (int r : lost) coordinator_->PeerLost(r);
    // Stalls are warned about after seconds: looking every few milliseconds is enough, and spares
    // a loop of small collectives building the list of waiting tensors on every pass.
    const int64_t now_ns = CoarseNanos();
    if (now_ns - last_stall_check_ns_ >= kStallCheckNs) {
      last_stall_check_ns_ = now_ns;
      poll_ms_ = coordinator_->CheckStalls(agreement_ ? agreement_->Waiting() : std::vector<StalledTensor>());
    }
    if (agreement_ && !AdvanceRounds(progress, caller_done)) return false;
    if (!RespondAsCoordinator(progress)) return false;
  } else {
    for (const ControlMessage& m : messages) {
      bool taken = false;
      if (!TakeRoundMessage(m, &taken)) return false;
      if (!taken && !ReceiveResponseList(m)) return false;
      // After the collectives the message started, which may have run long in this very call.
      if (m.peer == 0) heard_from_coordinator_ns_ = CoarseNanos();
    }
    // Only the coordinator's loss matters here (some transports also report other ranks; their
    // failures reach this rank through the coordinator or the data plane).
    if (std::find(lost.begin(), lost.end(), 0) != lost.end()) {
      StopAfterCoordinatorLoss("it exited or crashed");
      return false;
    }
    if (agreement_) {
      const int64_t rounds_done = agreement_->round_done();
      if (!AdvanceRounds(progress, caller_done)) return false;
      // A round completes with rank 0's message, and its steps may have run long just now.
      if (agreement_->round_done() != rounds_done) heard_from_coordinator_ns_ = CoarseNanos();
      if (agreement_->has_fallbacks()) {
        for (Request& r : agreement_->TakeFallbacks()) mine.requests.push_back(std::move(r));
      }
    }
    if (!mine.requests.empty() || mine.shutdown) {
      *progress = true;
      st = transport_->SendControl(0, SerializeRequestList(mine));
      if (!st.ok()) {
        StopAfterCoordinatorLoss(st.message());
        return false;
      }
    }
    if (!WatchCoordinator()) return false;
  }
  timeline_->Ship();
  return true;
}

Status Runtime::DecidePeerAgreement() {
  bool usable = config_.coordinator_free && config_.cache_capacity > 0 && !config_.autotune &&
                transport_->ControlToEveryPeer();
  if (network_ != nullptr && size_ > 1) {
    // Every rank must decide alike (a shared-memory link that failed for one pair, settings that
    // differ between ranks): rank 0 collects the answers on the data plane, idle until the loop
    // starts, and sends back whether all said yes.
    uint8_t yes = usable ? 1 : 0;
    if (rank_ == 0) {
      for (int peer = 1; peer < size_; ++peer) {
        uint8_t theirs = 0;
        HORO_RETURN_IF_ERROR(transport_->Recv(peer, &theirs, 1));
        yes = yes & theirs;
      }
      for (int peer = 1; peer < size_; ++peer) HORO_RETURN_IF_ERROR(transport_->Send(peer, &yes, 1));
    } else {
      HORO_RETURN_IF_ERROR(transport_->Send(0, &yes, 1));
      HORO_RETURN_IF_ERROR(transport_->Recv(0, &yes, 1));
    }
    usable = yes == 1;
  }
  if (usable) {
    agreement_ = std::make_unique<PeerAgreement>(rank_, size_, &cache_, &sets_);
  }
  return Status::OK();
}

bool Runtime::RespondAsCoordinator(bool* progress) {
  while (true) {
    if (agreement_ && agreement_->has_fallbacks()) {
      RequestList fallbacks;
      fallbacks.requests = agreement_->TakeFallbacks();
      coordinator_->AddRequests(0, fallbacks);
    }
    // In the middle of a round, a list would reach the workers after messages of a round that this
    // rank has not completed: only a failure's shutdown may go then, applied at once.
    ResponseList list;
    const bool mid_round = agreement_ && agreement_->mid_round();
    const bool built = mid_round ? coordinator_->BuildFailureShutdown(&list) : coordinator_->BuildResponses(&list);
    if (!built) return true;
    *progress = true;
    list.after_round = mid_round ? -1 : agreement_ ? agreement_->round_done() : 0;
    timeline_->MarkCycleStart();
    if (tuner_) TuneOnCoordinator(&list);
    const std::string bytes = SerializeResponseList(list);
    for (int peer = 1; peer < size_; ++peer) {
      Status sent = transport_->SendControl(peer, bytes);
      if (!sent.ok()) {
        HORO_LOG(kDebug, rank_) << "could not send responses to rank " << peer << ": " << sent.message();
      }
    }
    if (!Apply(list, false)) return false;
    if (!agreement_) return true;  // applying a list hands requests back only with peer agreement
  }
}

bool Runtime::AdvanceRounds(bool* progress, const std::atomic<bool>* caller_done) {
  while (true) {
    // Between two rounds, rank 0 first sends what the coordinator has (after this round, on every
    // rank), so that its lists are never held back by a stream of rounds.
    if (rank_ == 0 && !agreement_->mid_round() && !RespondAsCoordinator(progress)) return false;
    std::string& payload = round_payload_;
    // A round is answered late at most once: rank 0 may finish a coordinator-negotiated call in
    // the same pass as it answers, so without the limit a stream of them would put it off forever.
    const int64_t next_round = agreement_->round_done() + 1;
    const bool answer =
        caller_done == nullptr || !caller_done->load(std::memory_order_acquire) || deferred_round_ == next_round;
    if (!answer && agreement_->AnswerOwed()) deferred_round_ = next_round;
    if (agreement_->NextMessage(&payload, answer)) {
      *progress = true;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer == rank_) continue;
        Status sent = transport_->SendControl(peer, payload);
        if (sent.ok()) continue;
        // A peer that closed (it failed, died or is shutting down) needs no message: rank 0 learns
        // it and ends the job, or its shutdown is under way.
        if (peer != 0 && (sent.code() == HORO_ERR_PEER_LOST || sent.code() == HORO_ERR_SHUT_DOWN)) {
          HORO_LOG(kDebug, rank_) << "could not send a round message to rank " << peer << ": " << sent.message();
          continue;
        }
        // A live peer would wait for this message forever: fail, telling rank 0, which shuts every
        // rank down.
        if (rank_ != 0 && peer == 0) {
          StopAfterCoordinatorLoss(sent.message());
        } else {
          FailOnDataPlane(Status(sent.code(), "could not send a round message to rank " + std::to_string(peer) + ": " +
                                                 sent.message()));
        }
        return false;
      }
    }
    int64_t round = 0;
    if (!agreement_->RoundReady(&round)) break;
    *progress = true;
    // The round's steps became known now: their op phases (and QUEUE) begin here on the timeline,
    // not at the last coordinator list, which may be several steps old.
    timeline_->ResponsesArrived();
    // The coordinator's lists made before this round come first, as on every rank.
    while (!held_lists_.empty() && held_lists_.front().after_round < round) {
      ResponseList list = std::move(held_lists_.front());
      held_lists_.pop_front();
      if (!Apply(list, true)) return false;
    }
    std::vector<AgreedStep>& run = agreed_run_;
    agreement_->CompleteRound(&run);
    agreed_rounds_.fetch_add(1, std::memory_order_relaxed);
    for (const AgreedStep& step : run) {
      agreed_responses_.fetch_add(step.reduced ? 1 : static_cast<int64_t>(step.fused.size()), std::memory_order_relaxed);
      Status st = step.reduced ? executor_->ReduceContributions(*step.reduced, step.contributions)
                               : executor_->Execute(step.fused);
      if (!st.ok()) {
        FailOnDataPlane(st);
        return false;
      }
    }
  }
  while (!held_lists_.empty() && held_lists_.front().after_round <= agreement_->round_done()) {
    ResponseList list = std::move(held_lists_.front());
    held_lists_.pop_front();
    if (!Apply(list, true)) return false;
  }
  answer_owed_.store(agreement_->AnswerOwed(), std::memory_order_relaxed);
  return true;
}

bool Runtime::TakeRoundMessage(const ControlMessage& message, bool* taken) {
  *taken = agreement_ && IsRoundMessage(message.payload);
  if (!*taken) return true;
  Status received = agreement_->Receive(message.peer, message.payload);
  if (received.ok()) return true;
  ReportAndStop(received);
  return false;
}

bool Runtime::ReceiveResponseList(const ControlMessage& message) {
  ResponseList list;
  Status parsed = ParseResponseList(message.payload, &list);
  if (!parsed.ok()) {
    ReportAndStop(Status::Internal("malformed response list from the coordinator: " + parsed.message()));
    return false;
  }
  // A list waits for the round it follows, behind those already waiting, unless it must be applied
  // at once (after_round < 0: a failure).
  if (agreement_ && list.after_round >= 0 && (list.after_round > agreement_->round_done() || !held_lists_.empty())) {
    held_lists_.push_back(std::move(list));
    return true;
  }
  return Apply(list, true);
}

bool Runtime::ApplyMessage(const ControlMessage& message) {
  if (IsRoundMessage(message.payload)) return true;  // no more rounds once the coordinator is gone
  ResponseList list;
  Status parsed = ParseResponseList(message.payload, &list);
  if (!parsed.ok()) {
    Stop(Status::Internal("malformed response list from the coordinator: " + parsed.message()), true);
    return false;
  }
  // With peer agreement a list may belong after a round that will never complete now: only the
  // coordinator's last word (a shutdown, with its reason) is applied.
  Status reason;
  if (agreement_ && !ShutdownIn(list, &reason)) return true;
  return Apply(list, true);
}

bool Runtime::WatchCoordinator() {
  const int64_t now = CoarseNanos();
  if (now - last_coordinator_watch_ns_ < kCoordinatorWatchNs) return true;
  last_coordinator_watch_ns_ = now;
  std::string name;
  const int64_t oldest = queue_.OldestEnqueued(&name);
  if (oldest == 0) {
    coordinator_silence_warned_ = false;
    return true;
  }
  const double silent_s = static_cast<double>(now - std::max(oldest, heard_from_coordinator_ns_)) / 1e9;
  if (silent_s < config_.stall_check_time_seconds) coordinator_silence_warned_ = false;
  const bool warns = !config_.stall_check_disable && config_.stall_check_time_seconds > 0;
  if (warns && !coordinator_silence_warned_ && silent_s >= config_.stall_check_time_seconds) {
    coordinator_silence_warned_ = true;
    HORO_LOG(kWarning, rank_) << "tensor '" << name << "' has waited " << static_cast<int64_t>(silent_s)
                              << " s, and rank 0 (the coordinator) has sent this rank nothing meanwhile. Rank 0's "
                              << "stall warning names the ranks it waits for; if it logs none, rank 0 may be "
                              << "stopped or stuck";
  }
  const double limit = config_.stall_shutdown_time_seconds + config_.peer_timeout_seconds;
  if (config_.stall_shutdown_time_seconds > 0 && silent_s >= limit) {
    std::ostringstream os;
    os << "rank 0 (the coordinator) sent this rank nothing for " << static_cast<int64_t>(silent_s)
       << " s while tensor '" << name << "' waited; it is stopped or stuck (" << config_.VariableName("STALL_SHUTDOWN_TIME_SECONDS")
       << " + " << config_.VariableName("PEER_TIMEOUT_SECONDS") << " = " << limit << " s)";
    Stop(Status::PeerLost(os.str()), true);
    return false;
  }
  return true;
}

void Runtime::StopAfterCoordinatorLoss(const std::string& detail) {
  // A coordinator that fails sends the reason before it closes: read what is still in flight so
  // that the real cause, not the closed connection, reaches the user.
  std::vector<ControlMessage> messages;
  std::vector<int> lost;
  if (transport_->PollControl(200, &messages, &lost).ok()) {
    for (const ControlMessage& m : messages) {
      if (!ApplyMessage(m)) return;
    }
  }
  Stop(Status::PeerLost("lost the connection to the coordinator (rank 0): " + detail), true);
}

void Runtime::TuneOnCoordinator(ResponseList* list) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  tuner_->OnResponseList(list, std::chrono::duration<double, std::micro>(now).count());
  // A new threshold applies to the next list built, which is also the one that announces it.
  coordinator_->set_fusion_threshold_bytes(tuner_->parameters().fusion_threshold_bytes);
}

void Runtime::ApplyParameters(const TunedParameters& parameters) {
  cycle_time_ms_ = parameters.cycle_time_ms;
  executor_->set_small_message_bytes(parameters.small_message_bytes);
}

bool Runtime::Apply(ResponseList& list, bool parsed) {
  timeline_->ResponsesArrived();
  if (list.has_parameters) ApplyParameters(list.parameters);
  for (auto& parts : list.fused) {
    FusedResponse fused;
    for (ResponsePart& part : parts) {
      if (parsed && part.cache_id >= 0) {
        const Response* cached = cache_.Get(part.cache_id);
        if (cached == nullptr) {
          ReportAndStop(Status::Internal("response cache out of step: unknown id " + std::to_string(part.cache_id)));
          return false;
        }
        part.response = *cached;
      } else if (parsed && part.assign_id >= 0) {
        cache_.MirrorPut(part.assign_id, part.response);
      }
      fused.push_back(part.response);
    }
    const Response& head = fused.front();
    if (head.kind == ResponseKind::kShutdown) {
      Stop(Status(head.error_code, head.error_message), head.error_code != HORO_ERR_SHUT_DOWN);
      return false;
    }
    coordinator_responses_.fetch_add(static_cast<int64_t>(fused.size()), std::memory_order_relaxed);
    Status st = executor_->Execute(fused);
    if (!st.ok()) {
      FailOnDataPlane(st);
      return false;
    }
    if (agreement_ && head.kind == ResponseKind::kOp && head.op_type == OpType::kJoin) {
      agreement_->JoinDone(head.process_set_id);
    }
  }
  for (int64_t id : list.evicted_ids) {
    if (parsed) cache_.MirrorErase(id);
    if (agreement_) agreement_->Forget(id);
  }
  return true;
}

void Runtime::FailOnDataPlane(const Status& status) {
  if (rank_ == 0) {
    Stop(Status(status.code(), DiagnoseOnCoordinator(status)), true);
    return;
  }
  // A connection lost mid-transfer may be a consequence, and the peer it names innocent: rank 0,
  // having learned which rank died, tells every worker why and closes; a worker that lost the
  // coordinator stops and closes too. So before blaming the peer, look at the control plane for up
  // to kReasonWait: rank 0's reason (in this pass's messages, or drained from the control ring
  // while this rank waited) or rank 0's loss is the cause the user must see.
  if (status.code() == HORO_ERR_PEER_LOST || status.code() == HORO_ERR_SHUT_DOWN) {
    constexpr auto kReasonWait = std::chrono::milliseconds(50);
    Status reason;
    auto told = [&reason](const std::vector<ControlMessage>& messages) {
      for (const ControlMessage& m : messages) {
        ResponseList list;
        if (m.peer == 0 && !IsRoundMessage(m.payload) && ParseResponseList(m.payload, &list).ok() &&
            ShutdownIn(list, &reason)) {
          return true;
        }
      }
      return false;
    };
    bool found = told(pass_messages_);
    bool coordinator_lost = std::find(pass_lost_.begin(), pass_lost_.end(), 0) != pass_lost_.end();
    const auto deadline = std::chrono::steady_clock::now() + kReasonWait;
    while (!found && !coordinator_lost && std::chrono::steady_clock::now() < deadline) {
      std::vector<ControlMessage> messages;
      std::vector<int> lost;
      if (!transport_->PollControl(10, &messages, &lost).ok()) break;
      found = told(messages);
      coordinator_lost = std::find(lost.begin(), lost.end(), 0) != lost.end();
    }
    if (found) {
      Stop(reason, reason.code() != HORO_ERR_SHUT_DOWN);
      return;
    }
    if (coordinator_lost) {
      Stop(Status::PeerLost("lost the connection to the coordinator (rank 0): it exited or crashed (this rank "
                            "saw: " + status.message() + ")"),
           true);
      return;
    }
  }
  ReportAndStop(status);
}

void Runtime::ReportAndStop(const Status& status) {
  if (rank_ != 0) {
    // Tell the coordinator this rank failed (and why) before closing, so that it does not mistake
    // this rank for one that died, and every rank learns the cause.
    RequestList report;
    report.failure = status.message();
    transport_->SendControl(0, SerializeRequestList(report));
  }
  Stop(status, true);
}

std::string Runtime::DiagnoseOnCoordinator(const Status& local) {
  // A collective failed here because some peer went away. Its control connection tells whether it
  // died or failed in turn (then it reports why first): wait briefly for that before naming a cause.
  // A second, not less: on a loaded host this rank may be descheduled for a few hundred ms.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1000);
  while (!coordinator_->HasDeadRank() && std::chrono::steady_clock::now() < deadline) {
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    if (!transport_->PollControl(50, &messages, &lost).ok()) break;
    for (const ControlMessage& m : messages) {
      RequestList list;
      if (IsRoundMessage(m.payload) || !ParseRequestList(m.payload, &list).ok()) continue;
      coordinator_->AddRequests(m.peer, list);
    }
    for (int r : lost) coordinator_->PeerLost(r);
  }
  const std::string cause = coordinator_->DescribeUnexpectedLosses();
  return cause.empty() ? local.message() : cause + " (rank 0 saw: " + local.message() + ")";
}

void Runtime::Stop(const Status& reason, bool failure) {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_reason_ = reason;
  }
  stopped_ = true;
  if (failure) {
    HORO_LOG(kError, rank_) << reason.message();
  }
  Status handle_status(reason.code(), reason.code() == HORO_ERR_SHUT_DOWN ? reason.message()
                                                                           : "Horo has been shut down: " + reason.message());
  for (int64_t h : queue_.TakeAllHandles()) handles_.Complete(h, handle_status);
  handles_.FailAll(handle_status);
  timeline_->ShipFinal();
  if (rank_ == 0) {
    if (failure && !coordinator_->shut_down()) {
      // Tell every worker why before closing, so that none of them blames the coordinator.
      ResponseList list;
      ResponsePart part;
      part.response.kind = ResponseKind::kShutdown;
      part.response.error_code = reason.code();
      part.response.error_message = reason.message();
      list.fused.push_back({part});
      list.after_round = -1;  // at once, whatever round the workers are in
      const std::string bytes = SerializeResponseList(list);
      for (int peer = 1; peer < size_; ++peer) transport_->SendControl(peer, bytes);
    }
    Linger(failure ? 1.0 : 5.0);
  }
  // Closing makes every peer still waiting on this rank fail fast instead of timing out.
  transport_->Close();
}

void Runtime::Linger(double seconds) {
  // The coordinator closes last, after every worker has read the final responses and closed its
  // end; closing first could reset connections that still hold unread responses.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int open = size_ - 1 - coordinator_->lost_count();
  while (open > 0 && std::chrono::steady_clock::now() < deadline) {
    std::vector<ControlMessage> messages;
    std::vector<int> lost;
    if (!transport_->PollControl(100, &messages, &lost).ok()) break;
    for (const ControlMessage& m : messages) {
      RequestList list;  // the workers' last timeline events still reach the file
      if (IsRoundMessage(m.payload) || !ParseRequestList(m.payload, &list).ok()) continue;
      timeline_->Receive(m.peer, list.timeline);
    }
    open -= static_cast<int>(lost.size());
  }
}

Status Runtime::Shutdown() {
  // horo_runtime_shutdown and horo_runtime_destroy may run on two threads at once: one joins.
  std::lock_guard<std::mutex> one_at_a_time(shutdown_mutex_);
  if (started_ && thread_.joinable()) {
    shutdown_requested_ = true;
    WakeBackground();
    thread_.join();
  }
  if (timeline_) timeline_->Shutdown();
  if (transport_) transport_->Close();
  if (!stopped_) {
    stopped_ = true;
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stop_reason_ = Status::ShutDown("shutdown() was called");
    handles_.FailAll(Status::ShutDown("Horo has been shut down: shutdown() was called"));
  }
  return Status::OK();
}

Status Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  if (stopped_) return StoppedStatus();
  return timeline_->Start(path, mark_cycles, started_);
}

Status Runtime::StopTimeline() { return timeline_->Stop(started_); }

}  // namespace horo
