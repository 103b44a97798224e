/* A stand-in for libnccl.so.2 (tests only): reports version 2.29.7 (or what the calling thread set)
 * and, for ranks that are
 * threads of one process, really reduces (float32, int32, int64, float64, int8/uint8 with sum,
 * prod, max, min) and broadcasts, by meeting in a shared slot per communicator. Each call blocks
 * until every rank made it, which matches how the core issues them (same order on every rank). */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char internal[128]; } ncclUniqueId;

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int nranks, arrived;
  long generation;
  const void* send[64];
  void* recv[64];
} Shared;

typedef struct { Shared* shared; int rank; } Comm;

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static Shared* registry[256];
static int next_id = 1;
static int allreduce_calls = 0, broadcast_calls = 0, groups = 0;
static int aborted[64];         /* ncclCommAbort calls, by the communicator's rank */
static int async_error = 0;     /* what ncclCommGetAsyncError reports (0: none) */
static __thread int version = 22907;  /* per thread: ranks that are threads may differ */

int fake_nccl_allreduce_calls(void) { return allreduce_calls; }
int fake_nccl_broadcast_calls(void) { return broadcast_calls; }
int fake_nccl_groups(void) { return groups; }
int fake_nccl_aborted(int rank) { return rank >= 0 && rank < 64 ? __atomic_load_n(&aborted[rank], __ATOMIC_SEQ_CST) : 0; }
void fake_nccl_reset_aborted(void) { memset(aborted, 0, sizeof(aborted)); }
void fake_nccl_set_async_error(int r) { __atomic_store_n(&async_error, r, __ATOMIC_SEQ_CST); }
void fake_nccl_set_version(int v) { version = v; }

int ncclGetVersion(int* v) { *v = version; return 0; }
int ncclGetUniqueId(ncclUniqueId* id) {
  memset(id, 0, sizeof(*id));
  pthread_mutex_lock(&registry_mu);
  int n = next_id++;
  pthread_mutex_unlock(&registry_mu);
  memcpy(id->internal, &n, sizeof(n));
  return 0;
}
int ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
  int n;
  memcpy(&n, id.internal, sizeof(n));
  if (n <= 0 || n >= 256 || nranks > 64) return 4; /* ncclInvalidArgument */
  pthread_mutex_lock(&registry_mu);
  if (registry[n] == NULL) {
    registry[n] = calloc(1, sizeof(Shared));
    pthread_mutex_init(&registry[n]->mu, NULL);
    pthread_cond_init(&registry[n]->cv, NULL);
    registry[n]->nranks = nranks;
  }
  Comm* c = malloc(sizeof(Comm));
  c->shared = registry[n];
  c->rank = rank;
  pthread_mutex_unlock(&registry_mu);
  *comm = c;
  return 0;
}
int ncclCommAbort(void* comm) {
  Comm* c = (Comm*)comm;
  if (c != NULL && c->rank >= 0 && c->rank < 64) __atomic_add_fetch(&aborted[c->rank], 1, __ATOMIC_SEQ_CST);
  free(comm);
  return 0;
}
int ncclCommGetAsyncError(void* comm, int* r) { *r = __atomic_load_n(&async_error, __ATOMIC_SEQ_CST); return 0; }
int ncclGroupStart(void) { __atomic_add_fetch(&groups, 1, __ATOMIC_SEQ_CST); return 0; }
int ncclGroupEnd(void) { return 0; }
const char* ncclGetErrorString(int r) { return "fake NCCL error"; }

#define REDUCE(T)                                                                   \
  for (size_t i = 0; i < count; ++i) {                                             \
    T acc = ((const T*)s->send[0])[i];                                             \
    for (int r = 1; r < s->nranks; ++r) {                                          \
      T v = ((const T*)s->send[r])[i];                                             \
      acc = op == 0 ? acc + v : op == 1 ? acc * v : op == 2 ? (v > acc ? v : acc)  \
                                                        : (v < acc ? v : acc);     \
    }                                                                              \
    ((T*)out)[i] = acc;                                                            \
  }

static size_t size_of(int dtype) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2}; /* ncclInt8 ... ncclBfloat16 */
  return dtype >= 0 && dtype < 10 ? sizes[dtype] : 1;
}

/* Every rank deposits its buffers; the last to arrive computes for all and wakes the others. */
static int meet(Comm* c, const void* send, void* recv, size_t count, int dtype, int op, int root) {
  Shared* s = c->shared;
  pthread_mutex_lock(&s->mu);
  long gen = s->generation;
  s->send[c->rank] = send;
  s->recv[c->rank] = recv;
  if (++s->arrived == s->nranks) {
    size_t bytes = count * size_of(dtype);
    void* out = malloc(bytes ? bytes : 1);
    if (root >= 0) {
      memcpy(out, s->send[root], bytes);
    } else {
      switch (dtype) {
        case 0: REDUCE(int8_t) break;
        case 1: REDUCE(uint8_t) break;
        case 2: REDUCE(int32_t) break;
        case 4: REDUCE(int64_t) break;
        case 7: REDUCE(float) break;
        case 8: REDUCE(double) break;
        default: free(out); pthread_mutex_unlock(&s->mu); return 5;
      }
    }
    for (int r = 0; r < s->nranks; ++r) memcpy(s->recv[r], out, bytes);
    free(out);
    s->arrived = 0;
    s->generation++;
    pthread_cond_broadcast(&s->cv);
  } else {
    while (s->generation == gen) pthread_cond_wait(&s->cv, &s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  return 0;
}

int ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void* stream) {
  __atomic_add_fetch(&allreduce_calls, 1, __ATOMIC_SEQ_CST);
  return meet((Comm*)comm, send, recv, count, dtype, op, -1);
}
int ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root, void* comm, void* stream) {
  __atomic_add_fetch(&broadcast_calls, 1, __ATOMIC_SEQ_CST);
  return meet((Comm*)comm, send, recv, count, dtype, 0, root);
}
