/* malloc_count.c — an LD_PRELOAD shim for bench/malloc_per_request.sh:
 * counts heap allocations (malloc, calloc, realloc, aligned forms) made
 * by the thread named "router" (bench_proxy's router loop), and exports
 * the count as eldr_mc_router() for bench_proxy to read around a run.
 * Not part of the build: the script compiles it. glibc only (__libc_*). */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/prctl.h>

void *__libc_malloc(size_t);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *__libc_memalign(size_t, size_t);

static atomic_ulong router_allocs;
static _Thread_local int is_router = -1; /* -1: not looked at yet */

static void count(void) {
  if (is_router < 0) {
    char name[17] = {0};
    prctl(PR_GET_NAME, name, 0, 0, 0);
    is_router = strcmp(name, "router") == 0; /* bench_proxy names it before its first allocation */
  }
  if (!is_router) return;
  atomic_fetch_add_explicit(&router_allocs, 1, memory_order_relaxed);
}

unsigned long eldr_mc_router(void) { return atomic_load(&router_allocs); }

void *malloc(size_t n) {
  count();
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  count();
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  count();
  return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t al, size_t n) {
  count();
  void *p = __libc_memalign(al, n);
  if (!p) return 12; /* ENOMEM */
  *out = p;
  return 0;
}
void *aligned_alloc(size_t al, size_t n) {
  count();
  return __libc_memalign(al, n);
}
