/* bench_sigshard — block lookups per second of the signature cache the
 * router's event loops share (eldr/sigshard.h), with 1 and 2 threads (or
 * --threads N), sharded as the router shards it (eldr_sigshard_count_for)
 * against the same cache behind one mutex (1 shard), in the same run.
 *
 * Each thread looks up whole prompts (--blocks blocks each, rows present)
 * with eldr_sigshard_add_blocks, the call the signature path makes for a
 * prompt's prefix-cached blocks; the cache holds --rows rows of 48 layers x
 * 128 experts (the rows' size in a Qwen3-30B-A3B-like model). With
 * --store, each thread also stores one prompt's rows after each lookup (the
 * deferred store of the same request). Wall time, best of --rounds rounds,
 * the configurations interleaved (A B A B) so load on a shared machine
 * falls on all of them alike. waits/1k: lock acquisitions that found the
 * shard held by the other thread, per 1000 block lookups (all rounds;
 * eldr_sigshard_lock_waits) -- the contention sharding removes, which
 * does not depend on how much CPU the machine lends the run.
 *
 * Usage: bench_sigshard [--rows N] [--blocks N] [--threads N] [--rounds N]
 *                       [--ms MS] [--store]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eldr/rng.h"
#include "eldr/sigshard.h"

static const eldr_shape SH = {48, 128, 8};

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "bench_sigshard: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

typedef struct job {
  eldr_sigshard *c;
  const uint64_t *hashes; /* nprompts * nblocks, every row present */
  size_t nprompts, nblocks;
  const uint8_t *sel;     /* one prompt's selections (uint8), for --store */
  int store;
  double ms;
  pthread_barrier_t *go;
  unsigned seed;
  uint64_t lookups, missing;
  double secs;
} job;

static void *run(void *arg) {
  job *j = arg;
  uint32_t *counts = xmalloc(eldr_shape_cells(&SH) * sizeof *counts);
  uint32_t *scratch = calloc(eldr_shape_cells(&SH), sizeof *scratch);
  uint64_t x = j->seed, n = 0, miss = 0;
  pthread_barrier_wait(j->go);
  double t0 = wall_s(), t = t0, end = t0 + j->ms / 1e3;
  while (t < end) {
    for (int k = 0; k < 16; k++) {
      const uint64_t *h = j->hashes + (eldr_splitmix64(&x) % j->nprompts) * j->nblocks;
      memset(counts, 0, eldr_shape_cells(&SH) * sizeof *counts);
      miss += eldr_sigshard_add_blocks(j->c, h, j->nblocks, counts);
      n += j->nblocks;
      if (j->store)
        eldr_sigshard_store_blocks(j->c, h, j->nblocks, 0, j->sel, ELDR_SEL_U8, j->nblocks * ELDR_BLOCK_TOKENS,
                                   scratch, NULL);
    }
    t = wall_s();
  }
  j->secs = t - t0;
  j->lookups = n;
  j->missing = miss;
  free(counts);
  free(scratch);
  return NULL;
}

/* Block lookups per second of nthreads threads on c. */
static double measure(eldr_sigshard *c, const uint64_t *hashes, size_t nprompts, size_t nblocks,
                      const uint8_t *sel, int store, int nthreads, double ms, unsigned seed, double *lookups) {
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, (unsigned)nthreads);
  job *jobs = xmalloc((size_t)nthreads * sizeof *jobs);
  pthread_t *th = xmalloc((size_t)nthreads * sizeof *th);
  for (int i = 0; i < nthreads; i++)
    jobs[i] = (job){c, hashes, nprompts, nblocks, sel, store, ms, &go, seed * 31u + (unsigned)i, 0, 0, 0};
  for (int i = 1; i < nthreads; i++)
    if (pthread_create(&th[i], NULL, run, &jobs[i])) {
      fprintf(stderr, "bench_sigshard: cannot start a thread\n");
      exit(1);
    }
  run(&jobs[0]);
  for (int i = 1; i < nthreads; i++) pthread_join(th[i], NULL);
  double rate = 0;
  for (int i = 0; i < nthreads; i++) {
    if (jobs[i].missing) {
      fprintf(stderr, "bench_sigshard: %llu lookups missed (the cache should hold every row)\n",
              (unsigned long long)jobs[i].missing);
      exit(1);
    }
    rate += (double)jobs[i].lookups / jobs[i].secs;
    *lookups += (double)jobs[i].lookups;
  }
  pthread_barrier_destroy(&go);
  free(jobs);
  free(th);
  return rate;
}

static long arg_long(const char *flag, const char *v, long lo, long hi) {
  char *end;
  long x = strtol(v ? v : "", &end, 10);
  if (!v || *end || x < lo || x > hi) {
    fprintf(stderr, "bench_sigshard: %s wants an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, v ? v : "");
    exit(2);
  }
  return x;
}

int main(int argc, char **argv) {
  long rows = 8192, blocks = 64, maxthreads = 2, rounds = 5, ms = 300;
  int store = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--rows")) rows = arg_long(a, v, 256, 1 << 20), i++;
    else if (!strcmp(a, "--blocks")) blocks = arg_long(a, v, 1, 4096), i++;
    else if (!strcmp(a, "--threads")) maxthreads = arg_long(a, v, 1, 256), i++;
    else if (!strcmp(a, "--rounds")) rounds = arg_long(a, v, 1, 1000), i++;
    else if (!strcmp(a, "--ms")) ms = arg_long(a, v, 1, 60000), i++;
    else if (!strcmp(a, "--store")) store = 1;
    else {
      fprintf(stderr, "usage: bench_sigshard [--rows N] [--blocks N] [--threads N] [--rounds N] [--ms MS] [--store]\n");
      return 2;
    }
  }
  if (blocks > rows) blocks = rows;
  /* the rows: prompts of `blocks` blocks whose rows fill the cache */
  size_t nprompts = (size_t)(rows / blocks) / 2; /* half full: no eviction of a prompt looked up */
  if (!nprompts) nprompts = 1;
  size_t nh = nprompts * (size_t)blocks, T = (size_t)blocks * ELDR_BLOCK_TOKENS;
  uint64_t *hashes = xmalloc(nh * sizeof *hashes), x = 42;
  for (size_t i = 0; i < nh; i++) hashes[i] = eldr_splitmix64(&x);
  uint8_t *sel = xmalloc(T * SH.num_layers * SH.top_k);
  for (size_t t = 0; t < T; t++)
    for (size_t l = 0; l < SH.num_layers; l++)
      for (size_t k = 0; k < SH.top_k; k++) /* top_k distinct experts */
        sel[(t * SH.num_layers + l) * SH.top_k + k] = (uint8_t)((t * 7 + l * 3 + k * 16) % SH.num_experts);
  unsigned counts[2] = {eldr_sigshard_count_for((size_t)rows), 1};
  eldr_sigshard *c[2];
  uint32_t *scratch = calloc(eldr_shape_cells(&SH), sizeof *scratch);
  for (int v = 0; v < 2; v++) {
    if (!(c[v] = eldr_sigshard_new(&SH, (size_t)rows, counts[v], NULL)) || !scratch) {
      fprintf(stderr, "bench_sigshard: out of memory for %ld rows\n", rows);
      return 1;
    }
    for (size_t p = 0; p < nprompts; p++)
      if (eldr_sigshard_store_blocks(c[v], hashes + p * (size_t)blocks, (size_t)blocks, 0, sel, ELDR_SEL_U8, T,
                                     scratch, NULL)) {
        fprintf(stderr, "bench_sigshard: store failed\n");
        return 1;
      }
  }
  printf("# bench_sigshard: %ld rows of %u layers x %u experts (%.1f MiB), %zu prompts of %ld blocks looked up"
         "%s;\n# block lookups per second, wall time, best of %ld rounds of %ld ms (configurations interleaved)\n",
         rows, SH.num_layers, SH.num_experts, (double)rows * (double)eldr_shape_cells(&SH) / 1048576.0, nprompts,
         blocks, store ? ", each followed by a store of the same prompt" : "", rounds, ms);
  printf("%-8s %-8s %14s %14s %12s %14s\n", "shards", "threads", "lookups/s", "per thread", "vs 1 thread",
         "waits/1k");
  int nt[8], nnt = 0;
  for (long t = 1; t <= maxthreads && nnt < 8; t *= 2) nt[nnt++] = (int)t;
  if (nt[nnt - 1] != maxthreads && nnt < 8) nt[nnt++] = (int)maxthreads;
  double best[2][8] = {{0}}, looked[2][8] = {{0}}, waits[2][8] = {{0}};
  for (long r = 0; r < rounds; r++)
    for (int i = 0; i < nnt; i++)
      for (int v = 0; v < 2; v++) {
        uint64_t w0 = eldr_sigshard_lock_waits(c[v]);
        double n = 0;
        double rate = measure(c[v], hashes, nprompts, (size_t)blocks, sel, store, nt[i], (double)ms, (unsigned)r, &n);
        waits[v][i] += (double)(eldr_sigshard_lock_waits(c[v]) - w0);
        looked[v][i] += n;
        if (rate > best[v][i]) best[v][i] = rate;
      }
  for (int v = 0; v < 2; v++)
    for (int i = 0; i < nnt; i++)
      printf("%-8u %-8d %14.0f %14.0f %11.2fx %14.3f\n", counts[v], nt[i], best[v][i], best[v][i] / nt[i],
             best[v][i] / best[v][0], 1e3 * waits[v][i] / looked[v][i]);
  for (int v = 0; v < 2; v++) eldr_sigshard_free(c[v]);
  free(scratch);
  free(sel);
  free(hashes);
  return 0;
}
