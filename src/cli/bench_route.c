/* bench_route.c — `eldr bench route`: the router-side cost of signature
 * extraction plus the decode decision, measured on the exact code the server
 * runs (src/serve/sigpath.c + eldr_policy_decode), for prompts of given
 * token counts on a model shape (default 48 MoE layers, 128 experts, top-8).
 * Also reports the JSON parse of the prefill reply that carries the
 * routed_experts (the rest of the router's per-request work on it) and the
 * signature-cache path (prompt with a prefix-cache hit). Interleaved in the
 * same run, for comparison: the reply read into a jansson tree and the
 * signature read from it (the path before the span reader), and the
 * signature with the per-id counting kernels only (no bit-sliced kernel). */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/artifact.h"
#include "eldr/policy.h"
#include "eldr/rng.h"
#include "eldr/routed_experts.h"
#include "eldr/sigcache.h"
#include "serve/serve_internal.h"
#include "serve/sigpath.h"

/* The stages callgrind counts one at a time (--toggle-collect=stage_...):
 * each a function of its own, never inlined. */
#define STAGE __attribute__((noinline, noipa)) static
STAGE void stage_sig(eldr__sigpath *sp, const eldr__prefill_reply *pr, eldr__sigres *res) {
  eldr__sigpath_extract(sp, pr->raw, pr->raw_len, pr->root, 0, pr->routed_experts, pr->routed_experts_len, NULL, res);
}
/* The deferred store of an extraction's computed blocks: a prompt seen
 * before (its blocks held), a new one. */
STAGE void stage_store_held(eldr__sigpath *sp, const eldr__sigres *res) { eldr__sigpath_store(sp, res); }
STAGE void stage_store_new(eldr__sigpath *sp, const eldr__sigres *res) { eldr__sigpath_store(sp, res); }
/* A prompt the cache holds, whole signature path: extraction and store;
 * the reply with every row, or with the last block only. */
static void cached(eldr__sigpath *sp, const eldr__prefill_reply *pr, const eldr__prompt *p, eldr__sigres *res) {
  eldr__sigpath_extract(sp, pr->raw, pr->raw_len, pr->root, 0, pr->routed_experts, pr->routed_experts_len, p, res);
  eldr__sigpath_store(sp, res);
}
STAGE void stage_cached_all(eldr__sigpath *sp, const eldr__prefill_reply *pr, const eldr__prompt *p,
                            eldr__sigres *res) {
  cached(sp, pr, p, res);
}
STAGE void stage_cached_last(eldr__sigpath *sp, const eldr__prefill_reply *pr, const eldr__prompt *p,
                             eldr__sigres *res) {
  cached(sp, pr, p, res);
}

#define CACHE_PROMPTS 8
#define WARMUP (CACHE_PROMPTS + 4)

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr bench route [options]\n\n"
          "Router-side cost per request: routed_experts (base64 .npy) -> counts -> (+ signature\n"
          "cache rows) -> signature -> locality-band decision, on the server's own code.\n\n"
          "  --tokens LIST    prompt lengths (default 1024,4096)\n"
          "  --layers N       MoE layers (default 48)\n"
          "  --experts N      experts per layer (default 128)\n"
          "  --topk N         experts per token (default 8)\n"
          "  --decoders N     decode workers = centroids (default 8)\n"
          "  --mask-layers N  layers in the artifact's layer mask, evenly spread (default: all)\n"
          "  --iters N        timed repetitions (default 200)\n"
          "  --seed N         (default 1)\n"
          "  --json           one JSON object on stdout instead of the table\n"
          "  -h, --help       this text\n");
}

typedef struct stats {
  double p50, p99, mean;
} stats;

static stats summarize(double *v, size_t n) {
  stats s = {0, 0, 0};
  for (size_t i = 0; i < n; i++) s.mean += v[i];
  s.mean /= (double)n;
  qsort(v, n, sizeof *v, cmp_d);
  s.p50 = v[n / 2];
  s.p99 = v[(size_t)((double)(n - 1) * 0.99)];
  return s;
}

int eldr_bench_route(int argc, char **argv) {
  const char *cmd = "bench route";
  long *tokens = NULL;
  size_t ntok = 0;
  long L = 48, E = 128, K = 8, D = 8, iters = 200, M = -1;
  uint64_t seed = 1;
  int json = 0;
  static const struct option opts[] = {{"json", no_argument, 0, 'j'},{"tokens", required_argument, 0, 't'}, {"layers", required_argument, 0, 'l'},
                                       {"experts", required_argument, 0, 'e'}, {"topk", required_argument, 0, 'k'},
                                       {"decoders", required_argument, 0, 'd'}, {"iters", required_argument, 0, 'i'},
                                       {"mask-layers", required_argument, 0, 'm'},
                                       {"seed", required_argument, 0, 's'}, {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  cli_getopt_reset();
  int o;
  while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (o) {
    case 't': free(tokens); ntok = cli_parse_long_list(cmd, "--tokens", optarg, 1, 1 << 20, &tokens); break;
    case 'l': L = cli_parse_long(cmd, "--layers", optarg, 1, ELDR_MAX_LAYERS); break;
    case 'e': E = cli_parse_long(cmd, "--experts", optarg, 1, 65535); break;
    case 'k': K = cli_parse_long(cmd, "--topk", optarg, 1, ELDR_MAX_TOPK); break;
    case 'd': D = cli_parse_long(cmd, "--decoders", optarg, 1, 4096); break;
    case 'i': iters = cli_parse_long(cmd, "--iters", optarg, 1, 1000000); break;
    case 'm': M = cli_parse_long(cmd, "--mask-layers", optarg, 1, ELDR_MAX_LAYERS); break;
    case 's': seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 'j': json = 1; break;
    case 'h': usage(stdout); free(tokens); return 0;
    default: cli_bad_option(cmd, argc, argv, o);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  if (K > E) cli_usage_error(cmd, "--topk %ld exceeds --experts %ld", K, E);
  if (M > L) cli_usage_error(cmd, "--mask-layers %ld exceeds --layers %ld", M, L);
  if (M < 0) M = L;
  if (!tokens) {
    ntok = 2;
    tokens = malloc(2 * sizeof *tokens);
    tokens[0] = 1024;
    tokens[1] = 4096;
  }
  eldr_shape sh = {(uint32_t)L, (uint32_t)E, (uint32_t)K};
  eldr_diag d = {{0}};
  if (eldr_shape_validate(&sh, &d)) cli_usage_error(cmd, "%s", d.msg);
  eldr_rng rng;
  eldr_rng_seed(&rng, seed);
  /* artifact: IDF on, M of L layers in the mask, D random unit centroids (non-negative) */
  uint8_t *mask = calloc((size_t)L, 1);
  if (!mask) cli_fail(cmd, "out of memory");
  for (long j = 0; j < M; j++) mask[(size_t)(j * L / M)] = 1;
  eldr_artifact *a = eldr_artifact_new("bench", &sh, NULL, ELDR_REPR_COUNT, 1, mask, (size_t)D);
  free(mask);
  if (!a) cli_fail(cmd, "out of memory");
  for (size_t i = 0; i < (size_t)(L * E); i++) a->idf[i] = (float)(0.1 + 2 * eldr_rng_uniform(&rng));
  for (size_t c = 0; c < (size_t)D; c++) {
    float *v = a->centroids + c * a->dim;
    for (size_t j = 0; j < a->dim; j++) v[j] = (float)eldr_rng_uniform(&rng);
    eldr_l2_normalize(v, a->dim);
  }
  a->tau = 0.1;
  eldr_policy pol;
  if (eldr_policy_init(&pol, ELDR_POLICY_ELDR, 0.1, seed, a->centroids, a->k, a->dim, 1))
    cli_fail(cmd, "policy init failed");
  /* the server's signature path, without and with a signature cache */
  eldr__sigpath sp_nc, sp_c;
  eldr__sigconf conf;
  if (eldr__sigpath_init(&sp_nc, NULL) || eldr__sigpath_init(&sp_c, NULL) ||
      eldr__sigconf_build(&sp_nc, a, 0, &conf, &d))
    cli_fail(cmd, "out of memory");
  eldr__sigpath_commit(&sp_nc, &conf);
  uint32_t *loads = calloc((size_t)D, sizeof *loads);
  double *t_parse = malloc((size_t)iters * sizeof(double)), *t_sig = malloc((size_t)iters * sizeof(double)),
         *t_dec = malloc((size_t)iters * sizeof(double)), *t_store = malloc((size_t)iters * sizeof(double)),
         *t_hit = malloc((size_t)iters * sizeof(double)), *t_copy = malloc((size_t)iters * sizeof(double)),
         *t_tree = malloc((size_t)iters * sizeof(double)), *t_perid = malloc((size_t)iters * sizeof(double)),
         *t_pscan = malloc((size_t)iters * sizeof(double)), *t_snew = malloc((size_t)iters * sizeof(double)),
         *t_call = malloc((size_t)iters * sizeof(double)), *t_clast = malloc((size_t)iters * sizeof(double));
  if (!loads || !t_parse || !t_sig || !t_dec || !t_store || !t_hit || !t_copy || !t_tree || !t_perid || !t_pscan ||
      !t_snew || !t_call || !t_clast)
    cli_fail(cmd, "out of memory");
  json_t *jrows = json ? json_array() : NULL;
  if (json && !jrows) cli_fail(cmd, "out of memory");
  if (!json) {
    printf("# eldr bench route: %ld layers x %ld experts, top-%ld, %ld of %ld layers in the mask, %ld "
           "decoders, %ld iterations\n", L, E, K, M, L, D, iters);
    printf("%-7s %-9s %-26s %10s %10s %10s\n", "tokens", "b64_KiB", "stage", "p50_us", "p99_us",
           "mean_us");
  }
  for (size_t ti = 0; ti < ntok; ti++) {
    size_t T = (size_t)tokens[ti];
    /* selections: each token draws from a skewed per-layer popularity */
    uint16_t *sel = malloc(T * (size_t)(L * K) * sizeof *sel);
    if (!sel) cli_fail(cmd, "out of memory");
    for (size_t t = 0; t < T; t++)
      for (size_t l = 0; l < (size_t)L; l++) {
        uint16_t *row = sel + (t * (size_t)L + l) * (size_t)K;
        for (size_t k = 0; k < (size_t)K; k++) {
          uint16_t e;
          int dup;
          do {
            double u = eldr_rng_uniform(&rng);
            e = (uint16_t)((double)E * u * u);
            dup = 0;
            for (size_t j = 0; j < k; j++) dup |= row[j] == e;
          } while (dup);
          row[k] = e;
        }
      }
    char *b64 = NULL;
    size_t blen = 0;
    if (eldr_routed_experts_encode(sel, T, &sh, E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8, &b64, &blen))
      cli_fail(cmd, "encode failed");
    /* a prompt of exactly T stand-in tokens ("w0 w1 ...": one token per word) */
    size_t tl = 0, tcap = T * 9 + 16;
    char *text = malloc(tcap);
    for (size_t t = 0; t < T; t++) tl += (size_t)snprintf(text + tl, tcap - tl, "w%zx ", t % 0xfff);
    if (eldr_tokenize(text, tl, NULL, 0) != T) cli_fail(cmd, "stand-in prompt is not %zu tokens", T);
    /* the prefill reply that carries it */
    size_t rcap = blen + 512;
    char *reply = malloc(rcap);
    int rl = snprintf(reply, rcap,
                      "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\","
                      "\"finish_reason\":\"length\",\"routed_experts\":\"%s\"}],\"usage\":{\"prompt_tokens\":%zu,"
                      "\"completion_tokens\":1},\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                      "\"remote_engine_id\":\"e\",\"remote_block_ids\":[1,2],\"remote_host\":\"h\",\"remote_port\":1}}",
                      b64, T);
    /* a fresh cache per prompt length: drop the last one, build anew */
    eldr__sigconf_build(&sp_c, NULL, 0, &conf, NULL);
    eldr__sigpath_commit(&sp_c, &conf);
    /* a cache of CACHE_PROMPTS prompts' blocks: the warm-up's new prompts
     * fill it, so the timed stores reuse evicted rows (as a router's cache
     * in its steady state) instead of touching fresh pages */
    size_t nblk = T / ELDR_BLOCK_TOKENS;
    if (eldr__sigconf_build(&sp_c, a, (nblk ? nblk : 1) * CACHE_PROMPTS, &conf, &d)) cli_fail(cmd, "%s", d.msg);
    eldr__sigpath_commit(&sp_c, &conf);
    /* the prefix-hit variant: the engine computed only the last 25% (rounded to blocks) */
    size_t first = (T * 3 / 4) / ELDR_BLOCK_TOKENS * ELDR_BLOCK_TOKENS;
    char *b64tail = NULL;
    size_t tlen = 0;
    eldr_routed_experts_encode(sel + first * (size_t)(L * K), T - first, &sh,
                               E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8, &b64tail, &tlen);
    /* its reply, parsed once here: the loop measures the extraction */
    size_t rtcap = tlen + 512;
    char *rtail = malloc(rtcap);
    if (!rtail) cli_fail(cmd, "out of memory");
    int rtl = snprintf(rtail, rtcap,
                       "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"routed_experts\":\"%s\"}],"
                       "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":1}}", b64tail, T);
    eldr__prefill_reply prt;
    if (eldr__prefill_reply_read(rtail, (size_t)rtl, 0, &prt, &d)) cli_fail(cmd, "reply parse: %s", d.msg);
    /* a prompt the cache holds, the reply carrying only the block of its
     * last token (vLLM before PR #39917, or --routed-experts-prompt computed) */
    size_t flast = (T - 1) / ELDR_BLOCK_TOKENS * ELDR_BLOCK_TOKENS;
    char *b64last = NULL;
    size_t llen = 0;
    eldr_routed_experts_encode(sel + flast * (size_t)(L * K), T - flast, &sh, E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8,
                               &b64last, &llen);
    char *rlast = malloc(llen + 512);
    if (!rlast) cli_fail(cmd, "out of memory");
    int rll = snprintf(rlast, llen + 512,
                       "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"routed_experts\":\"%s\"}],"
                       "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":1}}", b64last, T);
    eldr__prefill_reply prl;
    if (eldr__prefill_reply_read(rlast, (size_t)rll, 0, &prl, &d)) cli_fail(cmd, "reply parse: %s", d.msg);
    /* the new prompts of the "new prompt" store: the text with its first
     * word replaced by one that names the iteration (every block hash new) */
    const char *rest = strchr(text, ' ');
    char *ntext = malloc(tl + 32);
    if (!ntext || !rest) cli_fail(cmd, "out of memory");
    uint64_t sink = 0;
    char *copy = malloc(blen);
    if (!copy) cli_fail(cmd, "out of memory");
    /* the reply as the router holds it: received into the leg's buffer,
     * which the read adopts (and gives its previous one back) */
    eldr__prefill_reply pr;
    memset(&pr, 0, sizeof pr);
    char *lbuf = NULL;
    size_t lcap = 0;
    eldr__prompt prompt = {0}; /* its hash buffer reused from request to request, as a pooled request's */
    eldr__prompt nprompt = {0};
    for (long it = -WARMUP; it < iters; it++) { /* warm-up rounds: they fill the cache */
      if (lcap <= (size_t)rl) { /* the receive (not timed) */
        free(lbuf);
        lcap = (size_t)rl + 1;
        if (!(lbuf = malloc(lcap))) cli_fail(cmd, "out of memory");
      }
      memcpy(lbuf, reply, (size_t)rl + 1);
      /* the yardstick, interleaved: a memcpy of the base64 blob */
      double tc = eldr_clock_now();
      memcpy(copy, b64, blen);
      __asm__ volatile("" : : "r"(copy) : "memory");
      double t0 = eldr_clock_now();
      size_t ln = (size_t)rl;
      if (eldr__prefill_reply_adopt(&lbuf, &lcap, &ln, 0, &pr, &d)) cli_fail(cmd, "reply parse: %s", d.msg);
      double t1 = eldr_clock_now();
      eldr__sigres res;
      stage_sig(&sp_nc, &pr, &res);
      if (res.fallback != ELDR__FB_NONE) cli_fail(cmd, "extraction fell back (%d): %s", res.fallback, res.diag.msg);
      double t2 = eldr_clock_now();
      eldr_route_req rr = {res.sig, -1, NULL};
      eldr_decision dec;
      int k = eldr_policy_decode(&pol, loads, NULL, (size_t)D, &rr, &dec);
      double t3 = eldr_clock_now();
      loads[k] = (loads[k] + 1) % 4;
      sink += (uint64_t)k;
      /* with the cache: full extraction + storing every block (first request of a prefix) */
      if (eldr__prompt_init(&sp_c, &prompt, text, tl, NULL, 0)) cli_fail(cmd, "out of memory");
      eldr__sigpath_extract(&sp_c, pr.raw, pr.raw_len, pr.root, 0, pr.routed_experts, pr.routed_experts_len, &prompt, &res);
      double t4 = eldr_clock_now();
      stage_store_held(&sp_c, &res); /* the same prompt again: its blocks are held */
      double t5 = eldr_clock_now();
      /* the first request of a prompt: the store counts every block */
      int nl = snprintf(ntext, 32, "q%ld", it + WARMUP);
      memcpy(ntext + nl, rest, tl - (size_t)(rest - text));
      size_t ntl = (size_t)nl + tl - (size_t)(rest - text);
      if (eldr__prompt_init(&sp_c, &nprompt, ntext, ntl, NULL, 0) || nprompt.ntok != T) cli_fail(cmd, "new prompt");
      eldr__sigpath_extract(&sp_c, pr.raw, pr.raw_len, pr.root, 0, pr.routed_experts, pr.routed_experts_len, &nprompt,
                            &res);
      if (res.fallback != ELDR__FB_NONE) cli_fail(cmd, "new prompt's extraction fell back");
      double tn0 = eldr_clock_now();
      stage_store_new(&sp_c, &res);
      double tn1 = eldr_clock_now();
      /* the prompt the cache holds, again, whole path (extraction, store):
       * the reply with every row (vLLM since PR #39917), then with its last block only */
      if (eldr__prompt_init(&sp_c, &prompt, text, tl, NULL, 0)) cli_fail(cmd, "out of memory");
      double tc0 = eldr_clock_now();
      stage_cached_all(&sp_c, &pr, &prompt, &res);
      double tc1 = eldr_clock_now();
      if (res.fallback != ELDR__FB_NONE || res.n_tokens != T) cli_fail(cmd, "cached extraction (all rows) wrong");
      stage_cached_last(&sp_c, &prl, &prompt, &res);
      double tc2 = eldr_clock_now();
      if (res.fallback != ELDR__FB_NONE || res.n_tokens != T) cli_fail(cmd, "cached extraction (last block) wrong");
      /* a later request with 75% prefix hit: its prompt's blocks (tokenised
       * once, as at the request's arrival: not timed), tail rows + cached rows */
      if (eldr__prompt_init(&sp_c, &prompt, text, tl, NULL, 0)) cli_fail(cmd, "out of memory");
      const double t5b = eldr_clock_now();
      eldr__sigpath_extract(&sp_c, prt.raw, prt.raw_len, prt.root, 0, prt.routed_experts, prt.routed_experts_len, &prompt, &res);
      double t6 = eldr_clock_now();
      if (res.fallback != ELDR__FB_NONE) cli_fail(cmd, "cached extraction fell back");
      /* the same, interleaved: the reply read into a jansson tree (the blob
       * set aside) and the signature read from the tree (the router before
       * the span reader), and the span reader with the per-id kernels only */
      double t7 = eldr_clock_now();
      eldr__prefill_reply prj;
      if (eldr__prefill_reply_parse(reply, (size_t)rl, &prj, &d)) cli_fail(cmd, "reply parse: %s", d.msg);
      eldr__sigpath_extract(&sp_nc, NULL, 0, prj.root, 0, NULL, 0, NULL, &res);
      double t8 = eldr_clock_now();
      if (res.fallback != ELDR__FB_NONE) cli_fail(cmd, "tree extraction fell back: %s", res.diag.msg);
      eldr__prefill_reply_free(&prj);
      eldr__counts_bits_set(0);
      double t9 = eldr_clock_now();
      eldr__sigpath_extract(&sp_nc, pr.raw, pr.raw_len, pr.root, 0, pr.routed_experts, pr.routed_experts_len, NULL, &res);
      double t10 = eldr_clock_now();
      eldr__counts_bits_set(1);
      if (it >= 0) {
        t_parse[it] = t1 - t0;
        t_sig[it] = t2 - t1;
        t_dec[it] = t3 - t2;
        t_store[it] = (t5 - t4);
        t_hit[it] = t6 - t5b;
        t_copy[it] = t0 - tc;
        t_pscan[it] = t2 - t0;
        t_snew[it] = tn1 - tn0;
        t_call[it] = tc1 - tc0;
        t_clast[it] = tc2 - tc1;
        t_tree[it] = t8 - t7;
        t_perid[it] = t10 - t9;
      }
    }
    free(copy);
    free(lbuf);
    eldr__prefill_reply_free(&pr);
    eldr__prompt_free(&prompt);
    eldr__prompt_free(&nprompt);
    if (sp_c.blocks_missing)
      cli_fail(cmd, "signature cache missed %llu blocks", (unsigned long long)sp_c.blocks_missing);
    double *tot = malloc((size_t)iters * sizeof(double));
    for (long i = 0; i < iters; i++) tot[i] = t_sig[i] + t_dec[i];
    struct {
      const char *name;
      double *v;
    } rows[] = {{"signature (no cache)", t_sig},
                {"decision", t_dec},
                {"signature+decision", tot},
                {"signature, 75% prefix hit", t_hit},
                {"store block rows, new", t_snew},
                {"store block rows, held", t_store},
                {"cached prompt, all rows", t_call},
                {"cached prompt, last block", t_clast},
                {"prefill reply JSON parse", t_parse},
                {"parse+signature, scanner", t_pscan},
                {"parse+signature, tree", t_tree},
                {"signature, per-id kernels", t_perid},
                {"memcpy of the base64 blob", t_copy}};
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
      stats s = summarize(rows[r].v, (size_t)iters);
      if (json)
        json_array_append_new(jrows, json_pack("{s:I,s:f,s:s,s:f,s:f,s:f}", "tokens", (json_int_t)T,
                                               "b64_kib", (double)blen / 1024, "stage", rows[r].name,
                                               "p50_us", s.p50 * 1e6, "p99_us", s.p99 * 1e6,
                                               "mean_us", s.mean * 1e6));
      else
        printf("%-7zu %-9.0f %-26s %10.1f %10.1f %10.1f\n", T, (double)blen / 1024, rows[r].name,
               s.p50 * 1e6, s.p99 * 1e6, s.mean * 1e6);
    }
    /* the acceptance figure: signature+decision over the memcpy, medians of
     * the same interleaved run */
    stats st = summarize(tot, (size_t)iters), sc = summarize(t_copy, (size_t)iters);
    if (json)
      json_array_append_new(jrows, json_pack("{s:I,s:s,s:f}", "tokens", (json_int_t)T, "stage",
                                             "ratio signature+decision / memcpy", "p50_ratio", st.p50 / sc.p50));
    else
      printf("%-7zu %-9.0f %-26s %10.2fx (p50 / p50)\n", T, (double)blen / 1024,
             "sig+decision / memcpy", st.p50 / sc.p50);
    /* the signature cache's figures against the signature itself */
    stats ss = summarize(t_sig, (size_t)iters), sn = summarize(t_snew, (size_t)iters),
          sa = summarize(t_call, (size_t)iters), sl = summarize(t_clast, (size_t)iters);
    const struct {
      const char *name;
      double v;
    } ratios[] = {{"store new / signature", sn.p50 / ss.p50},
                  {"cached all / signature", sa.p50 / ss.p50},
                  {"cached last / signature", sl.p50 / ss.p50}};
    for (size_t q = 0; q < 3; q++) {
      if (json)
        json_array_append_new(jrows, json_pack("{s:I,s:s,s:f}", "tokens", (json_int_t)T, "stage", ratios[q].name,
                                               "p50_ratio", ratios[q].v));
      else
        printf("%-7zu %-9.0f %-26s %10.2fx (p50 / p50)\n", T, (double)blen / 1024, ratios[q].name, ratios[q].v);
    }
    fflush(stdout);
    (void)sink;
    free(tot);
    eldr__prefill_reply_free(&prt);
    eldr__prefill_reply_free(&prl);
    free(rlast);
    free(b64last);
    free(ntext);
    free(rtail);
    free(b64tail);
    free(reply);
    free(text);
    free(b64);
    free(sel);
  }
  if (json) {
    json_t *j = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "layers", (json_int_t)L, "experts",
                          (json_int_t)E, "top_k", (json_int_t)K, "mask_layers", (json_int_t)M,
                          "decoders", (json_int_t)D, "iterations", (json_int_t)iters, "rows", jrows);
    char *out = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) : NULL;
    if (!out) cli_fail(cmd, "out of memory");
    printf("%s\n", out);
    free(out);
    json_decref(j);
  }
  eldr__sigpath_free(&sp_nc);
  eldr__sigpath_free(&sp_c);
  free(loads);
  free(t_parse);
  free(t_sig);
  free(t_dec);
  free(t_store);
  free(t_hit);
  free(t_copy);
  free(t_tree);
  free(t_perid);
  free(t_pscan);
  free(t_snew);
  free(t_call);
  free(t_clast);
  free(tokens);
  eldr_artifact_free(a);
  return 0;
}
