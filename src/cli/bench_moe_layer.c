/* bench_moe_layer.c — `eldr bench moe-layer`: a real MoE FFN layer of
 * Qwen3-30B-A3B's shape (SwiGLU experts: gate/up [inter x hidden], down
 * [hidden x inter]; 128 experts, top-8) run on this CPU with OpenBLAS, timed
 * against the number of distinct active experts and the batch size. Shows
 * the union effect (latency follows the experts touched, not the tokens) and
 * where compute takes over (large batches at few experts). */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/rng.h"

#ifdef ELDR_HAVE_OPENBLAS
#include <cblas.h>
#endif

static const char HELP[] =
    "usage: eldr bench moe-layer [options]\n"
    "\n"
    "Time one MoE FFN layer (router output given; SwiGLU experts, fp32, OpenBLAS)\n"
    "against distinct active experts and batch size. The default is Qwen3-30B-A3B's\n"
    "expert shape scaled by 1/2 in both dimensions (weights ~600 MB); --hidden 2048\n"
    "--inter 768 is the real shape (~2.4 GB of fp32 weights for 128 experts).\n"
    "\n"
    "      --hidden H        model hidden size                         [1024]\n"
    "      --inter I         expert intermediate size                  [384]\n"
    "      --experts-max E   experts allocated (largest active count)  [128]\n"
    "      --top-k K         experts per token                         [8]\n"
    "      --experts LIST    active expert counts                      [8,16,32,64,96,128]\n"
    "      --batches LIST    batch sizes (tokens)                      [1,2,4,8,16,32,64,256]\n"
    "      --threads N       OpenBLAS threads                          [1]\n"
    "      --min-time S      seconds of repetitions per point          [0.15]\n"
    "      --seed N          weights/activations seed                  [1]\n"
    "      --json            JSON instead of the table\n"
    "  -h, --help            this help\n";

#ifdef ELDR_HAVE_OPENBLAS
typedef struct layer {
  size_t H, NI, E;
  float *wg, *wu, *wd; /* E * NI*H, E * NI*H, E * H*NI */
} layer;

/* One MoE FFN forward for B tokens whose top-K experts are given (sel B*K),
 * equal gate weights 1/K: y = sum_k w * down(silu(gate x) * up x). */
static void moe_forward(const layer *L, size_t B, size_t K, const uint32_t *sel, const float *x,
                        float *y, float *xs, float *g, float *u, float *ys, uint32_t *tok) {
  const size_t H = L->H, NI = L->NI;
  memset(y, 0, B * H * sizeof *y);
  for (size_t e = 0; e < L->E; e++) {
    size_t m = 0;
    for (size_t t = 0; t < B; t++)
      for (size_t k = 0; k < K; k++)
        if (sel[t * K + k] == e) tok[m++] = (uint32_t)t;
    if (!m) continue;
    for (size_t i = 0; i < m; i++) memcpy(xs + i * H, x + (size_t)tok[i] * H, H * sizeof *xs);
    const float *wg = L->wg + e * NI * H, *wu = L->wu + e * NI * H, *wd = L->wd + e * H * NI;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)NI, (int)H, 1.0f, xs, (int)H, wg,
                (int)H, 0.0f, g, (int)NI);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)NI, (int)H, 1.0f, xs, (int)H, wu,
                (int)H, 0.0f, u, (int)NI);
    for (size_t i = 0; i < m * NI; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)H, (int)NI, 1.0f, g, (int)NI, wd,
                (int)NI, 0.0f, ys, (int)H);
    float w = 1.0f / (float)K;
    for (size_t i = 0; i < m; i++) {
      float *yr = y + (size_t)tok[i] * H;
      const float *sr = ys + i * H;
      for (size_t h = 0; h < H; h++) yr[h] += w * sr[h];
    }
  }
}
#endif

int eldr_bench_moe_layer(int argc, char **argv) {
  const char *cmd = "bench moe-layer";
  size_t H = 1024, NI = 384, E = 128, K = 8;
  long *ex = NULL, *bs = NULL;
  size_t nex = 0, nbs = 0;
  int threads = 1, json = 0;
  double min_time = 0.15;
  uint64_t seed = 1;
  static const struct option lo[] = {
      {"hidden", required_argument, 0, 1},   {"inter", required_argument, 0, 2},
      {"experts-max", required_argument, 0, 3}, {"top-k", required_argument, 0, 4},
      {"experts", required_argument, 0, 5},  {"batches", required_argument, 0, 6},
      {"threads", required_argument, 0, 7},  {"min-time", required_argument, 0, 8},
      {"seed", required_argument, 0, 9},     {"json", no_argument, 0, 10},
      {"help", no_argument, 0, 'h'},         {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (c) {
    case 1: H = (size_t)cli_parse_long(cmd, "--hidden", optarg, 16, 16384); break;
    case 2: NI = (size_t)cli_parse_long(cmd, "--inter", optarg, 16, 65536); break;
    case 3: E = (size_t)cli_parse_long(cmd, "--experts-max", optarg, 1, 1024); break;
    case 4: K = (size_t)cli_parse_long(cmd, "--top-k", optarg, 1, 64); break;
    case 5: free(ex); nex = cli_parse_long_list(cmd, "--experts", optarg, 1, 1024, &ex); break;
    case 6: free(bs); nbs = cli_parse_long_list(cmd, "--batches", optarg, 1, 65536, &bs); break;
    case 7: threads = (int)cli_parse_long(cmd, "--threads", optarg, 1, 256); break;
    case 8: min_time = cli_parse_double(cmd, "--min-time", optarg, 0.0, 60.0); break;
    case 9: seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 10: json = 1; break;
    case 'h': fputs(HELP, stdout); return 0;
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s' (see --help)", argv[optind]);
  if (K > E) cli_usage_error(cmd, "--top-k %zu exceeds --experts-max %zu", K, E);
  if (!nex) nex = cli_parse_long_list(cmd, "--experts", "8,16,32,64,96,128", 1, 1024, &ex);
  if (!nbs) nbs = cli_parse_long_list(cmd, "--batches", "1,2,4,8,16,32,64,256", 1, 65536, &bs);
  for (size_t i = 0; i < nex; i++) {
    if ((size_t)ex[i] > E) cli_usage_error(cmd, "--experts: %ld exceeds --experts-max %zu", ex[i], E);
    if ((size_t)ex[i] < K) cli_usage_error(cmd, "--experts: %ld is below --top-k %zu", ex[i], K);
  }
#ifndef ELDR_HAVE_OPENBLAS
  (void)H; (void)NI; (void)threads; (void)json; (void)min_time; (void)seed;
  cli_fail(cmd, "built without OpenBLAS");
#else
  openblas_set_num_threads(threads);
  size_t maxb = 0;
  for (size_t i = 0; i < nbs; i++)
    if ((size_t)bs[i] > maxb) maxb = (size_t)bs[i];
  double wbytes = 3.0 * (double)E * (double)NI * (double)H * sizeof(float);
  if (wbytes > 16e9) cli_usage_error(cmd, "weights would take %.1f GB; reduce --hidden/--inter/--experts-max", wbytes / 1e9);
  layer L = {H, NI, E, malloc(E * NI * H * sizeof(float)), malloc(E * NI * H * sizeof(float)),
             malloc(E * H * NI * sizeof(float))};
  float *x = malloc(maxb * H * sizeof *x), *y = malloc(maxb * H * sizeof *y);
  float *xs = malloc(maxb * H * sizeof *xs), *g = malloc(maxb * NI * sizeof *g);
  float *u = malloc(maxb * NI * sizeof *u), *ys = malloc(maxb * H * sizeof *ys);
  uint32_t *tok = malloc(maxb * K * sizeof *tok), *sel = malloc(maxb * K * sizeof *sel);
  uint32_t *perm = malloc(E * sizeof *perm);
  if (!L.wg || !L.wu || !L.wd || !x || !y || !xs || !g || !u || !ys || !tok || !sel || !perm)
    cli_fail(cmd, "out of memory (weights %.1f GB)", wbytes / 1e9);
  eldr_rng r;
  eldr_rng_seed(&r, seed);
  float scale = 1.0f / sqrtf((float)H);
  for (size_t i = 0; i < E * NI * H; i++) {
    L.wg[i] = (float)(eldr_rng_uniform(&r) - 0.5) * scale;
    L.wu[i] = (float)(eldr_rng_uniform(&r) - 0.5) * scale;
    L.wd[i] = (float)(eldr_rng_uniform(&r) - 0.5) * scale;
  }
  for (size_t i = 0; i < maxb * H; i++) x[i] = (float)eldr_rng_normal(&r);

  if (!json)
    printf("MoE FFN layer on this CPU (OpenBLAS, %d thread%s): hidden %zu, expert inter %zu, top-%zu, "
           "%zu experts allocated (%.0f MB fp32)\nmedian ms per layer; rows: distinct active experts, "
           "columns: batch (tokens); '-' = a batch that cannot touch that many experts\n",
           threads, threads > 1 ? "s" : "", H, NI, K, E, wbytes / 1e6);
  double *res = calloc(nex * nbs, sizeof *res);
  if (!res) cli_fail(cmd, "out of memory");
  for (size_t ei = 0; ei < nex; ei++) {
    size_t A = (size_t)ex[ei];
    for (size_t bi = 0; bi < nbs; bi++) {
      size_t B = (size_t)bs[bi];
      res[ei * nbs + bi] = NAN;
      if (B * K < A) continue;
      /* A distinct experts out of E (a seeded choice), spread over the
       * batch round-robin so that the union is exactly A and every token's
       * K experts are distinct. */
      for (size_t i = 0; i < E; i++) perm[i] = (uint32_t)i;
      for (size_t i = E; i > 1; i--) {
        size_t j = (size_t)eldr_rng_below(&r, i);
        uint32_t tmp = perm[i - 1];
        perm[i - 1] = perm[j];
        perm[j] = tmp;
      }
      for (size_t t = 0; t < B; t++)
        for (size_t k = 0; k < K; k++) sel[t * K + k] = perm[(t * K + k) % A];
      moe_forward(&L, B, K, sel, x, y, xs, g, u, ys, tok); /* warm-up */
      double times[256];
      size_t n = 0;
      double start = eldr_clock_now();
      do {
        double t0 = eldr_clock_now();
        moe_forward(&L, B, K, sel, x, y, xs, g, u, ys, tok);
        times[n++] = eldr_clock_now() - t0;
      } while (n < 256 && (n < 3 || eldr_clock_now() - start < min_time));
      /* median */
      for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && times[j - 1] > times[j]; j--) {
          double tmp = times[j];
          times[j] = times[j - 1];
          times[j - 1] = tmp;
        }
      res[ei * nbs + bi] = times[n / 2];
    }
    if (!json) cli_progress("bench moe-layer: expert counts", ei + 1, nex, ei + 1 == nex);
  }
  double ebytes = 3.0 * (double)NI * (double)H * sizeof(float);
  if (json) {
    json_t *root = json_object();
    json_object_set_new(root, "hidden", json_integer((json_int_t)H));
    json_object_set_new(root, "inter", json_integer((json_int_t)NI));
    json_object_set_new(root, "top_k", json_integer((json_int_t)K));
    json_object_set_new(root, "experts_max", json_integer((json_int_t)E));
    json_object_set_new(root, "threads", json_integer(threads));
    json_t *pts = json_array();
    for (size_t ei = 0; ei < nex; ei++)
      for (size_t bi = 0; bi < nbs; bi++) {
        double t = res[ei * nbs + bi];
        if (isnan(t)) continue;
        json_t *o = json_object();
        json_object_set_new(o, "active_experts", json_integer(ex[ei]));
        json_object_set_new(o, "batch", json_integer(bs[bi]));
        json_object_set_new(o, "ms", json_real(t * 1e3));
        json_object_set_new(o, "weight_gb_s", json_real((double)ex[ei] * ebytes / t / 1e9));
        json_object_set_new(o, "gflop_s", json_real((double)bs[bi] * (double)K * 6.0 * (double)H * (double)NI / t / 1e9));
        json_array_append_new(pts, o);
      }
    json_object_set_new(root, "points", pts);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
    puts(s);
    free(s);
    json_decref(root);
  } else {
    printf("%8s", "experts");
    for (size_t bi = 0; bi < nbs; bi++) printf(" %8ld", bs[bi]);
    printf("   GB/s of weights at the largest batch\n");
    for (size_t ei = 0; ei < nex; ei++) {
      printf("%8ld", ex[ei]);
      for (size_t bi = 0; bi < nbs; bi++) {
        double t = res[ei * nbs + bi];
        if (isnan(t)) printf(" %8s", "-");
        else printf(" %8.3f", t * 1e3);
      }
      double tl = res[ei * nbs + nbs - 1];
      printf("   %.1f\n", isnan(tl) ? 0.0 : (double)ex[ei] * ebytes / tl / 1e9);
    }
    /* the union effect and the compute take-over, in two lines */
    size_t b64 = nbs, e16 = nex, emax = nex - 1;
    for (size_t bi = 0; bi < nbs; bi++)
      if (bs[bi] == 64) b64 = bi;
    for (size_t ei = 0; ei < nex; ei++)
      if (ex[ei] == 16) e16 = ei;
    if (b64 < nbs && e16 < nex && !isnan(res[emax * nbs + b64]))
      printf("union effect at batch 64: %ld experts / 16 experts = %.2fx\n", ex[emax],
             res[emax * nbs + b64] / res[e16 * nbs + b64]);
    if (e16 < nex) {
      size_t first = nbs;
      for (size_t bi = 0; bi < nbs; bi++)
        if (!isnan(res[e16 * nbs + bi])) { first = bi; break; }
      if (first < nbs)
        printf("batch effect at 16 experts: batch %ld / batch %ld = %.2fx\n", bs[nbs - 1], bs[first],
               res[e16 * nbs + nbs - 1] / res[e16 * nbs + first]);
    }
  }
  free(res);
  free(perm);
  free(sel);
  free(tok);
  free(ys);
  free(u);
  free(g);
  free(xs);
  free(y);
  free(x);
  free(L.wd);
  free(L.wu);
  free(L.wg);
#endif
  free(ex);
  free(bs);
  return 0;
}
