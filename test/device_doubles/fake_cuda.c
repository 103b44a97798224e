/* A stand-in for libcuda.so.1 on machines without a GPU (tests only). "Device memory" is host
 * memory, copies are memcpy, streams finish at once (unless a test says they never do). Device d
 * reports UUID bytes all equal to d + 1, so ranks that pick the same ordinal look like ranks sharing
 * one GPU. */
#include <stdlib.h>
#include <string.h>

static int event_waits = 0;
static int streams_busy = 0;  /* set: no stream ever finishes (a collective that hangs) */
int fake_cuda_event_waits(void) { return event_waits; }
void fake_cuda_set_streams_busy(int busy) { __atomic_store_n(&streams_busy, busy, __ATOMIC_SEQ_CST); }

int cuInit(unsigned int flags) { return 0; }
int cuDeviceGetCount(int* n) { *n = 2; return 0; }
int cuDeviceGet(int* d, int ordinal) { *d = ordinal; return 0; }
int cuDeviceGetUuid(unsigned char* uuid, int d) { memset(uuid, d + 1, 16); return 0; }
int cuDevicePrimaryCtxRetain(void** ctx, int d) { *ctx = (void*)(long)(d + 1); return 0; }
static __thread void* current_context = 0;
int cuCtxSetCurrent(void* ctx) { current_context = ctx; return 0; }
int cuCtxGetCurrent(void** ctx) { *ctx = current_context; return 0; }
int cuStreamCreate(void** s, unsigned int flags) { *s = malloc(1); return 0; }
int cuStreamWaitEvent(void* s, void* e, unsigned int flags) { __atomic_add_fetch(&event_waits, 1, __ATOMIC_SEQ_CST); return 0; }
int cuStreamQuery(void* s) { return __atomic_load_n(&streams_busy, __ATOMIC_SEQ_CST) ? 600 : 0; } /* NOT_READY */
int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t n, void* s) { memcpy(dst, (void*)src, n); return 0; }
int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t n, void* s) { memcpy((void*)dst, src, n); return 0; }
int cuMemHostAlloc(void** p, size_t n, unsigned int flags) { *p = malloc(n); return *p ? 0 : 2; }
int cuMemFreeHost(void* p) { free(p); return 0; }
int cuGetErrorName(int r, const char** s) { *s = "FAKE_ERROR"; return 0; }
int cuGetErrorString(int r, const char** s) { *s = "fake driver"; return 0; }
