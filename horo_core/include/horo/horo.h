/*
 * horo.h: the one public C surface of the Horo core.
 *
 * The region between the cdef markers is plain C that cffi's ffi.cdef() parses directly, so every
 * constant below reaches Python without being copied by hand. Rules for that region: no
 * preprocessor directives, explicit enum values that are only ever appended, and every function
 * returns horo_status_t with outputs through pointers. The message of the last failure on the
 * calling thread is available from horo_last_error().
 *
 * Lifecycle of a rank:
 *   horo_runtime_create()        opens the listening endpoint (TCP) or joins a loopback hub
 *   horo_runtime_address()       the "host:port" to publish through the rendezvous
 *   horo_runtime_connect()       connects to every peer and starts the background thread
 *   horo_enqueue() ... horo_wait() / horo_poll() ... horo_handle_result() ... horo_release()
 *   horo_runtime_shutdown()      fails outstanding handles, stops the thread, closes connections
 *   horo_runtime_destroy()       frees it all (or horo_runtime_close(), later horo_runtime_release())
 */
#ifndef HORO_HORO_H_
#define HORO_HORO_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef begin */

typedef int32_t horo_status_t;

enum horo_status_code {
  HORO_OK = 0,
  HORO_ERR_INVALID_ARGUMENT = 1, /* bad argument on this rank, detected before negotiation */
  HORO_ERR_NOT_INITIALIZED = 2,
  HORO_ERR_MISMATCH = 3,         /* ranks disagreed: shape, dtype, op, root, scale factors, splits */
  HORO_ERR_SHUT_DOWN = 4,        /* the runtime was shut down (explicitly, by a stall, or a failure) */
  HORO_ERR_PEER_LOST = 5,        /* a peer process died or its connection broke */
  HORO_ERR_TIMEOUT = 6,
  HORO_ERR_INTERNAL = 7,
  HORO_ERR_IN_PROGRESS = 8,      /* horo_wait with a timeout that expired */
  HORO_ERR_DUPLICATE_NAME = 9,   /* a tensor of that name is already in flight */
  HORO_ERR_AUTH = 10,            /* a connection failed the shared-secret challenge */
  HORO_ERR_UNSUPPORTED = 11,
  HORO_ERR_TENSOR_CHANGED = 12   /* horo_run_read: a tensor no longer matches its description; nothing
                                    was started, and the caller takes its general path */
};

enum horo_dtype {
  HORO_UINT8 = 0,
  HORO_INT8 = 1,
  HORO_INT16 = 2,
  HORO_INT32 = 3,
  HORO_INT64 = 4,
  HORO_FLOAT16 = 5,
  HORO_BFLOAT16 = 6,
  HORO_FLOAT32 = 7,
  HORO_FLOAT64 = 8,
  HORO_BOOL = 9,
  HORO_UINT16 = 10
};

/* Values match Horovod's ReduceOp so that integer constants keep their meaning. */
enum horo_reduce_op {
  HORO_OP_AVERAGE = 0,
  HORO_OP_SUM = 1,
  HORO_OP_ADASUM = 2,
  HORO_OP_MIN = 3,
  HORO_OP_MAX = 4,
  HORO_OP_PRODUCT = 5
};

enum horo_op_type {
  HORO_ALLREDUCE = 0,
  HORO_ALLGATHER = 1,
  HORO_BROADCAST = 2,
  HORO_ALLTOALL = 3,
  HORO_REDUCESCATTER = 4,
  HORO_BARRIER = 5,
  HORO_JOIN = 6
};

enum horo_limits {
  HORO_MAX_DIMS = 16,
  HORO_GLOBAL_PROCESS_SET = 0
};

/* horo_tensor_t.device: where input and output live. Zero (what a zero-filled struct holds) is host
 * memory; HORO_DEVICE_CUDA_BASE + d is the memory of CUDA device d of this process. */
enum horo_device {
  HORO_DEVICE_HOST = 0,
  HORO_DEVICE_CUDA_BASE = 1
};

typedef int64_t horo_handle_t;
typedef struct horo_runtime horo_runtime_t;
typedef struct horo_loopback_hub horo_loopback_hub_t;

typedef struct horo_init_options {
  int32_t rank;
  int32_t size;
  int32_t local_rank;
  int32_t local_size;
  int32_t cross_rank;
  int32_t cross_size;
  const char* bind_host;          /* TCP: interface address to listen on, e.g. "127.0.0.1" */
  const uint8_t* secret;          /* per-job key for the HMAC challenge on every connection */
  size_t secret_len;
  horo_loopback_hub_t* loopback;  /* non-NULL: ranks are threads of this process (tests) */
} horo_init_options_t;

/* One tensor of an enqueue call. output may be NULL for allgather, alltoall and reducescatter:
 * the core then allocates the result, read back with horo_handle_result(). Their size is known
 * only once the ranks have agreed, so for these an output is a guess of output_bytes bytes (the
 * last call's result, say): the result is written there exactly when horo_result_t.nbytes equals
 * output_bytes (horo_result_t.data is then NULL); otherwise the core allocates it as for a NULL
 * output. */
typedef struct horo_tensor {
  const char* name;
  const void* input;
  void* output;
  int32_t dtype;
  int32_t ndim;
  const int64_t* shape;
  int32_t device;           /* HORO_DEVICE_HOST (0) or HORO_DEVICE_CUDA_BASE + CUDA ordinal */
  int64_t output_bytes;     /* allgather, alltoall, reducescatter: the bytes at output (see above) */
} horo_tensor_t;

/* Options of one enqueue call; horo_op_options_init() fills the defaults. */
typedef struct horo_op_options {
  int32_t process_set_id;   /* default HORO_GLOBAL_PROCESS_SET */
  int32_t reduce_op;        /* default HORO_OP_SUM */
  double prescale_factor;   /* default 1.0 */
  double postscale_factor;  /* default 1.0 */
  int32_t root_rank;        /* broadcast: global rank of the root; default 0 */
  const int64_t* splits;    /* alltoall: rows sent to each member of the set, in set order */
  int32_t num_splits;       /* 0: equal splits */
  void* ready_event;        /* CUDA tensors: a CUevent recorded after the inputs were written, which the
                               core's device work waits on; NULL: the inputs are ready now */
  int32_t caller_waits;     /* 1: the caller waits on the handles at once (horo_wait), and that wait runs
                               the negotiation itself, so the background thread is not woken; default 0 */
} horo_op_options_t;

/* What a finished handle produced, for outputs the core allocated. */
typedef struct horo_result {
  const void* data;         /* valid until horo_release(); NULL if the caller gave the output */
  int64_t nbytes;           /* of the result, wherever it was written */
  int32_t ndim;
  int64_t shape[16];
  const int64_t* received_splits; /* alltoall: rows received from each member */
  int32_t num_received_splits;
  int32_t join_last_rank;   /* join: the last rank to join; -1 otherwise */
} horo_result_t;

/* What one rank's runtime has done since it was created (horo_runtime_stats). An allreduce
 * counts once per collective run, however many tensors were fused into it; an allgather once per
 * tensor (allgathers are not fused). Collectives of a one-member process set, and allreduces of
 * no elements, are not counted. */
typedef struct horo_runtime_stats {
  int64_t allreduce_recursive_doubling;  /* latency-optimal algorithm, small messages */
  int64_t allreduce_ring;
  int64_t allreduce_hierarchical;        /* inside hosts, then across them (sets spanning hosts) */
  int64_t bytes_sent_same_host;          /* data-plane bytes sent to peers on this rank's host */
  int64_t bytes_sent_other_hosts;        /* data-plane bytes sent to peers on other hosts */
  int64_t allgather_ring;
  int64_t allgather_hierarchical;        /* inside hosts, across them, inside again (sets spanning hosts) */
  int64_t passes_by_callers;             /* negotiation rounds that moved something, run by a thread
                                            waiting on a handle (HORO_CALLER_PROGRESS) ... */
  int64_t passes_by_background;          /* ... and by the background thread */
  int64_t responses_agreed_by_peers;     /* responses run after the ranks agreed on them without the
                                            coordinator (HORO_COORDINATOR_FREE: repeated tensors) ... */
  int64_t responses_from_coordinator;    /* ... and those the coordinator negotiated */
  int64_t allreduce_from_announcements;  /* small host allreduces agreed between the ranks, whose data
                                            came with the announcements and was reduced locally */
  int64_t rounds_agreed;                 /* rounds of that agreement completed: each takes a message
                                            from every rank (a loop of one synchronous repeated
                                            allreduce needs one per call) */
  int64_t caller_polls;                  /* waits of a driving caller that busy-polled before their
                                            first yield (while that pays off: ranks with cores of
                                            their own) ... */
  int64_t caller_yields;                 /* ... and the times a driving caller yielded its core */
  int64_t allgather_from_announcements;  /* small host allgathers agreed between the ranks, whose data
                                            came with the announcements (not counted in allgather_ring) */
  int64_t reducescatter_from_announcements; /* small host reducescatters agreed between the ranks,
                                               whose data came with the announcements */
  int64_t alltoall_from_announcements;   /* small host alltoalls agreed between the ranks, whose data
                                            came with the announcements */
  int64_t express_runs;                  /* synchronous allreduces and broadcasts of one small
                                            repeated tensor that the caller ran alone, without a
                                            queued entry (counted in allreduce_from_announcements or
                                            broadcast_from_announcements too) ... */
  int64_t express_handovers;             /* ... and those it began so and handed over to the queue,
                                            when the round brought other news or took longer than
                                            HORO_SPIN_MICROSECONDS */
  int64_t broadcast_from_announcements;  /* small host broadcasts agreed between the ranks, whose data
                                            came with the root's announcement */
} horo_runtime_stats_t;

/* One setting of the configuration table. */
typedef struct horo_setting {
  const char* name;          /* without prefix: HORO_<name> and HOROVOD_<name> are read */
  const char* type;          /* "int", "float", "bool", "string", "bytes" */
  const char* default_value;
  const char* value;         /* effective value as text */
  const char* doc;
} horo_setting_t;

const char* horo_last_error(void);
const char* horo_version(void);
const char* horo_cpu_features(void);
const char* horo_status_name(horo_status_t code);

horo_status_t horo_setting_count(int32_t* count);
horo_status_t horo_setting_get(int32_t index, horo_setting_t* out);

horo_status_t horo_loopback_hub_create(int32_t size, horo_loopback_hub_t** out);
horo_status_t horo_loopback_hub_destroy(horo_loopback_hub_t* hub);
/* A hub whose ranks act as if spread over hosts: ranks with equal host_ids[r] (size entries)
 * share a host. horo_loopback_hub_create puts every rank on one host. */
horo_status_t horo_loopback_hub_create_on_hosts(int32_t size, const int32_t* host_ids, horo_loopback_hub_t** out);
/* Failure injection for tests: puts len bytes into rank to's control inbox as if rank from had sent
 * them (a malformed or out-of-step message, which no real peer sends). */
horo_status_t horo_loopback_hub_deliver_control(horo_loopback_hub_t* hub, int32_t from, int32_t to,
                                                const void* payload, size_t len);

horo_status_t horo_runtime_create(const horo_init_options_t* options, horo_runtime_t** out);
horo_status_t horo_runtime_address(horo_runtime_t* rt, char* buffer, size_t buffer_len);
horo_status_t horo_runtime_connect(horo_runtime_t* rt, const char* const* addresses, int32_t count);
horo_status_t horo_runtime_shutdown(horo_runtime_t* rt);
horo_status_t horo_runtime_destroy(horo_runtime_t* rt);
/* horo_runtime_destroy in two steps, for a binding that keeps the handle in prepared calls (see
 * horo_run_at) that other threads may be making. horo_runtime_close shuts the runtime down, waits
 * for the calls in progress on other threads and frees everything but the handle, on which every
 * later call fails with HORO_ERR_SHUT_DOWN; a second close waits for the first. Once nothing
 * holds the handle, horo_runtime_release frees it; it leaves a handle that was not closed alone. */
horo_status_t horo_runtime_close(horo_runtime_t* rt);
horo_status_t horo_runtime_release(horo_runtime_t* rt);
/* In a process forked from the one that created rt: every later call on rt fails with
 * HORO_ERR_SHUT_DOWN, and nothing of it is touched (its threads and shared memory are the parent's). */
horo_status_t horo_runtime_forsake(horo_runtime_t* rt);

horo_status_t horo_runtime_rank(horo_runtime_t* rt, int32_t* rank);
horo_status_t horo_runtime_size(horo_runtime_t* rt, int32_t* size);
horo_status_t horo_runtime_stats(horo_runtime_t* rt, horo_runtime_stats_t* out);

/* CUDA tensors. horo_nccl_library_version loads the NCCL library at path (a file, or a bare name
 * such as "libnccl.so.2" that the dynamic linker searches) and gives its version code (22907 for
 * 2.29.7); it needs no GPU and fails with a message naming the path and the reason.
 * horo_cuda_enable loads the CUDA driver (libcuda.so.1) and, when nccl_path is not NULL or empty,
 * NCCL, and from then on accepts tensors with device != 0 for allreduce and broadcast. Every
 * member of a set must enable it before passing CUDA tensors; nccl_version gets the loaded NCCL
 * version, 0 when CUDA tensors will be staged through host memory by the core. */
horo_status_t horo_nccl_library_version(const char* path, int32_t* version);
horo_status_t horo_cuda_enable(horo_runtime_t* rt, const char* nccl_path, int32_t* nccl_version);

/* Process sets. Adding and removing are collective over all ranks of the global set. */
horo_status_t horo_process_set_add(horo_runtime_t* rt, const int32_t* ranks, int32_t count, int32_t* id);
horo_status_t horo_process_set_remove(horo_runtime_t* rt, int32_t id);
horo_status_t horo_process_set_rank(horo_runtime_t* rt, int32_t id, int32_t* rank);
horo_status_t horo_process_set_size(horo_runtime_t* rt, int32_t id, int32_t* size);
horo_status_t horo_process_set_ranks(horo_runtime_t* rt, int32_t id, int32_t* ranks, int32_t capacity, int32_t* count);

void horo_op_options_init(horo_op_options_t* options);

/* Enqueue count tensors of one operation. With count > 1 they form a group that is negotiated and
 * fused atomically. handles must hold count entries. */
horo_status_t horo_enqueue(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensors, int32_t count,
                           const horo_op_options_t* options, horo_handle_t* handles);

/* Announces that this rank cannot take part in the operation on the named tensors (count > 1: one
 * grouped call), for reason: an argument only this rank could check, such as a dtype its binding
 * cannot pass to the core. Once every member of the process set has submitted the names, the
 * coordinator fails them on every member with HORO_ERR_INVALID_ARGUMENT and a message naming this
 * rank and reason, so that the others do not wait for a tensor that will never come. The handles
 * (count entries) complete with that error. */
horo_status_t horo_refuse(horo_runtime_t* rt, int32_t op_type, const char* const* names, int32_t count,
                          int32_t process_set_id, const char* reason, horo_handle_t* handles);

/* Enqueue, wait and release in one call, for allreduce, broadcast and barrier (operations whose
 * outputs the caller gives): as horo_enqueue with options->caller_waits set, then horo_wait and
 * horo_release on every handle. Returns the first failure, with its message. */
horo_status_t horo_run(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensors, int32_t count,
                       const horo_op_options_t* options);

/* horo_run of one tensor described by tensor and options (kept by the caller and reused call after
 * call), whose input and output pointers are given as addresses instead: a binding then prepares
 * the description once per tensor and passes two integers per call. tensor->input and ->output are
 * ignored. The arguments a binding keeps come first, so that it can bind them once (Python's
 * functools.partial) and make each call with the two addresses alone. */
horo_status_t horo_run_at(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                          const horo_op_options_t* options, uintptr_t input, uintptr_t output);

/* Reading a framework's tensors in the core, for a binding that runs the same small collective on
 * the same tensor step after step. PyTorch exports a C interface for ahead-of-time compiled code
 * (the AOTInductor shim, torch/csrc/inductor/aoti_torch/c/shim.h); horo_tensor_reader_open loads
 * it from library_path, the libtorch_cpu library this process has already loaded. A tensor is
 * given by the address of its TensorImpl (Python's tensor._cdata); the binding checks first that
 * this is what the shim's handles point to. horo_tensor_reader_read describes a tensor: dtype and
 * device_type are torch's codes; HORO_ERR_UNSUPPORTED when torch cannot describe it (no storage or
 * no strides: sparse, a wrapper subclass) or it has more than HORO_MAX_DIMS dimensions. */
typedef struct horo_tensor_reader horo_tensor_reader_t;
typedef struct horo_tensor_facts {
  int32_t dtype;
  int32_t device_type;
  int32_t ndim;
  int32_t contiguous;       /* 1: contiguous in row-major order */
  int64_t shape[16];        /* HORO_MAX_DIMS */
  uintptr_t data;
} horo_tensor_facts_t;
horo_status_t horo_tensor_reader_open(const char* library_path, horo_tensor_reader_t** out);
horo_status_t horo_tensor_reader_free(horo_tensor_reader_t* reader);
horo_status_t horo_tensor_reader_read(const horo_tensor_reader_t* reader, uintptr_t tensor, horo_tensor_facts_t* out);

/* horo_run_at of tensors given as TensorImpl addresses, which reader reads: each must have
 * expected's dtype, device type and shape and be contiguous (expected: a reading of a tensor that
 * the binding described with tensor), else HORO_ERR_TENSOR_CHANGED, with nothing started. The
 * addresses the run reads and writes are their data pointers. */
horo_status_t horo_run_read(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                            const horo_op_options_t* options, const horo_tensor_reader_t* reader,
                            const horo_tensor_facts_t* expected, uintptr_t input, uintptr_t output);

/* horo_enqueue of one tensor described the same way (tensor->input and ->output ignored, the
 * addresses given instead): the asynchronous counterpart of horo_run_at, for a binding that
 * enqueues the same tensors step after step (gradients). */
horo_status_t horo_enqueue_at(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                              const horo_op_options_t* options, uintptr_t input, uintptr_t output,
                              horo_handle_t* handle);

/* horo_run_at for an operation whose result the core sizes (allgather, alltoall, reducescatter):
 * output and output_bytes are the guess of horo_tensor_t. On success *result describes the result,
 * and *handle is 0 when nothing is left to release: the result was written to output. Otherwise
 * *handle is the completed operation, whose result->data (the core's copy of the result, NULL when
 * it has no bytes) stays valid until the caller calls horo_release(*handle): release whenever
 * *handle is not 0. result->received_splits (an alltoall's) are the calling thread's copy, valid
 * until its next call of horo_run_result_at, whatever *handle is. On failure nothing is left to
 * release. */
horo_status_t horo_run_result_at(horo_runtime_t* rt, int32_t op_type, const horo_tensor_t* tensor,
                                 const horo_op_options_t* options, uintptr_t input, uintptr_t output,
                                 int64_t output_bytes, horo_result_t* result, horo_handle_t* handle);

horo_status_t horo_poll(horo_runtime_t* rt, horo_handle_t handle, int32_t* done);
/* horo_poll for a thread that polls in a loop (the user's poll()): while the handle is pending, the
 * calling thread runs one pass of negotiation and data movement itself, unless another thread of
 * this rank runs one, and yields its core when that moved nothing, so that a polling loop does not
 * starve the thread that would complete the handle. */
horo_status_t horo_poll_driving(horo_runtime_t* rt, horo_handle_t handle, int32_t* done);
/* Blocks until the handle completes or timeout_seconds pass (< 0, infinite or above 1e6: no limit;
 * NaN: HORO_ERR_INVALID_ARGUMENT); meanwhile the calling
 * thread may run the negotiation and the collective itself (HORO_CALLER_PROGRESS).
 * Returns the operation's status; a failure's message is in horo_last_error(). */
horo_status_t horo_wait(horo_runtime_t* rt, horo_handle_t handle, double timeout_seconds);
horo_status_t horo_handle_result(horo_runtime_t* rt, horo_handle_t handle, horo_result_t* out);
horo_status_t horo_release(horo_runtime_t* rt, horo_handle_t handle);

/* Timeline (Horovod's start_timeline / stop_timeline), called on every rank. Rank 0 writes a Chrome
 * trace JSON file at file_path holding the events of every rank; the other ranks ship theirs to it.
 * Start fails with HORO_ERR_INVALID_ARGUMENT unless HORO_TIMELINE (or HOROVOD_TIMELINE) was set, to
 * a path or DYNAMIC, when the runtime was created. Stop returns once rank 0 has closed the file
 * (a complete JSON array); stopping a timeline that is not running does nothing. */
horo_status_t horo_timeline_start(horo_runtime_t* rt, const char* file_path, int32_t mark_cycles);
horo_status_t horo_timeline_stop(horo_runtime_t* rt);

/* cdef end */

#ifdef __cplusplus
}
#endif

#endif /* HORO_HORO_H_ */
