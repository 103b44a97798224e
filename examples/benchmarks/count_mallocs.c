/* Counts malloc calls per process, to see what one collective allocates on the hot path.
 *
 *   gcc -O2 -shared -fPIC -o /tmp/count_mallocs.so examples/benchmarks/count_mallocs.c
 *   COUNT_MALLOCS=1 LD_PRELOAD=/tmp/count_mallocs.so \
 *       hororun -np 2 python examples/benchmarks/tight_loop.py --blocks 1 --calls 2000 --warmup 1000
 *   (the same with --calls 12000)
 *
 * Every process prints "mallocs: N" to stderr when it exits; the difference between the two runs,
 * divided by the 10000 extra calls, is what one call allocates per rank (start-up cancels out).
 * C++ operator new goes through malloc, Python's small objects do not (pymalloc), so the count is
 * mostly the core's. Without COUNT_MALLOCS the library only forwards.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);

static atomic_long mallocs;
static int counting;

void *malloc(size_t size) {
  if (counting) atomic_fetch_add_explicit(&mallocs, 1, memory_order_relaxed);
  return __libc_malloc(size);
}

__attribute__((constructor)) static void begin(void) { counting = getenv("COUNT_MALLOCS") != NULL; }

__attribute__((destructor)) static void report(void) {
  if (!counting) return;
  char line[64];
  int length = snprintf(line, sizeof line, "mallocs: %ld\n", atomic_load(&mallocs));
  if (length > 0) (void)!write(2, line, (size_t)length);
}
