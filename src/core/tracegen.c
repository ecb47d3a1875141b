/* tracegen.c — synthetic expert traces (see eldr/tracegen.h, docs/trace.md). */
#include "eldr/tracegen.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "eldr/grow.h"
#include "eldr/rng.h"

/* ------------------------------------------------------------------------ */
/* Model shapes (public Hugging Face configs, see docs/trace.md)            */

typedef struct shape_preset {
  const char *key, *canonical;
  uint32_t L, E, K;
  uint32_t first_layer, layer_step; /* MoE layer ids: first + i * step */
} shape_preset;

static const shape_preset k_shapes[] = {
    {"qwen3-30b-a3b", "Qwen3-30B-A3B", 48, 128, 8, 0, 1},
    {"gpt-oss-120b", "gpt-oss-120b", 36, 128, 4, 0, 1},
    {"qwen3-235b-a22b", "Qwen3-235B-A22B", 94, 128, 8, 0, 1},
    {"llama4-maverick", "Llama-4-Maverick-17B-128E-Instruct", 24, 128, 1, 1, 2},
    {"olmoe-1b-7b", "OLMoE-1B-7B-0924", 16, 64, 8, 0, 1},
    /* deepseek-ai/DeepSeek-V3: 61 layers, the first 3 dense, 256 routed experts top-8 */
    {"deepseek-v3", "DeepSeek-V3", 58, 256, 8, 3, 1},
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

static void copy_str(char *dst, size_t cap, const char *src) {
  if (!dst || !cap) return;
  snprintf(dst, cap, "%s", src);
}

static int parse_u32_strict(const char **p, uint32_t *out) {
  const char *s = *p;
  if (!isdigit((unsigned char)*s)) return -1;
  uint64_t v = 0;
  while (isdigit((unsigned char)*s)) {
    v = v * 10 + (uint64_t)(*s - '0');
    if (v > 0xffffffffu) return -1;
    s++;
  }
  *out = (uint32_t)v;
  *p = s;
  return 0;
}

int eldr_tracegen_model_shape(const char *name, eldr_shape *shape, char *canonical,
                              size_t canonical_cap, eldr_diag *d) {
  if (!name || !shape) return eldr_diag_fail(d, ELDR_EINVAL, "model name missing");
  for (size_t i = 0; i < N_SHAPES; i++) {
    if (strcmp(name, k_shapes[i].key) && strcmp(name, k_shapes[i].canonical)) continue;
    shape->num_layers = k_shapes[i].L;
    shape->num_experts = k_shapes[i].E;
    shape->top_k = k_shapes[i].K;
    copy_str(canonical, canonical_cap, k_shapes[i].canonical);
    return ELDR_OK;
  }
  if (!strncmp(name, "custom:", 7)) {
    const char *p = name + 7;
    uint32_t v[3];
    for (int i = 0; i < 3; i++) {
      if (parse_u32_strict(&p, &v[i]))
        return eldr_diag_fail(d, ELDR_EINVAL, "model '%s': expected custom:L,E,K (integers)", name);
      if (i < 2 && *p++ != ',')
        return eldr_diag_fail(d, ELDR_EINVAL, "model '%s': expected custom:L,E,K", name);
    }
    if (*p) return eldr_diag_fail(d, ELDR_EINVAL, "model '%s': expected custom:L,E,K", name);
    eldr_shape s = {v[0], v[1], v[2]};
    int rc = eldr_shape_validate(&s, d);
    if (rc) {
      eldr_diag_prefix(d, "model '%s'", name);
      return rc;
    }
    *shape = s;
    if (canonical && canonical_cap)
      snprintf(canonical, canonical_cap, "custom-%u-%u-%u", v[0], v[1], v[2]);
    return ELDR_OK;
  }
  return eldr_diag_fail(d, ELDR_EINVAL,
                        "unknown model '%s' (qwen3-30b-a3b, gpt-oss-120b, qwen3-235b-a22b, "
                        "llama4-maverick, olmoe-1b-7b, deepseek-v3, custom:L,E,K)",
                        name);
}

void eldr_tracegen_layer_ids(const char *model_name, const eldr_shape *shape, uint32_t *ids) {
  uint32_t first = 0, step = 1;
  for (size_t i = 0; model_name && i < N_SHAPES; i++) {
    if ((!strcmp(model_name, k_shapes[i].key) || !strcmp(model_name, k_shapes[i].canonical)) &&
        shape->num_layers == k_shapes[i].L) {
      first = k_shapes[i].first_layer;
      step = k_shapes[i].layer_step;
    }
  }
  for (uint32_t l = 0; l < shape->num_layers; l++) ids[l] = first + l * step;
}

/* ------------------------------------------------------------------------ */
/* Workloads                                                                */

/* Prompt/output lengths: log-normal with the means of LMSYS-Chat-1M (69.5
 * prompt tokens, 214.5 response tokens per turn); sigma is our choice (see
 * docs/trace.md), median = mean * exp(-sigma^2 / 2). */
static const eldr_tracegen_length k_prompt_len = {42.2, 1.0, 1, 8192};
static const eldr_tracegen_length k_output_len = {155.8, 0.8, 1, 4096};

static void set_domains(eldr_tracegen_workload *w, size_t n, const char *const *names,
                        const double *weights) {
  w->n_domains = n;
  for (size_t i = 0; i < n; i++) {
    copy_str(w->domain_names[i], sizeof w->domain_names[i], names[i]);
    w->domain_weight[i] = weights[i];
  }
}

int eldr_tracegen_workload_preset(const char *name, eldr_tracegen_workload *w, eldr_diag *d) {
  if (!name || !w) return eldr_diag_fail(d, ELDR_EINVAL, "workload name missing");
  memset(w, 0, sizeof *w);
  w->prompt = k_prompt_len;
  w->output = k_output_len;
  if (!strcmp(name, "task")) {
    static const char *const names[] = {"code", "math", "writing", "qa",
                                        "summarize", "translate", "reasoning"};
    /* traffic skew 1.4x: shares linear from 1.4 down to 1.0 */
    static const double weights[] = {1.4, 1.3333, 1.2667, 1.2, 1.1333, 1.0667, 1.0};
    copy_str(w->name, sizeof w->name, "task");
    set_domains(w, 7, names, weights);
    w->pop_sd = 0.3;
    w->generalists = 2;
    w->generalist_boost = 1.5;
    w->domain_sd = 1.1;
    w->request_sd = 0.6;
    w->prefill_sd = 0.25;
    w->decode_sd = 0.35;
    return ELDR_OK;
  }
  if (!strcmp(name, "language")) {
    static const char *const names[] = {"en", "zh", "es", "fr", "de", "ja", "ru", "ko"};
    /* top-2 = 75%, top-4 = 88% */
    static const double weights[] = {0.50, 0.25, 0.08, 0.05, 0.04, 0.035, 0.025, 0.02};
    copy_str(w->name, sizeof w->name, "language");
    set_domains(w, 8, names, weights);
    w->pop_sd = 0.6;
    w->generalists = 2;
    w->generalist_boost = 1.5;
    w->domain_sd = 0.75;
    w->request_sd = 0.7;
    w->prefill_sd = 0.25;
    w->decode_sd = 0.35;
    return ELDR_OK;
  }
  if (!strcmp(name, "realistic")) {
    /* Calibrated to measured statistics, not to the paper's: the real
     * Llama-4 trace's median prefill->decode Pearson (0.63) and same-domain
     * distinct-expert reduction (7-10% at batch 8-32), and OLMoE's real
     * popularity skew (top-10% share 0.23 pooled, 0.32 per domain); see
     * docs/trace.md. These are the values for a top-8 / 128-expert shape;
     * eldr_tracegen_realistic_for_shape adapts them to other shapes. */
    static const char *const names[] = {"code", "math", "writing", "qa",
                                        "summarize", "translate", "reasoning"};
    static const double weights[] = {1.4, 1.3333, 1.2667, 1.2, 1.1333, 1.0667, 1.0};
    copy_str(w->name, sizeof w->name, "realistic");
    set_domains(w, 7, names, weights);
    eldr_tracegen_realistic_for_shape(w, 8, 128);
    return ELDR_OK;
  }
  return eldr_diag_fail(d, ELDR_ENOTFOUND,
                        "unknown workload '%s' (realistic, task, language, custom:FILE)", name);
}

void eldr_tracegen_realistic_for_shape(eldr_tracegen_workload *w, uint32_t top_k,
                                       uint32_t num_experts) {
  /* Fewer selections per token need sharper logits for the same statistics
   * (each token says less about its request). Found by a grid over these
   * sds, measuring each shape with `eldr trace stats` (docs/trace.md); the
   * top-1 shape by a search against the real Llama-4 dev trace's summary
   * statistics (correlation, reduction, distinct experts, top-10% share). */
  double pop = 0.4, gen = 1.5, dom = 0.78, req = 0.6, pre = 0.4, dec = 0.7;
  uint32_t ngen = 2;
  if (top_k <= 1) { /* Llama-4-Maverick: top-1 of 128, its real trace's strong skew */
    pop = 1.6, ngen = num_experts > 8 ? 4 : 2, gen = 1.27, dom = 1.01, req = 1.1, pre = 1.1, dec = 0.55;
  } else if (top_k <= 4) { /* gpt-oss: top-4 of 128 */
    pop = 0.4, dom = 0.85, req = 0.8, pre = 0.45, dec = 0.7;
  } else if (num_experts <= 64) { /* OLMoE: top-8 of 64 */
    dec = 0.85;
  }
  w->pop_sd = pop;
  w->generalists = ngen;
  w->generalist_boost = gen;
  w->domain_sd = dom;
  w->request_sd = req;
  w->prefill_sd = pre;
  w->decode_sd = dec;
}

int eldr_tracegen_workload_validate(const eldr_tracegen_workload *w, eldr_diag *d) {
  if (!w) return eldr_diag_fail(d, ELDR_EINVAL, "workload missing");
  if (w->n_domains < 1 || w->n_domains > ELDR_TRACEGEN_MAX_DOMAINS)
    return eldr_diag_fail(d, ELDR_ERANGE, "workload: %zu domains, need 1..%d", w->n_domains,
                          ELDR_TRACEGEN_MAX_DOMAINS);
  for (size_t i = 0; i < w->n_domains; i++) {
    if (!w->domain_names[i][0])
      return eldr_diag_fail(d, ELDR_EINVAL, "workload: domain %zu has an empty name", i);
    if (!(w->domain_weight[i] > 0) || !isfinite(w->domain_weight[i]))
      return eldr_diag_fail(d, ELDR_ERANGE, "workload: domain '%s' weight %g must be > 0",
                            w->domain_names[i], w->domain_weight[i]);
    for (size_t j = 0; j < i; j++)
      if (!strcmp(w->domain_names[i], w->domain_names[j]))
        return eldr_diag_fail(d, ELDR_EINVAL, "workload: duplicate domain '%s'",
                              w->domain_names[i]);
  }
  const struct {
    const char *n;
    double v;
  } sds[] = {{"pop_sd", w->pop_sd},         {"generalist_boost", w->generalist_boost},
             {"domain_sd", w->domain_sd},   {"request_sd", w->request_sd},
             {"prefill_sd", w->prefill_sd}, {"decode_sd", w->decode_sd}};
  for (size_t i = 0; i < sizeof sds / sizeof sds[0]; i++)
    if (!(sds[i].v >= 0) || !(sds[i].v <= 20))
      return eldr_diag_fail(d, ELDR_ERANGE, "workload: %s %g out of range [0, 20]", sds[i].n,
                            sds[i].v);
  const struct {
    const char *n;
    const eldr_tracegen_length *l;
  } lens[] = {{"prompt", &w->prompt}, {"output", &w->output}};
  for (int i = 0; i < 2; i++) {
    const eldr_tracegen_length *l = lens[i].l;
    if (!(l->median >= 1) || !(l->median <= 1e6))
      return eldr_diag_fail(d, ELDR_ERANGE, "workload: %s.median %g out of range [1, 1e6]",
                            lens[i].n, l->median);
    if (!(l->sigma >= 0) || !(l->sigma <= 5))
      return eldr_diag_fail(d, ELDR_ERANGE, "workload: %s.sigma %g out of range [0, 5]",
                            lens[i].n, l->sigma);
    if (l->min < 1 || l->min > l->max || l->max > 1000000)
      return eldr_diag_fail(d, ELDR_ERANGE,
                            "workload: %s.min/max %u/%u need 1 <= min <= max <= 1000000",
                            lens[i].n, l->min, l->max);
  }
  return ELDR_OK;
}

static int json_num(json_t *o, const char *key, const char *ctx, double *out, eldr_diag *d) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_number(v))
    return eldr_diag_fail(d, ELDR_EPARSE, "workload: field '%s%s' must be a number", ctx, key);
  *out = json_number_value(v);
  return 0;
}

static int json_u32(json_t *o, const char *key, const char *ctx, uint32_t *out, eldr_diag *d) {
  json_t *v = json_object_get(o, key);
  if (!v) return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000)
    return eldr_diag_fail(d, ELDR_EPARSE,
                          "workload: field '%s%s' must be an integer in [0, 1000000]", ctx, key);
  *out = (uint32_t)json_integer_value(v);
  return 0;
}

static int check_keys(json_t *o, const char *const *allowed, const char *ctx, eldr_diag *d) {
  const char *key;
  json_t *v;
  json_object_foreach(o, key, v) {
    int ok = 0;
    for (size_t i = 0; allowed[i]; i++)
      if (!strcmp(key, allowed[i])) ok = 1;
    if (!ok) return eldr_diag_fail(d, ELDR_EPARSE, "workload: unknown field '%s%s'", ctx, key);
  }
  return 0;
}

static int parse_length(json_t *root, const char *key, eldr_tracegen_length *l, eldr_diag *d) {
  json_t *o = json_object_get(root, key);
  if (!o) return 0;
  if (!json_is_object(o))
    return eldr_diag_fail(d, ELDR_EPARSE, "workload: field '%s' must be an object", key);
  static const char *const allowed[] = {"median", "sigma", "min", "max", NULL};
  char ctx[32];
  snprintf(ctx, sizeof ctx, "%s.", key);
  int rc;
  if ((rc = check_keys(o, allowed, ctx, d))) return rc;
  if ((rc = json_num(o, "median", ctx, &l->median, d))) return rc;
  if ((rc = json_num(o, "sigma", ctx, &l->sigma, d))) return rc;
  if ((rc = json_u32(o, "min", ctx, &l->min, d))) return rc;
  if ((rc = json_u32(o, "max", ctx, &l->max, d))) return rc;
  return 0;
}

int eldr_tracegen_workload_parse(const char *json, size_t len, eldr_tracegen_workload *w,
                                 eldr_diag *d) {
  if (!json || !w) return eldr_diag_fail(d, ELDR_EINVAL, "workload text missing");
  json_error_t jerr;
  json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!root)
    return eldr_diag_fail(d, ELDR_EPARSE, "workload: line %d: %s", jerr.line, jerr.text);
  int rc = 0;
  static const char *const allowed[] = {
      "base",       "name",       "domains",   "pop_sd", "generalists", "generalist_boost",
      "domain_sd",  "request_sd", "prefill_sd", "decode_sd", "prompt",  "output",
      NULL};
  if (!json_is_object(root)) {
    rc = eldr_diag_fail(d, ELDR_EPARSE, "workload: top level must be an object");
    goto out;
  }
  if ((rc = check_keys(root, allowed, "", d))) goto out;
  const char *base = "task";
  json_t *b = json_object_get(root, "base");
  if (b) {
    if (!json_is_string(b)) {
      rc = eldr_diag_fail(d, ELDR_EPARSE, "workload: field 'base' must be a string");
      goto out;
    }
    base = json_string_value(b);
  }
  if ((rc = eldr_tracegen_workload_preset(base, w, d))) {
    eldr_diag_prefix(d, "workload: field 'base'");
    goto out;
  }
  copy_str(w->name, sizeof w->name, "custom");
  json_t *nm = json_object_get(root, "name");
  if (nm) {
    if (!json_is_string(nm) || !json_string_length(nm) ||
        json_string_length(nm) >= ELDR_TRACEGEN_NAME_MAX) {
      rc = eldr_diag_fail(d, ELDR_EPARSE, "workload: field 'name' must be a string of 1..%d bytes",
                          ELDR_TRACEGEN_NAME_MAX - 1);
      goto out;
    }
    copy_str(w->name, sizeof w->name, json_string_value(nm));
  }
  json_t *doms = json_object_get(root, "domains");
  if (doms) {
    if (!json_is_array(doms) || json_array_size(doms) < 1 ||
        json_array_size(doms) > ELDR_TRACEGEN_MAX_DOMAINS) {
      rc = eldr_diag_fail(d, ELDR_EPARSE, "workload: field 'domains' must be an array of 1..%d",
                          ELDR_TRACEGEN_MAX_DOMAINS);
      goto out;
    }
    w->n_domains = json_array_size(doms);
    for (size_t i = 0; i < w->n_domains; i++) {
      json_t *e = json_array_get(doms, i);
      json_t *n = json_is_object(e) ? json_object_get(e, "name") : NULL;
      json_t *wt = json_is_object(e) ? json_object_get(e, "weight") : NULL;
      if (!n || !json_is_string(n) || !json_string_length(n) ||
          json_string_length(n) >= ELDR_TRACEGEN_NAME_MAX || strlen(json_string_value(n)) !=
          json_string_length(n)) {
        rc = eldr_diag_fail(d, ELDR_EPARSE,
                            "workload: domains[%zu].name must be a string of 1..%d bytes", i,
                            ELDR_TRACEGEN_NAME_MAX - 1);
        goto out;
      }
      if (json_object_size(e) != (wt ? 2u : 1u)) {
        rc = eldr_diag_fail(d, ELDR_EPARSE,
                            "workload: domains[%zu] may only have 'name' and 'weight'", i);
        goto out;
      }
      if (wt && !json_is_number(wt)) {
        rc = eldr_diag_fail(d, ELDR_EPARSE, "workload: domains[%zu].weight must be a number", i);
        goto out;
      }
      copy_str(w->domain_names[i], sizeof w->domain_names[i], json_string_value(n));
      w->domain_weight[i] = wt ? json_number_value(wt) : 1.0;
    }
  }
  if ((rc = json_num(root, "pop_sd", "", &w->pop_sd, d))) goto out;
  if ((rc = json_u32(root, "generalists", "", &w->generalists, d))) goto out;
  if ((rc = json_num(root, "generalist_boost", "", &w->generalist_boost, d))) goto out;
  if ((rc = json_num(root, "domain_sd", "", &w->domain_sd, d))) goto out;
  if ((rc = json_num(root, "request_sd", "", &w->request_sd, d))) goto out;
  if ((rc = json_num(root, "prefill_sd", "", &w->prefill_sd, d))) goto out;
  if ((rc = json_num(root, "decode_sd", "", &w->decode_sd, d))) goto out;
  if ((rc = parse_length(root, "prompt", &w->prompt, d))) goto out;
  if ((rc = parse_length(root, "output", &w->output, d))) goto out;
  rc = eldr_tracegen_workload_validate(w, d);
out:
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Generator                                                                */

typedef struct scratch {
  float *logit;    /* L*E request logits R */
  float *prob;     /* L*E normalised probabilities of the current phase */
  float *aprob;    /* L*E alias acceptance (construction) */
  uint32_t *thr;   /* L*E acceptance as a 16-bit threshold: u16 < thr <=> u16 / 65536 < aprob */
  uint16_t *alias; /* L*E alias targets */
  uint32_t *mark;  /* E stamps */
  uint32_t stamp;
  uint32_t *small, *large; /* E work lists for alias construction */
} scratch;

struct eldr_tracegen {
  eldr_shape shape;
  char model[128];
  uint32_t *layer_ids;
  eldr_tracegen_workload w;
  uint64_t seed;
  float *dom_logit; /* D*L*E: pop + generalist + domain */
  double cum_weight[ELDR_TRACEGEN_MAX_DOMAINS];
  uint32_t force_decode, max_decode, max_prompt;
  scratch sc;
  uint16_t *pre_buf, *dec_buf;
  size_t pre_cap, dec_cap; /* in tokens */
};

static void scratch_free(scratch *s) {
  free(s->logit);
  free(s->prob);
  free(s->aprob);
  free(s->thr);
  free(s->alias);
  free(s->mark);
  free(s->small);
  free(s->large);
  memset(s, 0, sizeof *s);
}

static int scratch_init(scratch *s, const eldr_shape *sh) {
  size_t cells = eldr_shape_cells(sh);
  memset(s, 0, sizeof *s);
  s->logit = malloc(cells * sizeof *s->logit);
  s->prob = malloc(cells * sizeof *s->prob);
  s->aprob = malloc(cells * sizeof *s->aprob);
  s->thr = malloc(cells * sizeof *s->thr);
  s->alias = malloc(cells * sizeof *s->alias);
  s->mark = calloc(sh->num_experts, sizeof *s->mark);
  s->small = malloc(sh->num_experts * sizeof *s->small);
  s->large = malloc(sh->num_experts * sizeof *s->large);
  if (!s->logit || !s->prob || !s->aprob || !s->thr || !s->alias || !s->mark || !s->small || !s->large) {
    scratch_free(s);
    return ELDR_ENOMEM;
  }
  return 0;
}

/* Fill v[0..n) with standard normals (Box-Muller, both outputs used). */
static void fill_normal(eldr_rng *r, float *v, size_t n, float scale, int add) {
  size_t i = 0;
  while (i < n) {
    double u1 = eldr_rng_bits_to_unit(eldr_rng_next(r));
    double u2 = eldr_rng_bits_to_unit(eldr_rng_next(r));
    if (u1 < 1e-300) u1 = 1e-300;
    double rad = sqrt(-2.0 * log(u1)) * scale, th = 6.283185307179586 * u2;
    float a = (float)(rad * cos(th)), b = (float)(rad * sin(th));
    if (add) {
      v[i++] += a;
      if (i < n) v[i++] += b;
    } else {
      v[i++] = a;
      if (i < n) v[i++] = b;
    }
  }
}

static uint32_t draw_length(eldr_rng *r, const eldr_tracegen_length *l) {
  double x = exp(log(l->median) + l->sigma * eldr_rng_normal(r));
  if (!(x < 4e9)) x = 4e9;
  uint32_t n = (uint32_t)llround(x);
  if (n < l->min) n = l->min;
  if (n > l->max) n = l->max;
  return n;
}

int eldr_tracegen_new_workload(const eldr_shape *shape, const char *model_name,
                               const eldr_tracegen_workload *w, uint64_t seed,
                               eldr_tracegen **out, eldr_diag *d) {
  if (!out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: out missing");
  *out = NULL;
  int rc = eldr_shape_validate(shape, d);
  if (rc) return rc;
  if (shape->num_experts > 65536)
    return eldr_diag_fail(d, ELDR_ERANGE, "tracegen: num_experts %u > 65536",
                          shape->num_experts);
  if ((rc = eldr_tracegen_workload_validate(w, d))) return rc;
  if (w->generalists >= shape->num_experts && w->generalists > 0)
    return eldr_diag_fail(d, ELDR_ERANGE, "workload: generalists %u must be < num_experts %u",
                          w->generalists, shape->num_experts);
  eldr_tracegen *g = calloc(1, sizeof *g);
  if (!g) return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  g->shape = *shape;
  g->w = *w;
  g->seed = seed;
  copy_str(g->model, sizeof g->model, model_name ? model_name : "custom");
  const size_t L = shape->num_layers, E = shape->num_experts, D = w->n_domains;
  const size_t cells = L * E;
  g->layer_ids = malloc(L * sizeof *g->layer_ids);
  g->dom_logit = malloc(D * cells * sizeof *g->dom_logit);
  float *pop = malloc(cells * sizeof *pop);
  uint32_t *perm = malloc(E * sizeof *perm);
  if (!g->layer_ids || !g->dom_logit || !pop || !perm || scratch_init(&g->sc, shape)) {
    free(pop);
    free(perm);
    eldr_tracegen_free(g);
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  }
  eldr_tracegen_layer_ids(model_name, shape, g->layer_ids);
  /* model tables: global popularity, generalists, per-domain preferences */
  uint64_t st = seed ^ 0x7472616365676e31ULL; /* "tracegn1" */
  eldr_rng r;
  eldr_rng_seed(&r, eldr_splitmix64(&st));
  fill_normal(&r, pop, cells, (float)w->pop_sd, 0);
  for (size_t l = 0; l < L; l++) {
    for (size_t e = 0; e < E; e++) perm[e] = (uint32_t)e;
    for (size_t j = 0; j < w->generalists; j++) { /* partial Fisher-Yates */
      size_t k = j + (size_t)eldr_rng_below(&r, E - j);
      uint32_t t = perm[j];
      perm[j] = perm[k];
      perm[k] = t;
      pop[l * E + perm[j]] += (float)w->generalist_boost;
    }
  }
  for (size_t dm = 0; dm < D; dm++) {
    float *dl = g->dom_logit + dm * cells;
    fill_normal(&r, dl, cells, (float)w->domain_sd, 0);
    for (size_t c = 0; c < cells; c++) dl[c] += pop[c];
  }
  double acc = 0;
  for (size_t dm = 0; dm < D; dm++) acc += w->domain_weight[dm];
  double run = 0;
  for (size_t dm = 0; dm < D; dm++) {
    run += w->domain_weight[dm] / acc;
    g->cum_weight[dm] = run;
  }
  g->cum_weight[D - 1] = 1.0;
  free(pop);
  free(perm);
  *out = g;
  return ELDR_OK;
}

void eldr_tracegen_free(eldr_tracegen *g) {
  if (!g) return;
  free(g->dec_buf);
  free(g->pre_buf);
  scratch_free(&g->sc);
  free(g->dom_logit);
  free(g->layer_ids);
  free(g);
}

void eldr_tracegen_set_lengths(eldr_tracegen *g, uint32_t force_decode, uint32_t max_decode,
                               uint32_t max_prompt) {
  g->force_decode = force_decode;
  g->max_decode = max_decode;
  g->max_prompt = max_prompt;
}

size_t eldr_tracegen_domains(const eldr_tracegen *g) { return g->w.n_domains; }
const char *eldr_tracegen_domain_name(const eldr_tracegen *g, size_t i) {
  return i < g->w.n_domains ? g->w.domain_names[i] : NULL;
}
const eldr_tracegen_workload *eldr_tracegen_get_workload(const eldr_tracegen *g) { return &g->w; }
const eldr_shape *eldr_tracegen_shape(const eldr_tracegen *g) { return &g->shape; }
const char *eldr_tracegen_model(const eldr_tracegen *g) { return g->model; }
const uint32_t *eldr_tracegen_layer_ids_of(const eldr_tracegen *g) { return g->layer_ids; }

/* Softmax of base + sd*N(0,1) per layer into s->prob, and Vose alias tables. */
static void build_phase(const eldr_shape *sh, scratch *s, eldr_rng *r, double sd) {
  const size_t L = sh->num_layers, E = sh->num_experts;
  float *p = s->prob;
  memcpy(p, s->logit, L * E * sizeof *p);
  if (sd > 0) fill_normal(r, p, L * E, (float)sd, 1);
  for (size_t l = 0; l < L; l++) {
    float *pl = p + l * E;
    float mx = pl[0];
    for (size_t e = 1; e < E; e++)
      if (pl[e] > mx) mx = pl[e];
    double sum = 0;
    for (size_t e = 0; e < E; e++) {
      pl[e] = expf(pl[e] - mx);
      sum += pl[e];
    }
    float inv = (float)(1.0 / sum);
    for (size_t e = 0; e < E; e++) pl[e] *= inv;
    /* Vose's alias method */
    float *ap = s->aprob + l * E;
    uint16_t *al = s->alias + l * E;
    size_t ns = 0, nl = 0;
    for (size_t e = 0; e < E; e++) {
      ap[e] = pl[e] * (float)E;
      if (ap[e] < 1.0f)
        s->small[ns++] = (uint32_t)e;
      else
        s->large[nl++] = (uint32_t)e;
    }
    while (ns && nl) {
      uint32_t a = s->small[--ns], b = s->large[--nl];
      al[a] = (uint16_t)b;
      ap[b] = (ap[b] + ap[a]) - 1.0f;
      if (ap[b] < 1.0f)
        s->small[ns++] = b;
      else
        s->large[nl++] = b;
    }
    while (nl) {
      uint32_t b = s->large[--nl];
      ap[b] = 1.0f;
      al[b] = (uint16_t)b;
    }
    while (ns) {
      uint32_t a = s->small[--ns];
      ap[a] = 1.0f;
      al[a] = (uint16_t)a;
    }
    /* u / 65536 < ap  <=>  u < ap * 65536 (exact: a power-of-two scale)
     * <=>  u < ceil(ap * 65536) for an integer u */
    uint32_t *th = s->thr + l * E;
    for (size_t e = 0; e < E; e++) th[e] = (uint32_t)ceilf(ap[e] * 65536.0f);
  }
}

/* The exact fallback after 64 redraws: one draw from the mass not yet taken
 * for this token (taken summed in the order the experts were drawn). */
static uint32_t draw_rest(const float *pl, const uint32_t *mark, uint32_t st, uint32_t E,
                          const uint16_t *o, uint32_t k, eldr_rng *r) {
  double taken = 0;
  for (uint32_t j = 0; j < k; j++) taken += pl[o[j]];
  double rest = 1.0 - taken;
  double x = eldr_rng_bits_to_unit(eldr_rng_next(r)) * (rest > 0 ? rest : 0);
  uint32_t e, last = E;
  for (e = 0; e < E; e++) {
    if (mark[e] == st) continue;
    last = e;
    x -= pl[e];
    if (x < 0) break;
  }
  return e >= E ? last : e;
}

/* ntok tokens: per token and layer, K distinct experts by successive
 * sampling without replacement from s->prob (alias draws, redrawing an
 * expert already taken for that token; after 64 redraws an exact scan over
 * the remaining mass). The rng state lives in registers for the loop and
 * the alias choice is branch-free. */
static void sample_tokens(const eldr_shape *sh, scratch *s, eldr_rng *r, uint32_t ntok,
                          uint16_t *out) {
  const uint32_t L = sh->num_layers, E = sh->num_experts, K = sh->top_k;
  eldr_rng rr = *r;
  uint32_t *mark = s->mark;
  uint32_t stamp = s->stamp;
  for (uint32_t t = 0; t < ntok; t++) {
    for (uint32_t l = 0; l < L; l++) {
      const uint32_t *th = s->thr + (size_t)l * E;
      const uint16_t *al = s->alias + (size_t)l * E;
      uint16_t *o = out + ((size_t)t * L + l) * K;
      if (++stamp == 0) {
        memset(mark, 0, E * sizeof *mark);
        stamp = 1;
      }
      const uint32_t st = stamp;
      uint64_t bits = 0;
      int nbits = 0; /* 32-bit halves left in bits */
      for (uint32_t k = 0; k < K; k++) {
        uint32_t e = 0;
        int tries = 0;
        for (; tries < 64; tries++) {
          /* one alias draw per 32 random bits: 16 for the column (E <=
           * 65536), 16 for the acceptance test */
          if (!nbits) {
            bits = eldr_rng_next(&rr);
            nbits = 2;
          }
          uint32_t u = (uint32_t)bits;
          bits >>= 32;
          nbits--;
          uint32_t i = ((u >> 16) * E) >> 16;
          uint32_t keep = 0u - (uint32_t)((u & 0xffffu) < th[i]);
          e = (i & keep) | ((uint32_t)al[i] & ~keep);
          if (mark[e] != st) break;
        }
        if (tries == 64) e = draw_rest(s->prob + (size_t)l * E, mark, st, E, o, k, &rr);
        mark[e] = st;
        o[k] = (uint16_t)e;
      }
    }
  }
  s->stamp = stamp;
  *r = rr;
}

/* Generate a request of domain dm with rng r into pre/dec. */
static void gen_core(const eldr_tracegen *g, scratch *s, eldr_rng *r, int dm, uint32_t n_pre,
                     uint32_t n_dec, uint16_t *pre, uint16_t *dec) {
  const size_t cells = eldr_shape_cells(&g->shape);
  memcpy(s->logit, g->dom_logit + (size_t)dm * cells, cells * sizeof *s->logit);
  if (g->w.request_sd > 0) fill_normal(r, s->logit, cells, (float)g->w.request_sd, 1);
  build_phase(&g->shape, s, r, g->w.prefill_sd);
  sample_tokens(&g->shape, s, r, n_pre, pre);
  build_phase(&g->shape, s, r, g->w.decode_sd);
  sample_tokens(&g->shape, s, r, n_dec, dec);
}

static int ensure_buf(uint16_t **buf, size_t *cap, uint32_t ntok, size_t per_tok) {
  return eldr_grow(buf, cap, ntok ? ntok : 1, per_tok * sizeof **buf, 1);
}

int eldr_tracegen_request(eldr_tracegen *g, size_t index, eldr_tracegen_req *out, eldr_diag *d) {
  if (!g || !out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  uint64_t st = g->seed ^ ((uint64_t)index * 0xd1b54a32d192ed03ULL);
  eldr_rng r;
  st = eldr_splitmix64(&st) ^ 0x5265717565737421ULL;
  eldr_rng_seed(&r, eldr_splitmix64(&st));
  double u = eldr_rng_uniform(&r);
  int dm = 0;
  while ((size_t)dm + 1 < g->w.n_domains && u >= g->cum_weight[dm]) dm++;
  uint32_t n_pre = draw_length(&r, &g->w.prompt);
  uint32_t n_dec = draw_length(&r, &g->w.output);
  if (g->max_prompt && n_pre > g->max_prompt) n_pre = g->max_prompt;
  if (g->max_decode && n_dec > g->max_decode) n_dec = g->max_decode;
  if (g->force_decode) n_dec = g->force_decode;
  const size_t per = (size_t)g->shape.num_layers * g->shape.top_k;
  if (ensure_buf(&g->pre_buf, &g->pre_cap, n_pre, per) ||
      ensure_buf(&g->dec_buf, &g->dec_cap, n_dec, per))
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory (%u + %u tokens)", n_pre,
                          n_dec);
  gen_core(g, &g->sc, &r, dm, n_pre, n_dec, g->pre_buf, g->dec_buf);
  out->domain = dm;
  out->n_prefill = n_pre;
  out->n_decode = n_dec;
  out->prefill = g->pre_buf;
  out->decode = g->dec_buf;
  return ELDR_OK;
}

eldr_trace *eldr_tracegen_trace_header(const eldr_tracegen *g) {
  eldr_trace *t = eldr_trace_new(g->model, &g->shape, g->layer_ids);
  if (!t) return NULL;
  char gen[ELDR_TRACEGEN_NAME_MAX + 64];
  eldr_tracegen_provenance(g, gen, sizeof gen);
  if (eldr_trace_set_generator(t, gen)) {
    eldr_trace_free(t);
    return NULL;
  }
  for (size_t i = 0; i < g->w.n_domains; i++) {
    if (eldr_trace_domain_intern(t, g->w.domain_names[i]) < 0) {
      eldr_trace_free(t);
      return NULL;
    }
  }
  return t;
}

void eldr_tracegen_provenance(const eldr_tracegen *g, char *buf, size_t cap) {
  snprintf(buf, cap, "eldr-tracegen workload=%s seed=%llu", g->w.name,
           (unsigned long long)g->seed);
}

void eldr_tracegen_request_id(const eldr_tracegen *g, size_t index, int domain, char *buf,
                              size_t cap) {
  const char *dn = domain >= 0 && (size_t)domain < g->w.n_domains ? g->w.domain_names[domain]
                                                                  : "req";
  snprintf(buf, cap, "%s/%zu", dn, index);
}

int eldr_tracegen_generate(eldr_tracegen *g, size_t n, eldr_trace **out, eldr_diag *d) {
  if (!g || !out) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  *out = NULL;
  if (n == 0) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: zero requests");
  eldr_trace *t = eldr_tracegen_trace_header(g);
  if (!t) return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  for (size_t i = 0; i < n; i++) {
    eldr_tracegen_req rq;
    int rc = eldr_tracegen_request(g, i, &rq, d);
    if (rc) {
      eldr_trace_free(t);
      return rc;
    }
    char id[96];
    eldr_tracegen_request_id(g, i, rq.domain, id, sizeof id);
    rc = eldr_trace_append(t, id, g->w.domain_names[rq.domain], NULL, -1.0, rq.prefill,
                           rq.n_prefill, rq.decode, rq.n_decode, NULL);
    if (rc < 0) {
      eldr_trace_free(t);
      return eldr_diag_fail(d, rc, "tracegen: appending request %zu: %s", i, eldr_strerror(rc));
    }
  }
  *out = t;
  return ELDR_OK;
}

/* ------------------------------------------------------------------------ */
/* Text -> domain: a fixed, hand-written style classifier                   */

enum { ARCH_CODE, ARCH_MATH, ARCH_PROSE, ARCH_WEB, ARCH_ENCYC, ARCH_CHAT, ARCH_INTL, N_ARCH };

static int word_in(const char *w, size_t n, const char *const *list) {
  for (size_t i = 0; list[i]; i++)
    if (strlen(list[i]) == n && !memcmp(list[i], w, n)) return 1;
  return 0;
}

int eldr_tracegen_text_domain(const char *text, size_t len, size_t n_domains) {
  if (n_domains <= 1 || !text) return 0;
  static const char *const code_w[] = {"int", "def", "import", "void", "include", "elif",
                                       "struct", "null", "println", "var", "self", "std",
                                       "printf", "namespace", "endif", "bool", "args", "len",
                                       "nil", "func", "typedef", "enum", "const", "char",
                                       "sizeof", "malloc", "async", "await", "lambda", NULL};
  static const char *const math_w[] = {"theorem", "lemma", "proof", "equation", "let",
                                       "we", "where", "function", "prove", "hence",
                                       "thus", "model", "paper", "results", "show",
                                       "frac", "begin", "end", "mathbb", "alpha", NULL};
  static const char *const prose_w[] = {"he", "she", "his", "her", "said", "him",
                                        "was", "had", "looked", "eyes", "back", "could",
                                        "didn", "don", "felt", "thought", "into", NULL};
  static const char *const web_w[] = {"you", "your", "our", "we", "free", "click",
                                      "online", "best", "get", "more", "new", "can",
                                      "will", "shop", "home", "service", "price", NULL};
  static const char *const enc_w[] = {"was", "born", "county", "american", "known", "served",
                                      "located", "references", "university", "album",
                                      "species", "century", "population", "district",
                                      "released", "film", "team", "season", "league", "river",
                                      "city", "village", "national", "became", NULL};
  static const char *const chat_w[] = {"what", "how", "why", "can", "please", "explain",
                                       "write", "help", "tell", "me", "i", "my", "could",
                                       "would", NULL};
  double sc[N_ARCH] = {0};
  size_t words = 0, braces = 0, semis = 0, latex = 0, quotes = 0, digits = 0, qmarks = 0,
         newlines = 0, nonascii = 0;
  char w[32];
  size_t wn = 0;
  for (size_t i = 0; i <= len; i++) {
    unsigned char c = i < len ? (unsigned char)text[i] : ' ';
    if (isalpha(c)) {
      if (wn < sizeof w) w[wn] = (char)tolower(c);
      wn++;
      continue;
    }
    if (wn) {
      if (wn <= sizeof w) {
        words++;
        if (word_in(w, wn, code_w)) sc[ARCH_CODE] += 1;
        if (word_in(w, wn, math_w)) sc[ARCH_MATH] += 1;
        if (word_in(w, wn, prose_w)) sc[ARCH_PROSE] += 1;
        if (word_in(w, wn, web_w)) sc[ARCH_WEB] += 1;
        if (word_in(w, wn, enc_w)) sc[ARCH_ENCYC] += 1;
        if (word_in(w, wn, chat_w)) sc[ARCH_CHAT] += 1;
      }
      wn = 0;
    }
    switch (c) {
    case '{': case '}': case '=': case '<': case '>': case '[': case ']':
      braces++;
      break;
    case ';': semis++; break;
    case '\\': case '$': case '^': latex++; break;
    case '"': quotes++; break;
    case '?': qmarks++; break;
    case '\n': newlines++; break;
    default:
      if (isdigit(c)) digits++;
      /* UTF-8 lead bytes of letters outside ASCII (not 0xE2: punctuation
       * such as curly quotes and dashes) */
      if (c >= 0xC2 && c != 0xE2) nonascii++;
    }
  }
  double nw = words ? (double)words : 1.0;
  /* braces in LaTeX-heavy text are maths, not code */
  double code_p = (double)braces + 3.0 * (double)semis - 2.0 * (double)latex;
  sc[ARCH_CODE] += code_p > 0 ? code_p : 0;
  sc[ARCH_MATH] += 3.0 * (double)latex;
  sc[ARCH_PROSE] += 1.0 * (double)quotes;
  sc[ARCH_ENCYC] += 0.3 * (double)digits;
  sc[ARCH_CHAT] += 3.0 * (double)qmarks;
  sc[ARCH_INTL] += 1.5 * (double)nonascii;
  (void)nw;
  (void)newlines;
  int best = ARCH_WEB; /* default: generic web text */
  double bv = sc[ARCH_WEB];
  for (int a = 0; a < N_ARCH; a++)
    if (sc[a] > bv) {
      bv = sc[a];
      best = a;
    }
  return (int)((size_t)best % n_domains);
}

int eldr_tracegen_from_text(const eldr_tracegen *g, const char *text, size_t len,
                            uint32_t n_prefill, uint32_t n_decode, uint16_t **prefill,
                            uint16_t **decode, int *domain, eldr_diag *d) {
  if (!g || !prefill || !decode) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: argument missing");
  *prefill = NULL;
  *decode = NULL;
  if (!text && len) return eldr_diag_fail(d, ELDR_EINVAL, "tracegen: text missing");
  const size_t per = (size_t)g->shape.num_layers * g->shape.top_k;
  if ((uint64_t)n_prefill + n_decode > (64u << 20) / per + 1)
    return eldr_diag_fail(d, ELDR_ERANGE, "tracegen: %u + %u tokens is too many", n_prefill,
                          n_decode);
  int dm = eldr_tracegen_text_domain(text ? text : "", len, g->w.n_domains);
  scratch s;
  if (scratch_init(&s, &g->shape)) return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  uint16_t *pre = malloc((n_prefill ? n_prefill : 1) * per * sizeof *pre);
  uint16_t *dec = malloc((n_decode ? n_decode : 1) * per * sizeof *dec);
  if (!pre || !dec) {
    free(dec);
    free(pre);
    scratch_free(&s);
    return eldr_diag_fail(d, ELDR_ENOMEM, "tracegen: out of memory");
  }
  uint64_t h = XXH64(text ? text : "", len, g->seed ^ 0x66726f6d74657874ULL);
  eldr_rng r;
  eldr_rng_seed(&r, h);
  gen_core(g, &s, &r, dm, n_prefill, n_decode, pre, dec);
  scratch_free(&s);
  *prefill = pre;
  *decode = dec;
  if (domain) *domain = dm;
  return ELDR_OK;
}
