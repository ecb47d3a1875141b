/* bench_codec.c — routed_experts decoding throughput on the router's path.
 *
 * Usage: bench_codec [ITERATIONS]   (default 400, at least 3; --help)
 * Builds a vLLM-like routed_experts blob (base64 of a .npy, uint8, shape
 * (T, 48, 8), 128 experts, skewed expert choice) for T = 1k and 4k tokens and
 * reports the median time of
 *   decode+count  eldr_routed_experts_count (the hot path: base64 -> counts)
 *   b64 only      eldr_b64_decode of the same text into a buffer
 *   masked 12/48  eldr_routed_experts_count_masked, 12 of 48 layers (the router's path)
 *   count only    eldr_counts_accumulate over the decoded uint8 payload
 *   decode alloc  eldr_routed_experts_decode (allocating uint16 array)
 *   encode        eldr_routed_experts_encode
 * as medians of wall-clock and of thread CPU time (the latter is less
 * disturbed by other load on the machine), in microseconds, and MB/s of
 * base64 text (MB = 1e6 bytes) over the CPU time.
 * Then, for T = 4k, signature extraction as the router does it (counts
 * zeroed, base64 -> counts -> eldr_signature_build), all 48 layers and a
 * 12-layer mask, both through the fused chunked decoder
 * (eldr_routed_experts_count_masked) and the router's view path
 * (eldr_routed_experts_view + eldr_counts_accumulate_masked), each next to
 * a memcpy of the same base64 text measured interleaved in the same run;
 * the ratio (extraction CPU time / memcpy CPU time) is the figure to watch.
 * Also the JSONL trace writer/reader on a generated 48x8 trace.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "eldr/clock.h"
#include "eldr/counts.h"
#include "eldr/rng.h"
#include "eldr/routed_experts.h"
#include "eldr/signature.h"
#include "eldr/trace.h"

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* Skewed ids: a quarter of the experts take most of the traffic. Rows of
 * K ids are distinct, as a router's top-k is (repeats: the draw is redone);
 * K = 0: independent ids, repeats within a row allowed (the pre-issue-16
 * input, kept to show the counting path that input takes). */
static void fill_sel_k(uint16_t *sel, size_t n, uint32_t E, size_t K, uint64_t seed) {
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  for (size_t i = 0; i < n; i++) {
    uint16_t v;
    int rep;
    do {
      uint64_t x = eldr_rng_next(&r);
      v = (uint16_t)((x & 3) ? (x >> 8) % (E / 4) : (x >> 8) % E);
      rep = 0;
      for (size_t j = K ? i - i % K : i; j < i; j++) rep |= sel[j] == v;
    } while (rep);
    sel[i] = v;
  }
}

static void fill_sel(uint16_t *sel, size_t n, uint32_t E, uint64_t seed) { fill_sel_k(sel, n, E, 8, seed); }

static volatile uint32_t sink;

static void bench_blob(size_t T, int iters) {
  const eldr_shape s = {48, 128, 8};
  const size_t n = T * s.num_layers * s.top_k;
  uint16_t *sel = malloc(n * sizeof *sel);
  fill_sel(sel, n, s.num_experts, 42 + T);
  char *txt = NULL;
  size_t len = 0;
  if (eldr_routed_experts_encode(sel, T, &s, ELDR_SEL_U8, &txt, &len)) {
    fprintf(stderr, "encode failed\n");
    exit(1);
  }
  uint32_t *counts = malloc(eldr_shape_cells(&s) * sizeof *counts);
  uint8_t *raw = malloc(eldr_b64_decoded_max(len));
  /* decode alloc/encode below run max(iters / 4, 10) times: size for both */
  const size_t slots = iters > 10 ? (size_t)iters : 10;
  double *tm = malloc(sizeof(double) * slots);
  double *cm = malloc(sizeof(double) * slots);
  eldr_diag d = {{0}};
  size_t nt = 0, got = 0;

  /* decode + count (counts zeroed per request, as the router does) */
  for (int i = 0; i < iters; i++) {
    double t0 = eldr_clock_now(), c0 = cpu_s();
    memset(counts, 0, eldr_shape_cells(&s) * sizeof *counts);
    int rc = eldr_routed_experts_count(txt, len, &s, counts, &nt, &d);
    tm[i] = eldr_clock_now() - t0;
    cm[i] = cpu_s() - c0;
    if (rc || nt != T) {
      fprintf(stderr, "count failed: %s\n", d.msg);
      exit(1);
    }
  }
  sink = counts[0];
  double t_count = median(tm, iters), c_count = median(cm, iters);

  /* the router's path: only the artifact's layer mask is counted (12 of 48) */
  uint8_t mask[48] = {0};
  for (size_t l = 0; l < 48; l += 4) mask[l] = 1;
  for (int i = 0; i < iters; i++) {
    double t0 = eldr_clock_now(), c0 = cpu_s();
    memset(counts, 0, eldr_shape_cells(&s) * sizeof *counts);
    int rc = eldr_routed_experts_count_masked(txt, len, &s, mask, counts, &nt, &d);
    tm[i] = eldr_clock_now() - t0;
    cm[i] = cpu_s() - c0;
    if (rc || nt != T) {
      fprintf(stderr, "masked count failed: %s\n", d.msg);
      exit(1);
    }
  }
  sink = counts[0];
  double t_mcount = median(tm, iters), c_mcount = median(cm, iters);

  for (int i = 0; i < iters; i++) {
    double t0 = eldr_clock_now(), c0 = cpu_s();
    int rc = eldr_b64_decode(txt, len, raw, eldr_b64_decoded_max(len), &got, &d);
    tm[i] = eldr_clock_now() - t0;
    cm[i] = cpu_s() - c0;
    if (rc) exit(1);
  }
  double t_b64 = median(tm, iters), c_b64 = median(cm, iters);
  sink = raw[got - 1];

  eldr_npy_info h;
  if (eldr_npy_parse_header(raw, got, &h, NULL)) exit(1);
  for (int i = 0; i < iters; i++) {
    double t0 = eldr_clock_now(), c0 = cpu_s();
    memset(counts, 0, eldr_shape_cells(&s) * sizeof *counts);
    int rc = eldr_counts_accumulate(&s, raw + h.data_offset, ELDR_SEL_U8, T, counts, NULL);
    tm[i] = eldr_clock_now() - t0;
    cm[i] = cpu_s() - c0;
    if (rc) exit(1);
  }
  double t_acc = median(tm, iters), c_acc = median(cm, iters);
  sink = counts[1];

  int it2 = iters / 4 > 10 ? iters / 4 : 10;
  for (int i = 0; i < it2; i++) {
    uint16_t *out = NULL;
    double t0 = eldr_clock_now(), c0 = cpu_s();
    int rc = eldr_routed_experts_decode(txt, len, &s, &out, &nt, NULL, NULL);
    tm[i] = eldr_clock_now() - t0;
    cm[i] = cpu_s() - c0;
    if (rc) exit(1);
    sink = out[0];
    free(out);
  }
  double t_dec = median(tm, it2), c_dec = median(cm, it2);

  for (int i = 0; i < it2; i++) {
    char *o = NULL;
    size_t ol;
    double t0 = eldr_clock_now(), c0 = cpu_s();
    int rc = eldr_routed_experts_encode(sel, T, &s, ELDR_SEL_U8, &o, &ol);
    tm[i] = eldr_clock_now() - t0;
    cm[i] = cpu_s() - c0;
    if (rc) exit(1);
    sink = (uint32_t)o[0];
    free(o);
  }
  double t_enc = median(tm, it2), c_enc = median(cm, it2);

  const double mb = (double)len / 1e6;
  printf("T=%zu tokens (48 layers, top 8, 128 experts, uint8): %zu ids, %.2f MB base64\n", T, n, mb);
  printf("  %-14s %9s %9s  %s\n", "", "wall us", "cpu us", "throughput (cpu time)");
  printf("  %-14s %9.1f %9.1f  %7.0f MB/s\n", "decode+count", t_count * 1e6, c_count * 1e6,
         mb / c_count);
  printf("  %-14s %9.1f %9.1f  %7.0f MB/s   (%.2fx of decode+count)\n", "masked 12/48",
         t_mcount * 1e6, c_mcount * 1e6, mb / c_mcount, c_mcount / c_count);
  printf("  %-14s %9.1f %9.1f  %7.0f MB/s\n", "b64 only", t_b64 * 1e6, c_b64 * 1e6, mb / c_b64);
  printf("  %-14s %9.1f %9.1f  %7.0f M ids/s\n", "count only", t_acc * 1e6, c_acc * 1e6,
         (double)n / 1e6 / c_acc);
  printf("  %-14s %9.1f %9.1f  %7.0f MB/s\n", "decode alloc", t_dec * 1e6, c_dec * 1e6,
         mb / c_dec);
  printf("  %-14s %9.1f %9.1f  %7.0f MB/s\n", "encode", t_enc * 1e6, c_enc * 1e6, mb / c_enc);
  free(cm);
  free(tm);
  free(raw);
  free(counts);
  free(txt);
  free(sel);
}

/* Signature extraction of a T-token blob against memcpy of its text. */
static void bench_sigpath(size_t T, int iters, int distinct) {
  const eldr_shape s = {48, 128, 8};
  const size_t n = T * s.num_layers * s.top_k, cells = eldr_shape_cells(&s);
  uint16_t *sel = malloc(n * sizeof *sel);
  fill_sel_k(sel, n, s.num_experts, distinct ? s.top_k : 0, 7 + T);
  char *txt = NULL;
  size_t len = 0;
  if (eldr_routed_experts_encode(sel, T, &s, ELDR_SEL_U8, &txt, &len)) exit(1);
  uint8_t mask12[48] = {0};
  for (int l = 0; l < 48; l += 4) mask12[l] = 1;
  char *dst = malloc(len);
  uint32_t *counts = malloc(cells * sizeof *counts);
  float *sig = malloc(cells * sizeof *sig);
  uint8_t *vbuf = NULL;
  size_t vcap = 0;
  double *cm = malloc(sizeof(double) * (size_t)iters);
  double *cc = malloc(sizeof(double) * (size_t)iters);
  printf("signature extraction, T=%zu (48 layers, top 8, 128 experts, uint8), %.2f MB base64,\n"
         "  %s; CPU-time medians of %d interleaved runs; ratio = extraction / memcpy of the text\n",
         T, (double)len / 1e6,
         distinct ? "rows of distinct ids (a router's top-k)" : "ids drawn independently (rows may repeat an id)",
         iters);
  printf("  %-30s %9s %9s %7s\n", "", "memcpy us", "extract us", "ratio");
  for (int v = 0; v < 6; v++) {
    const uint8_t *mask = (v & 1) ? mask12 : NULL;
    const int view = v >= 2;
    const int bits = v < 4; /* 4, 5: the per-id kernels only (eldr_counts_bits_set(0)) */
    eldr_counts_bits_set(bits);
    eldr_sigspec spec = {s, ELDR_REPR_COUNT, NULL, mask};
    for (int i = 0; i < iters; i++) {
      double c0 = cpu_s();
      memcpy(dst, txt, len);
      __asm__ volatile("" : : "r"(dst) : "memory");
      double c1 = cpu_s();
      memset(counts, 0, cells * sizeof *counts);
      size_t nt = 0;
      int rc;
      if (view) {
        eldr_re_view rv;
        rc = eldr_routed_experts_view(txt, len, &s, &vbuf, &vcap, &rv, NULL);
        if (!rc)
          rc = eldr_counts_accumulate_masked(&s, rv.data, rv.dtype, rv.rows, mask, counts, NULL);
      } else {
        rc = eldr_routed_experts_count_masked(txt, len, &s, mask, counts, &nt, NULL);
      }
      if (rc || eldr_signature_build(&spec, counts, NULL, sig)) exit(1);
      cm[i] = c1 - c0;
      cc[i] = cpu_s() - c1;
    }
    double m = median(cm, iters), c = median(cc, iters);
    char name[48];
    snprintf(name, sizeof name, "%s, %s%s", view ? "view" : "fused", mask ? "12/48 layers" : "48 layers",
             bits ? "" : ", per-id");
    printf("  %-30s %9.1f %10.1f %6.2fx\n", name, m * 1e6, c * 1e6, c / m);
  }
  eldr_counts_bits_set(1);
  sink = (uint32_t)sig[0] + (uint32_t)dst[len - 1];
  free(vbuf);
  free(cc);
  free(cm);
  free(sig);
  free(counts);
  free(dst);
  free(txt);
  free(sel);
}

static void bench_trace(void) {
  const eldr_shape s = {48, 128, 8};
  eldr_trace *t = eldr_trace_new("bench", &s, NULL);
  const size_t R = 200, P = 64, D = 128, re = 48 * 8;
  uint16_t *pre = malloc(P * re * sizeof *pre), *dec = malloc(D * re * sizeof *dec);
  for (size_t r = 0; r < R; r++) {
    fill_sel(pre, P * re, 128, r);
    fill_sel(dec, D * re, 128, r + 1000);
    char id[32];
    snprintf(id, sizeof id, "r%zu", r);
    eldr_trace_append(t, id, "d", NULL, -1, pre, (uint32_t)P, dec, (uint32_t)D, NULL);
  }
  char path[64];
  snprintf(path, sizeof path, "/tmp/bench_codec_%ld.jsonl", (long)getpid());
  eldr_diag d = {{0}};
  double ts[3], tl[3];
  for (int i = 0; i < 3; i++) {
    double t0 = eldr_clock_now();
    if (eldr_trace_save(path, t, &d)) {
      fprintf(stderr, "%s\n", d.msg);
      exit(1);
    }
    ts[i] = eldr_clock_now() - t0;
    eldr_trace *b = NULL;
    t0 = eldr_clock_now();
    if (eldr_trace_load(path, &b, &d)) {
      fprintf(stderr, "%s\n", d.msg);
      exit(1);
    }
    tl[i] = eldr_clock_now() - t0;
    eldr_trace_free(b);
  }
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  double mb = (double)ftell(f) / 1e6;
  fclose(f);
  unlink(path);
  double ms = median(ts, 3), ml = median(tl, 3);
  printf("trace JSONL, %zu requests x (%zu prefill + %zu decode) tokens x 48 x 8: %.1f MB\n", R, P,
         D, mb);
  printf("  %-14s %9.1f ms  %7.0f MB/s\n", "save", ms * 1e3, mb / ms);
  printf("  %-14s %9.1f ms  %7.0f MB/s\n", "load", ml * 1e3, mb / ml);
  free(pre);
  free(dec);
  eldr_trace_free(t);
}

int main(int argc, char **argv) {
  int iters = 400;
  if (argc > 2) {
    fprintf(stderr, "bench_codec: at most one argument (ITERATIONS); try --help\n");
    return 2;
  }
  if (argc == 2) {
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
      printf("Usage: bench_codec [ITERATIONS]\n"
             "Times the routed_experts codec (base64 .npy -> counts), signature extraction\n"
             "against memcpy of the same base64 text, and the JSONL trace writer/reader.\n"
             "ITERATIONS: samples per figure, 3..1000000 (default 400); medians reported.\n");
      return 0;
    }
    char *end = NULL;
    long v = strtol(argv[1], &end, 10);
    if (end == argv[1] || *end || v < 3 || v > 1000000) {
      fprintf(stderr, "bench_codec: ITERATIONS must be an integer in [3, 1000000], got '%s'\n",
              argv[1]);
      return 2;
    }
    iters = (int)v;
  }
  bench_blob(1024, iters);
  bench_blob(4096, iters);
  bench_sigpath(4096, iters, 1);
  bench_sigpath(4096, iters, 0);
  bench_trace();
  return 0;
}
