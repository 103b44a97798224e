// Runtime, part 1 of 5: creation, connection, validating and enqueueing collectives, shutdown.
// The rest: runtime_progress.cc, runtime_negotiation.cc, runtime_failure.cc.
#include "runtime/runtime.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "collectives/adasum.h"
#include "common/logging.h"
#include "transport/loopback/transport.h"
#include "transport/shm/transport.h"
#include "transport/tcp/transport.h"

namespace horo {
namespace {

std::string TensorLabel(OpType op, const char* name) {
  return std::string(OpTypeName(op)) + " tensor '" + (name ? name : "") + "'";
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
  for (const std::string& note : config.notes) HORO_LOG(kWarning, options.rank) << note;
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
  if (t.device != HORO_DEVICE_HOST) HORO_RETURN_IF_ERROR(executor_->CheckDeviceTensor(op, t, label()));
  if (count > 0 && t.input == nullptr) return Status::InvalidArgument(label() + ": input pointer is null");
  switch (op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter: {
      if (!IsValidReduceOp(options.reduce_op)) {
        return Status::InvalidArgument(label() + ": unknown reduce op " + std::to_string(options.reduce_op));
      }
      // Whether the op is defined for the dtype (Adasum of integers, Average of bools...) is the
      // coordinator's check (request_checks.h), so that a rank that alone passed such a tensor
      // fails with the others instead of leaving them waiting.
      const ReduceOp rop = static_cast<ReduceOp>(options.reduce_op);
      if (rop == ReduceOp::kAdasum && t.device != HORO_DEVICE_HOST) {
        return Status::Unsupported(label() + ": Adasum of CUDA tensors is not supported; pass host tensors");
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
  HORO_RETURN_IF_ERROR(CheckCanSubmit(options.process_set_id));
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
      Status valid = ValidateTensor(op, t, options);
      if (!valid.ok()) return RefuseInvalid(op, tensors, count, options.process_set_id, valid, handles);
      TensorEntry e;
      Request& r = e.request;
      DescribeRequest(op, t, options, &r);
      if (count > 1) {
        r.group_leader = tensors[0].name;
        r.group_size = count;
      }
      e.input = t.input;
      e.output = t.output;
      e.output_bytes = t.output_bytes;
      if (t.device != HORO_DEVICE_HOST) e.ready_event = options.ready_event;
      entries.push_back(std::move(e));
    }
  }
  HORO_RETURN_IF_ERROR(Submit(&entries, handles));
  WakeAfterEnqueue(options.caller_waits != 0);
  return Status::OK();
}

void Runtime::DescribeRequest(OpType op, const horo_tensor_t& t, const horo_op_options_t& options,
                              Request* r) const {
  r->kind = RequestKind::kTensor;
  r->rank = rank_;
  r->process_set_id = options.process_set_id;
  r->op_type = op;
  r->name.assign(t.name);
  r->dtype = static_cast<DataType>(t.dtype);
  r->shape.assign(t.shape, t.shape + t.ndim);
  r->reduce_op = static_cast<ReduceOp>(options.reduce_op);
  r->prescale_factor = options.prescale_factor;
  r->postscale_factor = options.postscale_factor;
  r->root_rank = options.root_rank;
  if (op == OpType::kAlltoall && options.num_splits > 0) {
    r->splits.assign(options.splits, options.splits + options.num_splits);
  } else {
    r->splits.clear();
  }
  r->group_leader.clear();
  r->group_size = 1;
  r->ranks.clear();
  r->device = t.device;
  r->refusal.clear();
  r->input = t.input;
}

Status Runtime::Submit(std::vector<TensorEntry>* entries, horo_handle_t* handles) {
  const size_t n = entries->size();
  for (size_t i = 0; i < n; ++i) handles[i] = (*entries)[i].handle = handles_.Allocate();
  Status st = queue_.Add(entries);
  if (!st.ok()) {
    for (size_t i = 0; i < n; ++i) handles_.Release(handles[i]);
    return st;
  }
  FailIfStoppedMeanwhile(handles, n);
  return Status::OK();
}

Status Runtime::CheckCanSubmit(int32_t set_id) {
  if (!started_) return Status(HORO_ERR_NOT_INITIALIZED, "runtime is not connected");
  if (stopped_) return StoppedStatus();
  if (!sets_.Contains(set_id, rank_)) {
    std::vector<int32_t> members;
    if (!sets_.Members(set_id, &members)) {
      return Status::InvalidArgument("process set " + std::to_string(set_id) + " does not exist");
    }
    return Status::InvalidArgument("rank " + std::to_string(rank_) + " is not a member of process set " +
                                   std::to_string(set_id));
  }
  return Status::OK();
}

Status Runtime::Refuse(OpType op, const char* const* names, int32_t count, int32_t set_id, const std::string& reason,
                       horo_handle_t* handles) {
  HORO_RETURN_IF_ERROR(CheckCanSubmit(set_id));
  if (count < 1 || names == nullptr) return Status::InvalidArgument("refuse: no tensor names");
  if (reason.empty()) return Status::InvalidArgument("refuse: the reason is empty");
  if (op == OpType::kBarrier || op == OpType::kJoin) {
    return Status::InvalidArgument(std::string("refuse: ") + OpTypeName(op) + " carries no tensors to refuse");
  }
  std::vector<TensorEntry> entries(count);
  for (int32_t i = 0; i < count; ++i) {
    if (names[i] == nullptr) return Status::InvalidArgument("refuse: tensor name " + std::to_string(i) + " is null");
    Request& r = entries[i].request;
    r.rank = rank_;
    r.process_set_id = set_id;
    r.op_type = op;
    r.name = names[i];
    r.dtype = DataType::kUInt8;
    r.refusal = reason;
    if (count > 1) {
      r.group_leader = names[0];
      r.group_size = count;
    }
  }
  HORO_RETURN_IF_ERROR(Submit(&entries, handles));
  WakeBackground();
  return Status::OK();
}

Status Runtime::RefuseInvalid(OpType op, const horo_tensor_t* tensors, int32_t count, int32_t set_id,
                              const Status& invalid, horo_handle_t* handles) {
  if (invalid.code() != HORO_ERR_INVALID_ARGUMENT) return invalid;
  std::vector<const char*> names;
  for (int32_t i = 0; i < count; ++i) {
    // Device tensors' errors (a device this rank does not have) stay this rank's, at once, where
    // its devices are set up.
    if (tensors[i].name == nullptr || tensors[i].name[0] == '\0' || tensors[i].device != HORO_DEVICE_HOST) {
      return invalid;
    }
    names.push_back(tensors[i].name);
  }
  // "allreduce tensor 'x': unknown reduce op 99": the coordinator's message names the tensor itself.
  std::string reason = "passed an invalid argument: " + invalid.message();
  for (int32_t i = 0; i < count; ++i) {
    const std::string label = TensorLabel(op, tensors[i].name) + ": ";
    if (invalid.message().compare(0, label.size(), label) == 0) {
      reason = "passed an invalid argument" + (count > 1 ? " for '" + std::string(tensors[i].name) + "'" : "") +
               ": " + invalid.message().substr(label.size());
      break;
    }
  }
  return Refuse(op, names.data(), count, set_id, reason, handles);
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
    auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    if (twice != sorted.end()) {
      return Status::InvalidArgument("process set ranks contain rank " + std::to_string(*twice) + " twice");
    }
    if (sorted.front() < 0 || sorted.back() >= size_) {
      const int32_t outside = sorted.front() < 0 ? sorted.front() : sorted.back();
      return Status::InvalidArgument("process set ranks must be between 0 and " + std::to_string(size_ - 1) +
                                     ", got " + std::to_string(outside));
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
  // A timeline that the settings never enabled is the caller's error on every rank, whether or not
  // the job has already stopped on this one.
  if (stopped_ && timeline_->api_enabled()) return StoppedStatus();
  return timeline_->Start(path, mark_cycles, started_);
}

Status Runtime::StopTimeline() { return timeline_->Stop(started_); }

}  // namespace horo
