/* bench_route.c — `eldr bench route`: the router-side cost of signature
 * extraction plus the decode decision, measured on the exact code the server
 * runs (eldr/routebench.h, in the serve layer: its signature path and
 * eldr_policy_decode), for prompts of given token counts on a model shape
 * (default 48 MoE layers, 128 experts, top-8). This file reads the flags
 * and prints the table or the JSON. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/routebench.h"
#include "eldr/tracegen.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: eldr bench route [options]\n\n"
          "Router-side cost per request: routed_experts (base64 .npy) -> counts -> (+ signature\n"
          "cache rows) -> signature -> locality-band decision, on the server's own code.\n\n"
          "      --tokens LIST       prompt lengths, tokens                    [1024,4096]\n"
          "      --model P           a model preset's shape and MoE layer ids instead of\n"
          "                          the --layers, --experts and --topk values\n"
          "                          (qwen3-30b-a3b, gpt-oss-120b, qwen3-235b-a22b,\n"
          "                          llama4-maverick, olmoe-1b-7b, deepseek-v3)  [none]\n"
          "      --routed-experts-layers all|moe  with --model: a row per hidden layer, the\n"
          "                          dense layers' rows 0 (vLLM's capturer), or the MoE\n"
          "                          layers' rows only                         [all]\n"
          "      --layers N          MoE layers                                [48]\n"
          "      --experts N         experts per layer                         [128]\n"
          "      --topk N            experts per token                         [8]\n"
          "      --decoders N        decode workers = centroids                [8]\n"
          "      --mask-layers N     layers in the artifact's layer mask, evenly spread\n"
          "                                                                    [all]\n"
          "      --iters N           timed repetitions                         [200]\n"
          "  -s, --seed N                                                      [1]\n"
          "      --json              one JSON object on stdout instead of the table\n"
          "  -h, --help              this help\n");
}

typedef struct opts {
  long *tokens;
  size_t ntok;
  eldr_routebench_cfg cfg;
  int json;
  const char *model;
  uint32_t ids[ELDR_MAX_LAYERS]; /* the preset's MoE layer ids */
} opts;

static void parse(int argc, char **argv, opts *o) {
  const char *cmd = "bench route";
  long L = 48, E = 128, K = 8, D = 8, iters = 200, M = -1;
  uint64_t seed = 1;
  int moe_only = 0;
  static const struct option lo[] = {{"json", no_argument, 0, 'j'},
                                     {"tokens", required_argument, 0, 't'},
                                     {"layers", required_argument, 0, 'l'},
                                     {"experts", required_argument, 0, 'e'},
                                     {"topk", required_argument, 0, 'k'},
                                     {"decoders", required_argument, 0, 'd'},
                                     {"iters", required_argument, 0, 'i'},
                                     {"mask-layers", required_argument, 0, 'm'},
                                     {"seed", required_argument, 0, 's'},
                                     {"help", no_argument, 0, 'h'},
                                     {"model", required_argument, 0, 'M'},
                                     {"routed-experts-layers", required_argument, 0, 'Y'},
                                     {0, 0, 0, 0}};
  cli_getopt_reset();
  int c;
  while ((c = getopt_long(argc, argv, ":hs:", lo, NULL)) != -1) {
    switch (c) {
    case 't': free(o->tokens); o->ntok = cli_parse_long_list(cmd, "--tokens", optarg, 1, 1 << 20, &o->tokens); break;
    case 'l': L = cli_parse_long(cmd, "--layers", optarg, 1, ELDR_MAX_LAYERS); break;
    case 'e': E = cli_parse_long(cmd, "--experts", optarg, 1, 65535); break;
    case 'k': K = cli_parse_long(cmd, "--topk", optarg, 1, ELDR_MAX_TOPK); break;
    case 'd': D = cli_parse_long(cmd, "--decoders", optarg, 1, 4096); break;
    case 'i': iters = cli_parse_long(cmd, "--iters", optarg, 1, 1000000); break;
    case 'm': M = cli_parse_long(cmd, "--mask-layers", optarg, 1, ELDR_MAX_LAYERS); break;
    case 's': seed = cli_parse_u64(cmd, "--seed", optarg); break;
    case 'j': o->json = 1; break;
    case 'M': o->model = optarg; break;
    case 'Y':
      if (strcmp(optarg, "all") && strcmp(optarg, "moe"))
        cli_usage_error(cmd, "--routed-experts-layers: '%s' is not all or moe", optarg);
      moe_only = !strcmp(optarg, "moe");
      break;
    case 'h': usage(stdout); exit(0);
    default: cli_bad_option(cmd, argc, argv, c);
    }
  }
  if (optind < argc) cli_usage_error(cmd, "unexpected argument '%s'", argv[optind]);
  /* a preset: its shape, its MoE layer ids, the hidden layers vLLM's rows cover */
  uint32_t hidden = 0;
  eldr_diag pd = {{0}};
  if (o->model) {
    eldr_shape ps;
    if (eldr_tracegen_model_shape(o->model, &ps, NULL, 0, &pd)) cli_usage_error(cmd, "--model: %s", pd.msg);
    L = ps.num_layers;
    E = ps.num_experts;
    K = ps.top_k;
    eldr_tracegen_layer_ids(o->model, &ps, o->ids);
    hidden = moe_only ? (uint32_t)L : o->ids[L - 1] + 1;
  }
  if (K > E) cli_usage_error(cmd, "--topk %ld exceeds --experts %ld", K, E);
  if (M > L) cli_usage_error(cmd, "--mask-layers %ld exceeds --layers %ld", M, L);
  if (M < 0) M = L;
  if (!o->tokens) {
    o->ntok = 2;
    if (!(o->tokens = malloc(2 * sizeof *o->tokens))) cli_fail(cmd, "out of memory");
    o->tokens[0] = 1024;
    o->tokens[1] = 4096;
  }
  o->cfg = (eldr_routebench_cfg){{(uint32_t)L, (uint32_t)E, (uint32_t)K}, (uint32_t)D, (uint32_t)M,
                                 (uint32_t)iters, seed, o->model ? o->ids : NULL, hidden};
  eldr_diag d = {{0}};
  if (eldr_shape_validate(&o->cfg.shape, &d)) cli_usage_error(cmd, "%s", d.msg);
}

/* The signature cache's ratios, each a stage's p50 over the signature's. */
static const struct {
  const char *name;
  eldr_routebench_stage stage;
} CACHE_RATIO[4] = {{"store new / signature", ELDR_RB_STORE_NEW},
                    {"new, cache on / signature", ELDR_RB_EXTRACT_NEW},
                    {"cached all / signature", ELDR_RB_CACHED_ALL},
                    {"cached last / signature", ELDR_RB_CACHED_LAST}};

/* The signature at each level, each stage's p50 over a memcpy's. */
static const struct {
  const char *name;
  eldr_routebench_stage stage;
} LEVEL_RATIO[3] = {{"signature / memcpy", ELDR_RB_SIG},
                    {"AVX2 at most / memcpy", ELDR_RB_SIG_AVX2},
                    {"portable / memcpy", ELDR_RB_SIG_PORTABLE}};

static void print_rows(const eldr_routebench_result *r) {
  const double kib = (double)r->b64_bytes / 1024;
  for (int s = 0; s < ELDR_RB_NSTAGES; s++)
    printf("%-7zu %-9.0f %-26s %10.1f %10.1f %10.1f\n", r->tokens, kib, r->rows[s].name, r->rows[s].p50_s * 1e6,
           r->rows[s].p99_s * 1e6, r->rows[s].mean_s * 1e6);
  /* the acceptance figure: signature+decision over the memcpy, medians of
   * the same interleaved run */
  printf("%-7zu %-9.0f %-26s %10.2fx (p50 / p50)\n", r->tokens, kib, "sig+decision / memcpy", r->ratio_p50);
  /* the signature at each SIMD level against the memcpy: warm (interleaved
   * with the stages, as the signature runs), cold, hot (repeated at once) */
  for (int q = 0; q < 3; q++)
    printf("%-7zu %-9.0f %-26s %10.2fx warm, %.2fx cold, %.2fx hot (p50 / p50)\n", r->tokens, kib,
           LEVEL_RATIO[q].name, r->rows[LEVEL_RATIO[q].stage].p50_s / r->rows[ELDR_RB_MEMCPY].p50_s,
           r->rows[LEVEL_RATIO[q].stage].p50_s / r->rows[ELDR_RB_MEMCPY_COLD].p50_s,
           r->rows[LEVEL_RATIO[q].stage].p50_s / r->rows[ELDR_RB_MEMCPY_HOT].p50_s);
  /* the signature cache's figures against the signature itself */
  for (int q = 0; q < 4; q++)
    printf("%-7zu %-9.0f %-26s %10.2fx (p50 / p50)\n", r->tokens, kib, CACHE_RATIO[q].name,
           r->rows[CACHE_RATIO[q].stage].p50_s / r->rows[ELDR_RB_SIG].p50_s);
  /* what each form costs on the wire: the whole prefill reply */
  printf("%-7zu %-9.0f %-26s npy %zu bytes, compact %zu bytes (%.0fx); parse+signature p50 %.0fx\n", r->tokens, kib,
         "prefill reply", r->reply_bytes, r->compact_reply_bytes, (double)r->reply_bytes / (double)r->compact_reply_bytes,
         r->rows[ELDR_RB_PARSE_SIG].p50_s / r->rows[ELDR_RB_COMPACT_PARSE_SIG].p50_s);
  fflush(stdout);
}

static int json_rows(json_t *rows, const eldr_routebench_result *r) {
  int bad = 0;
  for (int s = 0; s < ELDR_RB_NSTAGES; s++)
    bad |= json_array_append_new(rows, json_pack("{s:I,s:f,s:s,s:f,s:f,s:f}", "tokens", (json_int_t)r->tokens,
                                                 "b64_kib", (double)r->b64_bytes / 1024, "stage", r->rows[s].name,
                                                 "p50_us", r->rows[s].p50_s * 1e6, "p99_us",
                                                 r->rows[s].p99_s * 1e6, "mean_us", r->rows[s].mean_s * 1e6));
  bad |= json_array_append_new(rows, json_pack("{s:I,s:s,s:f}", "tokens", (json_int_t)r->tokens, "stage",
                                               "ratio signature+decision / memcpy", "p50_ratio", r->ratio_p50));
  for (int q = 0; q < 3; q++)
    bad |= json_array_append_new(
        rows, json_pack("{s:I,s:s,s:f,s:f,s:f}", "tokens", (json_int_t)r->tokens, "stage", LEVEL_RATIO[q].name,
                        "p50_ratio_warm", r->rows[LEVEL_RATIO[q].stage].p50_s / r->rows[ELDR_RB_MEMCPY].p50_s,
                        "p50_ratio_cold", r->rows[LEVEL_RATIO[q].stage].p50_s / r->rows[ELDR_RB_MEMCPY_COLD].p50_s,
                        "p50_ratio_hot", r->rows[LEVEL_RATIO[q].stage].p50_s / r->rows[ELDR_RB_MEMCPY_HOT].p50_s));
  for (int q = 0; q < 4; q++)
    bad |= json_array_append_new(rows, json_pack("{s:I,s:s,s:f}", "tokens", (json_int_t)r->tokens, "stage",
                                                 CACHE_RATIO[q].name, "p50_ratio",
                                                 r->rows[CACHE_RATIO[q].stage].p50_s / r->rows[ELDR_RB_SIG].p50_s));
  bad |= json_array_append_new(
      rows, json_pack("{s:I,s:s,s:I,s:I,s:f}", "tokens", (json_int_t)r->tokens, "stage",
                      "prefill reply bytes, npy vs compact", "npy_bytes", (json_int_t)r->reply_bytes, "compact_bytes",
                      (json_int_t)r->compact_reply_bytes, "p50_ratio_npy_over_compact",
                      r->rows[ELDR_RB_PARSE_SIG].p50_s / r->rows[ELDR_RB_COMPACT_PARSE_SIG].p50_s));
  return bad;
}

int eldr_bench_route(int argc, char **argv) {
  const char *cmd = "bench route";
  opts o = {0};
  parse(argc, argv, &o);
  const eldr_routebench_cfg *c = &o.cfg;
  eldr_diag d = {{0}};
  eldr_routebench *b = NULL;
  if (eldr_routebench_new(c, &b, &d)) cli_fail(cmd, "%s", d.msg);
  json_t *rows = o.json ? json_array() : NULL;
  if (o.json && !rows) cli_fail(cmd, "out of memory");
  if (!o.json) {
    printf("# eldr bench route: %u layers x %u experts, top-%u, %u of %u layers in the mask, %u "
           "decoders, %u iterations",
           c->shape.num_layers, c->shape.num_experts, c->shape.top_k, c->mask_layers, c->shape.num_layers,
           c->decoders, c->iters);
    if (o.model) printf("; %s, routed_experts rows of %u layers", o.model, c->hidden_layers);
    printf("\n");
    printf("%-7s %-9s %-26s %10s %10s %10s\n", "tokens", "b64_KiB", "stage", "p50_us", "p99_us", "mean_us");
  }
  for (size_t i = 0; i < o.ntok; i++) {
    eldr_routebench_result r;
    if (eldr_routebench_run(b, (size_t)o.tokens[i], &r, &d)) cli_fail(cmd, "%s", d.msg);
    if (o.json ? json_rows(rows, &r) : (print_rows(&r), 0)) cli_fail(cmd, "out of memory");
  }
  if (o.json) {
    json_t *j = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:o}", "layers", (json_int_t)c->shape.num_layers, "experts",
                          (json_int_t)c->shape.num_experts, "top_k", (json_int_t)c->shape.top_k, "mask_layers",
                          (json_int_t)c->mask_layers, "decoders", (json_int_t)c->decoders, "iterations",
                          (json_int_t)c->iters, "rows", rows);
    char *out = j ? json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(6)) : NULL;
    if (!out) cli_fail(cmd, "out of memory");
    printf("%s\n", out);
    free(out);
    json_decref(j);
  }
  eldr_routebench_free(b);
  free(o.tokens);
  return 0;
}
