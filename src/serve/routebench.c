/* routebench.c — the router-side cost of one request on the server's own
 * signature path (see eldr/routebench.h). A run goes in phases: the
 * prompt's selections and the prefill replies that carry them
 * (make_inputs), the timed loop with every stage interleaved (measure), the
 * medians (summarize). */
#include "eldr/routebench.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/artifact.h"
#include "eldr/clock.h"
#include "eldr/cpu.h"
#include "eldr/policy.h"
#include "eldr/reply_compact.h"
#include "eldr/rng.h"
#include "eldr/routed_experts.h"
#include "eldr/signature.h"
#include "eldr/tokenize.h"
#include "serve_internal.h"
#include "sigpath.h"

struct eldr_routebench {
  eldr_routebench_cfg cfg;
  eldr_rng rng;
  eldr_artifact *a;
  eldr_policy pol;
  eldr__sigpath sp_nc, sp_c; /* without and with a signature cache */
  uint32_t *loads;           /* decoders' in-flight counts, cycled */
  uint32_t *layer_ids;       /* cfg.layer_ids copied, or NULL */
  double *t[ELDR_RB_NSTAGES]; /* iters samples a stage */
};

static const char *const STAGE_NAMES[ELDR_RB_NSTAGES] = {
    [ELDR_RB_SIG] = "signature (no cache)",
    [ELDR_RB_DECISION] = "decision",
    [ELDR_RB_SIG_DEC] = "signature+decision",
    [ELDR_RB_SIG_HIT] = "signature, 75% prefix hit",
    [ELDR_RB_STORE_NEW] = "store block rows, new",
    [ELDR_RB_STORE_HELD] = "store block rows, held",
    [ELDR_RB_CACHED_ALL] = "cached prompt, all rows",
    [ELDR_RB_CACHED_LAST] = "cached prompt, last block",
    [ELDR_RB_PARSE] = "prefill reply JSON parse",
    [ELDR_RB_PARSE_SIG] = "parse+signature, scanner",
    [ELDR_RB_TREE] = "parse+signature, tree",
    [ELDR_RB_PERID] = "signature, per-id kernels",
    [ELDR_RB_MEMCPY] = "memcpy of the base64 blob",
    [ELDR_RB_COMPACT_SIG] = "compact: signature",
    [ELDR_RB_COMPACT_PARSE_SIG] = "compact: parse+signature",
    [ELDR_RB_SIG_AVX2] = "signature, AVX2 at most",
    [ELDR_RB_SIG_PORTABLE] = "signature, portable",
    [ELDR_RB_MEMCPY_COLD] = "memcpy of the blob, cold",
    [ELDR_RB_EXTRACT_NEW] = "signature, new, cache on",
    [ELDR_RB_MEMCPY_HOT] = "memcpy of the blob, hot",
};

/* The stages callgrind counts one at a time (--toggle-collect=stage_...):
 * each a function of its own, never inlined (GCC: nor analysed across the
 * call; clang has no noipa and keeps noinline functions whole). */
#if defined(__clang__)
#define STAGE __attribute__((noinline)) static
#else
#define STAGE __attribute__((noinline, noipa)) static
#endif
static void sig(eldr__sigpath *sp, const eldr_reply_prefill *pr, eldr__sigres *res) {
  eldr__sigpath_extract(sp, pr->raw, pr->raw_len, pr->root, 0, pr->routed_experts, pr->routed_experts_len, pr->compact,
                        NULL, res);
}
STAGE void stage_sig(eldr__sigpath *sp, const eldr_reply_prefill *pr, eldr__sigres *res) { sig(sp, pr, res); }
/* The same at a level capped (eldr_cpu_set): AVX2 at most, portable. */
STAGE void stage_sig_avx2(eldr__sigpath *sp, const eldr_reply_prefill *pr, eldr__sigres *res) {
  const eldr_cpu_level was = eldr_cpu_set(ELDR_CPU_AVX2);
  sig(sp, pr, res);
  eldr_cpu_set(was);
}
STAGE void stage_sig_portable(eldr__sigpath *sp, const eldr_reply_prefill *pr, eldr__sigres *res) {
  const eldr_cpu_level was = eldr_cpu_set(ELDR_CPU_PORTABLE);
  sig(sp, pr, res);
  eldr_cpu_set(was);
}
/* A new prompt's extraction with the cache: the signature, and the
 * blocks' planes kept for the store. */
STAGE void stage_extract_new(eldr__sigpath *sp, const eldr_reply_prefill *pr, const eldr__prompt *p,
                             eldr__sigres *res) {
  eldr__sigpath_extract(sp, pr->raw, pr->raw_len, pr->root, 0, pr->routed_experts, pr->routed_experts_len, pr->compact,
                        p, res);
}
/* The deferred store of an extraction's computed blocks: a prompt seen
 * before (its blocks held), a new one. */
STAGE void stage_store_held(eldr__sigpath *sp, const eldr__sigres *res) { eldr__sigpath_store(sp, res); }
STAGE void stage_store_new(eldr__sigpath *sp, const eldr__sigres *res) { eldr__sigpath_store(sp, res); }
/* A prompt the cache holds, whole signature path: extraction and store;
 * the reply with every row, or with the last block only. */
static void cached(eldr__sigpath *sp, const eldr_reply_prefill *pr, const eldr__prompt *p, eldr__sigres *res) {
  eldr__sigpath_extract(sp, pr->raw, pr->raw_len, pr->root, 0, pr->routed_experts, pr->routed_experts_len, pr->compact,
                        p, res);
  eldr__sigpath_store(sp, res);
}
STAGE void stage_cached_all(eldr__sigpath *sp, const eldr_reply_prefill *pr, const eldr__prompt *p,
                            eldr__sigres *res) {
  cached(sp, pr, p, res);
}
STAGE void stage_cached_last(eldr__sigpath *sp, const eldr_reply_prefill *pr, const eldr__prompt *p,
                             eldr__sigres *res) {
  cached(sp, pr, p, res);
}

/* The cache holds this many prompts' blocks: the warm-up's new prompts
 * fill it, so the timed stores reuse evicted rows (as a router's cache in
 * its steady state) instead of touching fresh pages. */
#define CACHE_PROMPTS 8
/* The cold memcpy's buffers in all: more than a server CPU's last-level
 * cache share (so a pair's lines are gone by its next turn). */
#define COLD_BYTES ((size_t)96 << 20)
#define WARMUP (CACHE_PROMPTS + 4)

void eldr_routebench_free(eldr_routebench *b) {
  if (!b) return;
  eldr__sigpath_free(&b->sp_nc);
  eldr__sigpath_free(&b->sp_c);
  eldr_artifact_free(b->a);
  free(b->loads);
  free(b->layer_ids);
  for (int s = 0; s < ELDR_RB_NSTAGES; s++) free(b->t[s]);
  free(b);
}

/* The artifact: IDF on, M of L layers in the mask, D random unit centroids
 * (non-negative), tau 0.1. */
static eldr_artifact *make_artifact(const eldr_routebench_cfg *c, eldr_rng *rng) {
  const size_t L = c->shape.num_layers, E = c->shape.num_experts, M = c->mask_layers;
  uint8_t *mask = calloc(L, 1);
  if (!mask) return NULL;
  for (size_t j = 0; j < M; j++) mask[j * L / M] = 1;
  eldr_artifact *a = eldr_artifact_new("bench", &c->shape, c->layer_ids, ELDR_REPR_COUNT, 1, mask, c->decoders);
  free(mask);
  if (!a) return NULL;
  for (size_t i = 0; i < L * E; i++) a->idf[i] = (float)(0.1 + 2 * eldr_rng_uniform(rng));
  for (size_t k = 0; k < c->decoders; k++) {
    float *v = a->centroids + k * a->dim;
    for (size_t j = 0; j < a->dim; j++) v[j] = (float)eldr_rng_uniform(rng);
    eldr_l2_normalize(v, a->dim);
  }
  a->tau = 0.1;
  return a;
}

int eldr_routebench_new(const eldr_routebench_cfg *cfg, eldr_routebench **out, eldr_diag *d) {
  *out = NULL;
  if (eldr_shape_validate(&cfg->shape, d)) return ELDR_EINVAL;
  if (!cfg->decoders || !cfg->iters || !cfg->mask_layers || cfg->mask_layers > cfg->shape.num_layers)
    return eldr_diag_fail(d, ELDR_EINVAL, "decoders, iterations and mask layers (at most the layers) must be >= 1");
  const uint32_t L = cfg->shape.num_layers;
  if (cfg->hidden_layers && (cfg->hidden_layers < L || cfg->hidden_layers > ELDR_MAX_LAYERS ||
                             (cfg->hidden_layers > L && !cfg->layer_ids)))
    return eldr_diag_fail(d, ELDR_EINVAL, "hidden layers %u: at least the %u MoE layers (with their ids when more)",
                          cfg->hidden_layers, L);
  for (uint32_t l = 0; cfg->layer_ids && l < L; l++)
    if ((cfg->hidden_layers > L && cfg->layer_ids[l] >= cfg->hidden_layers) ||
        (l && cfg->layer_ids[l] <= cfg->layer_ids[l - 1])) /* MoE rows only: any rising ids */
      return eldr_diag_fail(d, ELDR_EINVAL, "layer ids must rise and lie below the hidden layers");
  eldr_routebench *b = calloc(1, sizeof *b);
  if (!b) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  b->cfg = *cfg;
  eldr_rng_seed(&b->rng, cfg->seed);
  int rc = ELDR_ENOMEM;
  if (cfg->layer_ids) {
    if (!(b->layer_ids = malloc(L * sizeof *b->layer_ids))) goto fail;
    memcpy(b->layer_ids, cfg->layer_ids, L * sizeof *b->layer_ids);
    b->cfg.layer_ids = b->layer_ids;
  }
  if (!(b->a = make_artifact(cfg, &b->rng))) goto fail;
  if (eldr_policy_init(&b->pol, ELDR_POLICY_ELDR, 0.1, cfg->seed, b->a->centroids, b->a->k, b->a->dim, 1)) {
    rc = eldr_diag_fail(d, ELDR_EINVAL, "policy init failed");
    goto fail;
  }
  eldr__sigconf conf;
  if (eldr__sigpath_init(&b->sp_nc, NULL) || eldr__sigpath_init(&b->sp_c, NULL) ||
      eldr__sigconf_build(&b->sp_nc, b->a, 0, &conf, d))
    goto fail;
  eldr__sigpath_commit(&b->sp_nc, &conf);
  if (!(b->loads = calloc(cfg->decoders, sizeof *b->loads))) goto fail;
  for (int s = 0; s < ELDR_RB_NSTAGES; s++)
    if (!(b->t[s] = malloc(cfg->iters * sizeof(double)))) goto fail;
  *out = b;
  return 0;
fail:
  eldr_routebench_free(b);
  return rc == ELDR_ENOMEM ? eldr_diag_fail(d, ELDR_ENOMEM, "out of memory") : rc;
}

/* One prompt length's inputs. */
typedef struct inputs {
  size_t T;
  uint16_t *sel;   /* T x L x K selections */
  char *b64;       /* their base64 npy */
  size_t blen;
  char *text;      /* a prompt of exactly T stand-in tokens */
  size_t tl;
  char *reply;     /* the prefill reply that carries b64 */
  int rl;
  char *rtail;     /* the reply of a prompt whose first 75% the engine had cached */
  int rtl;
  char *b64tail;
  char *rlast;     /* the reply of a prompt the cache holds, with its last block's rows only */
  int rll;
  char *b64last;
  char *creply;    /* the same prompt's compact reply (eldr/reply_compact.h) */
  size_t crl;
} inputs;

static void inputs_free(inputs *in) {
  free(in->sel);
  free(in->b64);
  free(in->text);
  free(in->reply);
  free(in->rtail);
  free(in->b64tail);
  free(in->rlast);
  free(in->b64last);
  free(in->creply);
}

/* The compact form of the same prompt: the engine's counts in
 * kv_transfer_params, no routed_experts. */
static int make_compact(const eldr_routebench *b, inputs *in, eldr_diag *d) {
  json_t *kv = json_pack("{s:b,s:s,s:[i,i],s:s,s:i}", "do_remote_prefill", 1, "remote_engine_id", "e",
                         "remote_block_ids", 1, 2, "remote_host", "h", "remote_port", 1);
  json_t *cr = kv ? json_pack("{s:s,s:s,s:[{s:i,s:s,s:s}],s:{s:I,s:i},s:o}", "id", "cmpl-1", "object",
                              "text_completion", "choices", "index", 0, "text", "x", "finish_reason", "length",
                              "usage", "prompt_tokens", (json_int_t)in->T, "completion_tokens", 1,
                              "kv_transfer_params", kv)
                  : NULL;
  int bad = !cr || eldr_compact_emit(kv, in->sel, in->T, &b->cfg.shape, b->cfg.layer_ids, 0) ||
            !(in->creply = json_dumps(cr, JSON_COMPACT | JSON_PRESERVE_ORDER));
  json_decref(cr);
  if (bad) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  in->crl = strlen(in->creply);
  return 0;
}

/* The rows as vLLM sends them: with hidden layers beyond the MoE ones, a
 * row per hidden layer, the dense ones 0 (its capturer's buffer). *wire is
 * in->sel itself when there are none. */
static int wire_rows(const eldr_routebench *b, const inputs *in, uint16_t **wire, eldr_shape *wsh) {
  const eldr_shape *sh = &b->cfg.shape;
  const size_t L = sh->num_layers, K = sh->top_k, H = b->cfg.hidden_layers ? b->cfg.hidden_layers : L;
  *wsh = (eldr_shape){(uint32_t)H, sh->num_experts, sh->top_k};
  *wire = in->sel;
  if (H == L) return 0;
  if (!(*wire = calloc(in->T * H * K, sizeof **wire))) return ELDR_ENOMEM;
  for (size_t t = 0; t < in->T; t++)
    for (size_t l = 0; l < L; l++)
      memcpy(*wire + (t * H + b->cfg.layer_ids[l]) * K, in->sel + (t * L + l) * K, K * sizeof **wire);
  return 0;
}

static int make_inputs(eldr_routebench *b, size_t T, inputs *in, eldr_diag *d) {
  const eldr_shape *sh = &b->cfg.shape;
  const size_t L = sh->num_layers, E = sh->num_experts, K = sh->top_k;
  const eldr_sel_dtype dt = E > 256 ? ELDR_SEL_U16LE : ELDR_SEL_U8;
  memset(in, 0, sizeof *in);
  in->T = T;
  /* selections: each token draws from a skewed per-layer popularity */
  if (!(in->sel = malloc(T * L * K * sizeof *in->sel))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  for (size_t t = 0; t < T; t++)
    for (size_t l = 0; l < L; l++) {
      uint16_t *row = in->sel + (t * L + l) * K;
      for (size_t k = 0; k < K; k++) {
        uint16_t e;
        int dup;
        do {
          double u = eldr_rng_uniform(&b->rng);
          e = (uint16_t)((double)E * u * u);
          dup = 0;
          for (size_t j = 0; j < k; j++) dup |= row[j] == e;
        } while (dup);
        row[k] = e;
      }
    }
  uint16_t *wire;
  eldr_shape wsh;
  if (wire_rows(b, in, &wire, &wsh)) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  const size_t first = (T * 3 / 4) / ELDR_BLOCK_TOKENS * ELDR_BLOCK_TOKENS; /* the prefix-hit variant's (below) */
  const size_t flast = (T - 1) / ELDR_BLOCK_TOKENS * ELDR_BLOCK_TOKENS;    /* the last-block variant's */
  size_t tlen = 0, llen = 0;
  int bad = eldr_routed_experts_encode(wire, T, &wsh, dt, &in->b64, &in->blen) ||
            eldr_routed_experts_encode(wire + first * wsh.num_layers * K, T - first, &wsh, dt, &in->b64tail, &tlen) ||
            eldr_routed_experts_encode(wire + flast * wsh.num_layers * K, T - flast, &wsh, dt, &in->b64last, &llen);
  if (wire != in->sel) free(wire);
  if (bad) return eldr_diag_fail(d, ELDR_ENOMEM, "encode failed");
  /* a prompt of exactly T stand-in tokens ("w0 w1 ...": one token per word) */
  const size_t tcap = T * 9 + 16;
  if (!(in->text = malloc(tcap))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  for (size_t t = 0; t < T; t++) in->tl += (size_t)snprintf(in->text + in->tl, tcap - in->tl, "w%zx ", t % 0xfff);
  if (eldr_tokenize(in->text, in->tl, NULL, 0) != T)
    return eldr_diag_fail(d, ELDR_EINVAL, "stand-in prompt is not %zu tokens", T);
  /* the prefill reply that carries it */
  const size_t rcap = in->blen + 512;
  if (!(in->reply = malloc(rcap))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  in->rl = snprintf(in->reply, rcap,
                    "{\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"x\","
                    "\"finish_reason\":\"length\",\"routed_experts\":\"%s\"}],\"usage\":{\"prompt_tokens\":%zu,"
                    "\"completion_tokens\":1},\"kv_transfer_params\":{\"do_remote_prefill\":true,"
                    "\"remote_engine_id\":\"e\",\"remote_block_ids\":[1,2],\"remote_host\":\"h\",\"remote_port\":1}}",
                    in->b64, T);
  /* the prefix-hit variant: the engine computed only the last 25% (rounded to blocks) */
  const size_t rtcap = tlen + 512;
  if (!(in->rtail = malloc(rtcap))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  in->rtl = snprintf(in->rtail, rtcap,
                     "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"routed_experts\":\"%s\"}],"
                     "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":1}}",
                     in->b64tail, T);
  /* a prompt the cache holds, the reply carrying only the block of its
   * last token (vLLM before PR #39917, or --routed-experts-prompt computed) */
  if (!(in->rlast = malloc(llen + 512))) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  in->rll = snprintf(in->rlast, llen + 512,
                     "{\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"routed_experts\":\"%s\"}],"
                     "\"usage\":{\"prompt_tokens\":%zu,\"completion_tokens\":1}}",
                     in->b64last, T);
  return make_compact(b, in, d);
}

/* The timed loop: 5 warm-up rounds, then cfg.iters, every stage once a
 * round, interleaved. */
static int measure(eldr_routebench *b, const inputs *in, eldr_diag *d) {
  const long iters = (long)b->cfg.iters;
  const size_t D = b->cfg.decoders;
  double **t = b->t;
  /* a fresh cache per prompt length: drop the last one, build anew */
  eldr__sigconf conf;
  eldr__sigconf_build(&b->sp_c, NULL, 0, &conf, NULL);
  eldr__sigpath_commit(&b->sp_c, &conf);
  const size_t nblk = in->T / ELDR_BLOCK_TOKENS;
  if (eldr__sigconf_build(&b->sp_c, b->a, (nblk ? nblk : 1) * CACHE_PROMPTS, &conf, d)) return ELDR_ENOMEM;
  eldr__sigpath_commit(&b->sp_c, &conf);
  /* the prefix-hit reply, read once here: the loop measures the extraction */
  eldr_reply_prefill prt = {0};
  if (eldr_reply_prefill_read(in->rtail, (size_t)in->rtl, 0, &prt, d)) return ELDR_EPARSE;
  eldr_reply_prefill prl = {0};
  if (eldr_reply_prefill_read(in->rlast, (size_t)in->rll, 0, &prl, d)) {
    eldr_reply_prefill_free(&prt);
    return ELDR_EPARSE;
  }
  /* the new prompts of the "new prompt" store: the text with its first
   * word replaced by one that names the iteration (every block hash new) */
  const char *rest = strchr(in->text, ' ');
  char *ntext = malloc(in->tl + 32);
  char *copy = malloc(in->blen);
  uint32_t *ref = malloc(eldr_shape_cells(&b->cfg.shape) * sizeof *ref); /* the first level's counts */
  /* the cold memcpy: pairs of a source (a copy of the blob) and a
   * destination, COLD_BYTES in all, taken in turn: each pair has left the
   * caches by its next turn (pages mapped and written once here) */
  size_t ncold = COLD_BYTES / (2 * in->blen) + 1;
  char *cold = malloc(2 * ncold * in->blen);
  for (size_t i = 0; cold && i < ncold; i++) {
    memcpy(cold + 2 * i * in->blen, in->b64, in->blen);
    memset(cold + (2 * i + 1) * in->blen, 0, in->blen);
  }
  /* the reply as the router holds it: received into the leg's buffer,
   * which the read adopts (and gives its previous one back) */
  eldr_reply_prefill pr;
  memset(&pr, 0, sizeof pr);
  char *lbuf = NULL;
  size_t lcap = 0;
  eldr__prompt prompt = {0}; /* its hash buffer reused from request to request, as a pooled request's */
  eldr__prompt nprompt = {0};
  uint64_t sink = 0;
  int rc = copy && ntext && rest && cold && ref ? 0 : eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  for (long it = -WARMUP; !rc && it < iters; it++) { /* warm-up rounds: they fill the cache */
    if (lcap <= (size_t)in->rl) { /* the receive (not timed) */
      free(lbuf);
      lcap = (size_t)in->rl + 1;
      if (!(lbuf = malloc(lcap))) {
        rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
        break;
      }
    }
    memcpy(lbuf, in->reply, (size_t)in->rl + 1);
    /* the yardstick, interleaved: a memcpy of the base64 blob */
    char *cs = cold + 2 * (size_t)(it + WARMUP) % ncold * in->blen;
    const double tk = eldr_clock_now();
    memcpy(cs + in->blen, cs, in->blen);
    __asm__ volatile("" : : "r"(cs) : "memory");
    const double tk1 = eldr_clock_now();
    const double tc = eldr_clock_now();
    memcpy(copy, in->b64, in->blen);
    __asm__ volatile("" : : "r"(copy) : "memory");
    const double t0 = eldr_clock_now();
    memcpy(copy, in->b64, in->blen); /* again at once: both buffers as hot as they get */
    __asm__ volatile("" : : "r"(copy) : "memory");
    const double th = eldr_clock_now();
    size_t ln = (size_t)in->rl;
    const double tr = eldr_clock_now();
    if ((rc = eldr_reply_prefill_adopt(&lbuf, &lcap, &ln, 0, &pr, d))) break;
    const double t1 = eldr_clock_now();
    eldr__sigres res;
    stage_sig(&b->sp_nc, &pr, &res);
    if (res.fallback != ELDR__FB_NONE) {
      rc = eldr_diag_fail(d, ELDR_EIO, "extraction fell back (%d): %s", res.fallback, res.diag.msg);
      break;
    }
    const double t2 = eldr_clock_now();
    eldr_route_req rr = {res.sig, -1, NULL};
    eldr_decision dec;
    const int k = eldr_policy_decode(&b->pol, b->loads, NULL, D, &rr, &dec);
    const double t3 = eldr_clock_now();
    /* the same signature at the levels below, interleaved */
    const size_t cb = eldr_shape_cells(&b->cfg.shape) * sizeof *ref;
    memcpy(ref, res.counts, cb);
    eldr__sigres la, lp;
    stage_sig_avx2(&b->sp_nc, &pr, &la);
    const double ta = eldr_clock_now();
    const int bad_a = la.fallback != ELDR__FB_NONE || memcmp(la.counts, ref, cb);
    const double ta1 = eldr_clock_now();
    stage_sig_portable(&b->sp_nc, &pr, &lp);
    const double tp = eldr_clock_now();
    if (bad_a || lp.fallback != ELDR__FB_NONE || memcmp(lp.counts, ref, cb)) {
      rc = eldr_diag_fail(d, ELDR_EIO, "the signature's counts differ between SIMD levels");
      break;
    }
    b->loads[k] = (b->loads[k] + 1) % 4;
    sink += (uint64_t)k;
    /* with the cache: full extraction + storing every block (first request of a prefix) */
    if ((rc = eldr__prompt_init(&b->sp_c, &prompt, in->text, in->tl, NULL, 0))) break;
    eldr__sigpath_extract(&b->sp_c, pr.raw, pr.raw_len, pr.root, 0, pr.routed_experts, pr.routed_experts_len, pr.compact, &prompt,
                          &res);
    const double t4 = eldr_clock_now();
    stage_store_held(&b->sp_c, &res); /* the same prompt again: its blocks are held */
    const double t5 = eldr_clock_now();
    /* the first request of a prompt: the store counts every block */
    const int nl = snprintf(ntext, 32, "q%ld", it + WARMUP);
    memcpy(ntext + nl, rest, in->tl - (size_t)(rest - in->text));
    const size_t ntl = (size_t)nl + in->tl - (size_t)(rest - in->text);
    if ((rc = eldr__prompt_init(&b->sp_c, &nprompt, ntext, ntl, NULL, 0))) break;
    if (nprompt.ntok != in->T) {
      rc = eldr_diag_fail(d, ELDR_EIO, "the new prompt is not %zu tokens", in->T);
      break;
    }
    const double te0 = eldr_clock_now();
    stage_extract_new(&b->sp_c, &pr, &nprompt, &res);
    const double te1 = eldr_clock_now();
    if (res.fallback != ELDR__FB_NONE) {
      rc = eldr_diag_fail(d, ELDR_EIO, "the new prompt's extraction fell back");
      break;
    }
    const double tn0 = eldr_clock_now();
    stage_store_new(&b->sp_c, &res);
    const double tn1 = eldr_clock_now();
    /* the prompt the cache holds, again, whole path (extraction, store):
     * the reply with every row (vLLM since PR #39917), then with its last block only */
    if ((rc = eldr__prompt_init(&b->sp_c, &prompt, in->text, in->tl, NULL, 0))) break;
    const double tc0 = eldr_clock_now();
    stage_cached_all(&b->sp_c, &pr, &prompt, &res);
    const double tc1 = eldr_clock_now();
    if (res.fallback != ELDR__FB_NONE || res.n_tokens != in->T) {
      rc = eldr_diag_fail(d, ELDR_EIO, "cached extraction (all rows) wrong");
      break;
    }
    stage_cached_last(&b->sp_c, &prl, &prompt, &res);
    const double tc2 = eldr_clock_now();
    if (res.fallback != ELDR__FB_NONE || res.n_tokens != in->T) {
      rc = eldr_diag_fail(d, ELDR_EIO, "cached extraction (last block) wrong");
      break;
    }
    /* a later request with 75% prefix hit: its prompt's blocks (tokenised
     * once, as at the request's arrival: not timed), tail rows + cached rows */
    if ((rc = eldr__prompt_init(&b->sp_c, &prompt, in->text, in->tl, NULL, 0))) break;
    const double t5b = eldr_clock_now();
    eldr__sigpath_extract(&b->sp_c, prt.raw, prt.raw_len, prt.root, 0, prt.routed_experts, prt.routed_experts_len,
                          prt.compact, &prompt, &res);
    const double t6 = eldr_clock_now();
    if (res.fallback != ELDR__FB_NONE) {
      rc = eldr_diag_fail(d, ELDR_EIO, "cached extraction fell back");
      break;
    }
    /* the same, interleaved: the reply read into a jansson tree (the blob
     * set aside) and the signature read from the tree (the router before
     * the span reader), and the span reader with the per-id kernels only */
    const double t7 = eldr_clock_now();
    eldr_reply_prefill prj;
    if ((rc = eldr_reply_prefill_parse(in->reply, (size_t)in->rl, &prj, d))) break;
    eldr__sigpath_extract(&b->sp_nc, NULL, 0, prj.root, 0, NULL, 0, (eldr_js_span){0, 0, ELDR_JS_NONE}, NULL, &res);
    const double t8 = eldr_clock_now();
    eldr_reply_prefill_free(&prj);
    if (res.fallback != ELDR__FB_NONE) {
      rc = eldr_diag_fail(d, ELDR_EIO, "tree extraction fell back: %s", res.diag.msg);
      break;
    }
    eldr_counts_bits_set(0);
    const double t9 = eldr_clock_now();
    eldr__sigpath_extract(&b->sp_nc, pr.raw, pr.raw_len, pr.root, 0, pr.routed_experts, pr.routed_experts_len, pr.compact, NULL,
                          &res);
    const double t10 = eldr_clock_now();
    eldr_counts_bits_set(1);
    /* the compact form, interleaved: its reply read as the router reads it, its signature */
    if (lcap <= in->crl) {
      free(lbuf);
      lcap = in->crl + 1;
      if (!(lbuf = malloc(lcap))) {
        rc = eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
        break;
      }
    }
    memcpy(lbuf, in->creply, in->crl + 1);
    const double t11 = eldr_clock_now();
    ln = in->crl;
    if ((rc = eldr_reply_prefill_adopt(&lbuf, &lcap, &ln, 0, &pr, d))) break;
    const double t12 = eldr_clock_now();
    eldr__sigpath_extract(&b->sp_nc, pr.raw, pr.raw_len, pr.root, 0, pr.routed_experts, pr.routed_experts_len, pr.compact,
                          NULL, &res);
    const double t13 = eldr_clock_now();
    if (res.fallback != ELDR__FB_NONE || pr.compact.type != ELDR_JS_OBJECT) {
      rc = eldr_diag_fail(d, ELDR_EIO, "compact extraction fell back (%d): %s", res.fallback, res.diag.msg);
      break;
    }
    if (it >= 0) {
      t[ELDR_RB_COMPACT_SIG][it] = t13 - t12;
      t[ELDR_RB_COMPACT_PARSE_SIG][it] = t13 - t11;
      t[ELDR_RB_PARSE][it] = t1 - tr;
      t[ELDR_RB_SIG][it] = t2 - t1;
      t[ELDR_RB_DECISION][it] = t3 - t2;
      t[ELDR_RB_SIG_DEC][it] = (t2 - t1) + (t3 - t2);
      t[ELDR_RB_STORE_HELD][it] = t5 - t4;
      t[ELDR_RB_STORE_NEW][it] = tn1 - tn0;
      t[ELDR_RB_CACHED_ALL][it] = tc1 - tc0;
      t[ELDR_RB_CACHED_LAST][it] = tc2 - tc1;
      t[ELDR_RB_SIG_HIT][it] = t6 - t5b;
      t[ELDR_RB_MEMCPY][it] = t0 - tc;
      t[ELDR_RB_MEMCPY_COLD][it] = tk1 - tk;
      t[ELDR_RB_MEMCPY_HOT][it] = th - t0;
      t[ELDR_RB_SIG_AVX2][it] = ta - t3;
      t[ELDR_RB_SIG_PORTABLE][it] = tp - ta1;
      t[ELDR_RB_EXTRACT_NEW][it] = te1 - te0;
      t[ELDR_RB_PARSE_SIG][it] = t2 - tr;
      t[ELDR_RB_TREE][it] = t8 - t7;
      t[ELDR_RB_PERID][it] = t10 - t9;
    }
  }
  (void)sink;
  free(cold);
  free(ref);
  free(copy);
  free(lbuf);
  eldr_reply_prefill_free(&pr);
  eldr_reply_prefill_free(&prt);
  eldr_reply_prefill_free(&prl);
  free(ntext);
  eldr__prompt_free(&prompt);
  eldr__prompt_free(&nprompt);
  if (!rc && b->sp_c.blocks_missing)
    rc = eldr_diag_fail(d, ELDR_EIO, "signature cache missed %llu blocks", (unsigned long long)b->sp_c.blocks_missing);
  return rc;
}

static int cmp_d(const void *x, const void *y) {
  const double a = *(const double *)x, c = *(const double *)y;
  return (a > c) - (a < c);
}

/* p50, p99 and mean of n samples (sorted in place). */
static eldr_routebench_row summarize(const char *name, double *v, size_t n) {
  eldr_routebench_row r = {name, 0, 0, 0};
  for (size_t i = 0; i < n; i++) r.mean_s += v[i];
  r.mean_s /= (double)n;
  qsort(v, n, sizeof *v, cmp_d);
  r.p50_s = v[n / 2];
  r.p99_s = v[(size_t)((double)(n - 1) * 0.99)];
  return r;
}

int eldr_routebench_run(eldr_routebench *b, size_t tokens, eldr_routebench_result *out, eldr_diag *d) {
  memset(out, 0, sizeof *out);
  if (tokens < 1 || tokens > (1u << 20)) return eldr_diag_fail(d, ELDR_EINVAL, "tokens %zu out of range [1, 2^20]", tokens);
  inputs in;
  int rc = make_inputs(b, tokens, &in, d);
  if (!rc) rc = measure(b, &in, d);
  if (!rc) {
    out->tokens = tokens;
    out->b64_bytes = in.blen;
    out->reply_bytes = (size_t)in.rl;
    out->compact_reply_bytes = in.crl;
    for (int s = 0; s < ELDR_RB_NSTAGES; s++) out->rows[s] = summarize(STAGE_NAMES[s], b->t[s], b->cfg.iters);
    out->ratio_p50 = out->rows[ELDR_RB_SIG_DEC].p50_s / out->rows[ELDR_RB_MEMCPY].p50_s;
  }
  inputs_free(&in);
  return rc;
}
