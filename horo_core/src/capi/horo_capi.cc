// The extern "C" surface declared in horo/horo.h, apart from the collectives (horo_capi_ops.cc):
// the library's facts, settings, loopback hubs, the runtime's life, process sets, CUDA and the
// timeline. Every body runs inside HORO_API_BEGIN/END (api_call.h) so that no C++ exception
// crosses the boundary; failures set the calling thread's last error.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "capi/api_call.h"
#include "collectives/reduce_kernels.h"
#include "common/config.h"
#include "device/nccl_library.h"
#include "horo/horo.h"
#include "runtime/runtime.h"
#include "transport/loopback/transport.h"

struct horo_loopback_hub {
  std::shared_ptr<horo::LoopbackHub> impl;
};

namespace {

thread_local std::vector<horo::SettingInfo> t_settings;

}  // namespace

using horo_capi::Fail;
using horo_capi::SetError;
using horo_capi::t_last_error;

namespace {
bool MembersOf(horo_runtime_t* rt, int32_t id, std::vector<int32_t>* members) {
  return rt->impl->process_sets().Members(id, members);
}
}  // namespace

extern "C" {

const char* horo_last_error(void) { return t_last_error.c_str(); }

const char* horo_version(void) { return "0.1.0"; }

const char* horo_cpu_features(void) { return horo::KernelCpuFeatures(); }

const char* horo_status_name(horo_status_t code) {
  switch (code) {
    case HORO_OK: return "OK";
    case HORO_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case HORO_ERR_NOT_INITIALIZED: return "NOT_INITIALIZED";
    case HORO_ERR_MISMATCH: return "MISMATCH";
    case HORO_ERR_SHUT_DOWN: return "SHUT_DOWN";
    case HORO_ERR_PEER_LOST: return "PEER_LOST";
    case HORO_ERR_TIMEOUT: return "TIMEOUT";
    case HORO_ERR_INTERNAL: return "INTERNAL";
    case HORO_ERR_IN_PROGRESS: return "IN_PROGRESS";
    case HORO_ERR_DUPLICATE_NAME: return "DUPLICATE_NAME";
    case HORO_ERR_AUTH: return "AUTH";
    case HORO_ERR_UNSUPPORTED: return "UNSUPPORTED";
    default: return "UNKNOWN";
  }
}

horo_status_t horo_setting_count(int32_t* count) {
  HORO_API_BEGIN();
  horo::Config config;
  horo::Status st = horo::LoadConfigFromEnv(&config);
  if (!st.ok()) return SetError(st);
  t_settings = horo::DescribeConfig(config);
  *count = static_cast<int32_t>(t_settings.size());
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_setting_get(int32_t index, horo_setting_t* out) {
  HORO_API_BEGIN();
  if (t_settings.empty()) {
    int32_t count = 0;
    horo_status_t rc = horo_setting_count(&count);
    if (rc != HORO_OK) return rc;
  }
  if (index < 0 || index >= static_cast<int32_t>(t_settings.size())) {
    return Fail(HORO_ERR_INVALID_ARGUMENT, "setting index out of range");
  }
  const horo::SettingInfo& s = t_settings[index];
  out->name = s.name.c_str();
  out->type = s.type.c_str();
  out->default_value = s.default_value.c_str();
  out->value = s.value.c_str();
  out->doc = s.doc.c_str();
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_loopback_hub_create(int32_t size, horo_loopback_hub_t** out) {
  HORO_API_BEGIN();
  if (size < 1) return Fail(HORO_ERR_INVALID_ARGUMENT, "loopback hub size must be >= 1");
  auto* hub = new horo_loopback_hub;
  hub->impl = std::make_shared<horo::LoopbackHub>(size);
  *out = hub;
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_loopback_hub_create_on_hosts(int32_t size, const int32_t* host_ids, horo_loopback_hub_t** out) {
  HORO_API_BEGIN();
  if (out == nullptr || (size > 0 && host_ids == nullptr)) return Fail(HORO_ERR_INVALID_ARGUMENT, "null argument");
  if (size < 1) return Fail(HORO_ERR_INVALID_ARGUMENT, "loopback hub size must be >= 1");
  std::vector<int> hosts(host_ids, host_ids + size);
  auto* hub = new horo_loopback_hub;
  hub->impl = std::make_shared<horo::LoopbackHub>(size, std::move(hosts));
  *out = hub;
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_loopback_hub_deliver_control(horo_loopback_hub_t* hub, int32_t from, int32_t to,
                                                const void* payload, size_t len) {
  HORO_API_BEGIN();
  if (hub == nullptr || (len > 0 && payload == nullptr)) return Fail(HORO_ERR_INVALID_ARGUMENT, "null argument");
  const int size = hub->impl->size();
  if (from < 0 || from >= size || to < 0 || to >= size || from == to) {
    return Fail(HORO_ERR_INVALID_ARGUMENT, "loopback control message from rank " + std::to_string(from) + " to rank " +
                                               std::to_string(to) + " in a hub of " + std::to_string(size) + " ranks");
  }
  horo::ControlMessage message;
  message.peer = from;
  message.payload.assign(static_cast<const char*>(payload), len);
  return SetError(hub->impl->mailbox(to).Deliver(std::move(message)));
  HORO_API_END();
}

horo_status_t horo_loopback_hub_destroy(horo_loopback_hub_t* hub) {
  HORO_API_BEGIN();
  delete hub;
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_create(const horo_init_options_t* options, horo_runtime_t** out) {
  HORO_API_BEGIN();
  if (options == nullptr || out == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null argument");
  std::shared_ptr<horo::LoopbackHub> hub = options->loopback ? options->loopback->impl : nullptr;
  std::unique_ptr<horo::Runtime> impl;
  horo::Status st = horo::Runtime::Create(*options, hub, &impl);
  if (!st.ok()) return SetError(st);
  auto* rt = new horo_runtime;
  rt->impl = std::move(impl);
  *out = rt;
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_address(horo_runtime_t* rt, char* buffer, size_t buffer_len) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  const std::string& a = rt->impl->address();
  if (buffer_len < a.size() + 1) return Fail(HORO_ERR_INVALID_ARGUMENT, "address buffer too small");
  std::memcpy(buffer, a.c_str(), a.size() + 1);
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_connect(horo_runtime_t* rt, const char* const* addresses, int32_t count) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  std::vector<std::string> list;
  for (int32_t i = 0; i < count; ++i) list.emplace_back(addresses[i] ? addresses[i] : "");
  return SetError(rt->impl->Connect(list));
  HORO_API_END();
}

horo_status_t horo_runtime_shutdown(horo_runtime_t* rt) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  return SetError(rt->impl->Shutdown());
  HORO_API_END();
}

horo_status_t horo_runtime_close(horo_runtime_t* rt) {
  HORO_API_BEGIN();
  if (rt == nullptr) return HORO_OK;
  std::unique_lock<std::mutex> lock(rt->mutex);
  if (rt->closed) {  // closed, or closing on another thread: wait for it to end
    rt->idle.wait(lock, [rt] { return rt->freed.load(); });
    return HORO_OK;
  }
  rt->closed = true;
  rt->closing.store(true);  // refuse new calls; the ones already admitted are counted
  lock.unlock();
  // Shutting down completes every handle, so calls blocked in horo_wait return; then wait for
  // every call still inside the API before freeing.
  rt->impl->Shutdown();
  lock.lock();
  rt->idle.wait(lock, [rt] { return rt->in_flight.load() == 0; });
  rt->impl.reset();
  rt->freed.store(true);
  rt->idle.notify_all();
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_release(horo_runtime_t* rt) {
  HORO_API_BEGIN();
  // No lock: in a process forked while another thread held the mutex, it stays held for good.
  if (rt != nullptr && rt->freed.load()) delete rt;
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_forsake(horo_runtime_t* rt) {
  HORO_API_BEGIN();
  if (rt != nullptr) rt->closing.store(true);
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_destroy(horo_runtime_t* rt) {
  HORO_API_BEGIN();
  if (rt == nullptr) return HORO_OK;
  const horo_status_t status = horo_runtime_close(rt);
  if (status != HORO_OK) return status;
  delete rt;
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_rank(horo_runtime_t* rt, int32_t* rank) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  *rank = rt->impl->rank();
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_size(horo_runtime_t* rt, int32_t* size) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  *size = rt->impl->size();
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_runtime_stats(horo_runtime_t* rt, horo_runtime_stats_t* out) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (out == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "null argument");
  const horo::ExecutorStats stats = rt->impl->stats();
  out->allreduce_recursive_doubling =
      stats.allreduce_runs[static_cast<int>(horo::AllreduceAlgorithm::kRecursiveDoubling)];
  out->allreduce_ring = stats.allreduce_runs[static_cast<int>(horo::AllreduceAlgorithm::kRing)];
  out->allreduce_hierarchical = stats.allreduce_runs[static_cast<int>(horo::AllreduceAlgorithm::kHierarchical)];
  out->bytes_sent_same_host = stats.sent.same_host;
  out->bytes_sent_other_hosts = stats.sent.other_hosts;
  out->allgather_ring = stats.allgather_runs[static_cast<int>(horo::AllgatherAlgorithm::kRing)];
  out->allgather_hierarchical = stats.allgather_runs[static_cast<int>(horo::AllgatherAlgorithm::kHierarchical)];
  rt->impl->CountPasses(&out->passes_by_callers, &out->passes_by_background, &out->caller_polls, &out->caller_yields);
  rt->impl->CountResponses(&out->responses_agreed_by_peers, &out->responses_from_coordinator, &out->rounds_agreed);
  out->allreduce_from_announcements = stats.allreduce_from_announcements;
  out->allgather_from_announcements = stats.allgather_from_announcements;
  out->reducescatter_from_announcements = stats.reducescatter_from_announcements;
  out->alltoall_from_announcements = stats.alltoall_from_announcements;
  out->broadcast_from_announcements = stats.broadcast_from_announcements;
  rt->impl->CountExpress(&out->express_runs, &out->express_handovers);
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_process_set_add(horo_runtime_t* rt, const int32_t* ranks, int32_t count, int32_t* id) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  std::vector<int32_t> list(ranks, ranks + count);
  horo_handle_t handle = 0;
  horo::Status st = rt->impl->ChangeProcessSet(true, list, 0, &handle);
  if (!st.ok()) return SetError(st);
  st = rt->impl->Wait(handle, -1);
  if (st.ok()) *id = rt->impl->handles().Result(handle)->value;
  rt->impl->handles().Release(handle);
  return SetError(st);
  HORO_API_END();
}

horo_status_t horo_process_set_remove(horo_runtime_t* rt, int32_t id) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  horo_handle_t handle = 0;
  horo::Status st = rt->impl->ChangeProcessSet(false, {}, id, &handle);
  if (!st.ok()) return SetError(st);
  st = rt->impl->Wait(handle, -1);
  rt->impl->handles().Release(handle);
  return SetError(st);
  HORO_API_END();
}

horo_status_t horo_process_set_rank(horo_runtime_t* rt, int32_t id, int32_t* rank) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  std::vector<int32_t> members;
  if (!MembersOf(rt, id, &members)) return Fail(HORO_ERR_INVALID_ARGUMENT, "process set " + std::to_string(id) + " does not exist");
  *rank = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rt->impl->rank()) *rank = static_cast<int32_t>(i);
  }
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_process_set_size(horo_runtime_t* rt, int32_t id, int32_t* size) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  std::vector<int32_t> members;
  if (!MembersOf(rt, id, &members)) return Fail(HORO_ERR_INVALID_ARGUMENT, "process set " + std::to_string(id) + " does not exist");
  *size = static_cast<int32_t>(members.size());
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_process_set_ranks(horo_runtime_t* rt, int32_t id, int32_t* ranks, int32_t capacity, int32_t* count) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  std::vector<int32_t> members;
  if (!MembersOf(rt, id, &members)) return Fail(HORO_ERR_INVALID_ARGUMENT, "process set " + std::to_string(id) + " does not exist");
  *count = static_cast<int32_t>(members.size());
  for (int32_t i = 0; i < *count && i < capacity; ++i) ranks[i] = members[i];
  return HORO_OK;
  HORO_API_END();
}

horo_status_t horo_nccl_library_version(const char* path, int32_t* version) {
  HORO_API_BEGIN();
  if (version == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "version pointer is null");
  horo::NcclLibrary library;
  horo::Status st = horo::NcclLibrary::Load(path ? path : "", &library);
  *version = st.ok() ? library.version() : 0;
  return SetError(st);
  HORO_API_END();
}

horo_status_t horo_cuda_enable(horo_runtime_t* rt, const char* nccl_path, int32_t* nccl_version) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (nccl_version == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "nccl_version pointer is null");
  *nccl_version = 0;
  return SetError(rt->impl->EnableCuda(nccl_path ? nccl_path : "", nccl_version));
  HORO_API_END();
}

horo_status_t horo_timeline_start(horo_runtime_t* rt, const char* file_path, int32_t mark_cycles) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  if (file_path == nullptr) return Fail(HORO_ERR_INVALID_ARGUMENT, "start_timeline: file_path is null");
  return SetError(rt->impl->StartTimeline(file_path, mark_cycles != 0));
  HORO_API_END();
}

horo_status_t horo_timeline_stop(horo_runtime_t* rt) {
  HORO_API_BEGIN();
  HORO_REQUIRE_RUNTIME(rt);
  return SetError(rt->impl->StopTimeline());
  HORO_API_END();
}

}  // extern "C"
