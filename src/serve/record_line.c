/* record_line.c — one request's record (record.h): the item, and its line
 * in the trace format's counts form: the prompt's rows read out of the
 * prefill reply and counted, the decode reply's generated rows and usage,
 * the "serve" object; written by eldr_trace_format_counts. Runs on the
 * writer thread (any thread: it touches only the item). */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/grow.h"
#include "eldr/reply.h"
#include "eldr/trace.h"
#include "record.h"
#include "serve_internal.h"
#include "sigpath.h"

/* ---- items ------------------------------------------------------------------ */

eldr__rec_item *eldr__rec_item_new(const eldr_shape *s, const uint32_t *layer_ids) {
  eldr__rec_item *it = calloc(1, sizeof *it);
  if (!it) return NULL;
  it->shape = *s;
  it->layer_ids = malloc(s->num_layers * sizeof *it->layer_ids);
  if (!it->layer_ids) {
    free(it);
    return NULL;
  }
  for (uint32_t l = 0; l < s->num_layers; l++) it->layer_ids[l] = layer_ids ? layer_ids[l] : l;
  it->decoder_index = it->centroid = -1;
  it->prompt_tokens = it->output_tokens = -1;
  it->ttft_ms = it->tpot_ms = NAN;
  it->policy = it->reason = "";
  it->bytes = sizeof *it + s->num_layers * sizeof *it->layer_ids;
  return it;
}

void eldr__rec_item_free(eldr__rec_item *it) {
  if (!it) return;
  json_decref(it->prefill_root);
  free(it->layer_ids);
  free(it->prefill_counts);
  free(it->prefill_raw);
  free(it->decode_body);
  free(it->sims);
  free(it);
}

/* ---- the line ------------------------------------------------------------------ */

typedef struct sb {
  char *p;
  size_t n, cap;
  int bad;
} sb;

static void sb_need(sb *b, size_t more) {
  if (b->bad) return;
  if (eldr_grow(&b->p, &b->cap, b->n + more + 1, 1, 4096)) b->bad = 1;
}

static void sb_put(sb *b, const char *s, size_t n) {
  sb_need(b, n);
  if (b->bad) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

#define sb_lit(b, s) sb_put(b, "" s, sizeof(s) - 1) /* s: a string literal */

static void sb_printf(sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *b, const char *fmt, ...) {
  sb_need(b, 64);
  if (b->bad) return;
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
  va_end(ap);
  if (k < 0) {
    b->bad = 1;
    return;
  }
  if ((size_t)k >= b->cap - b->n) {
    sb_need(b, (size_t)k + 1);
    if (b->bad) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
  }
  b->n += (size_t)k;
}

/* A JSON string (the values here are ids, URLs and model names). */
static void sb_str(sb *b, const char *s) {
  sb_lit(b, "\"");
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char e[2] = {'\\', (char)c};
      sb_put(b, e, 2);
    } else if (c < 0x20) {
      sb_printf(b, "\\u%04x", c);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_lit(b, "\"");
}

static void sb_num(sb *b, double x, const char *fmt) {
  if (isfinite(x)) sb_printf(b, fmt, x);
  else sb_lit(b, "null");
}

/* The generated rows of the decode reply counted into dc (L*E): their
 * number, or -1 (eldr_reply_decode_counts, the watch's reader too).
 * *out_tokens: usage.completion_tokens (unchanged when absent). */
static int64_t decode_counts(const eldr__rec_item *it, uint32_t *dc, int64_t *out_tokens) {
  return eldr_reply_decode_counts(it->decode_body, it->decode_len, it->chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS,
                                  &it->shape, it->layer_ids, it->prompt_tokens, dc, out_tokens);
}

/* The prompt rows of the prefill reply tree over the model's MoE layers
 * (eldr_reply_prompt_rows: the artifact's layers the item was made with,
 * else the reply's model's preset, else less the dense layers' rows),
 * counted into a new buffer: it->shape and it->layer_ids become the rows'
 * (E: it->experts). 0 or -1. */
static int root_counts(eldr__rec_item *it, uint32_t **out, uint32_t *tokens) {
  eldr_reply_experts rex;
  eldr_re_view v;
  eldr_shape sh;
  uint32_t ids[ELDR_MAX_LAYERS];
  if (eldr_reply_prompt_rows(it->prefill_root, it->chat ? ELDR_RE_CHAT : ELDR_RE_COMPLETIONS, it->experts,
                             it->from_artifact ? &it->shape : NULL, it->layer_ids, &rex, &v, &sh, ids) != 0)
    return -1;
  int rc = -1;
  uint32_t *c = calloc(eldr_shape_cells(&sh), sizeof *c);
  uint32_t *ly = c ? realloc(it->layer_ids, sh.num_layers * sizeof *ly) : NULL;
  if (ly) {
    memcpy(ly, ids, sh.num_layers * sizeof *ly);
    it->layer_ids = ly;
  }
  if (ly && eldr_counts_accumulate(&sh, v.data, v.dtype, v.rows, c, NULL) == 0) {
    it->shape = sh;
    *out = c;
    *tokens = (uint32_t)v.rows;
    rc = 0;
  } else {
    free(c);
  }
  eldr_reply_experts_free(&rex);
  return rc;
}

int eldr__rec_format(eldr__rec_item *it, char **line, size_t *len) {
  *line = NULL;
  *len = 0;
  uint32_t *pc = it->prefill_counts, *own = NULL, *dc = NULL;
  uint32_t ptok = it->prefill_tokens;
  if (!pc && it->prefill_root) {
    if (root_counts(it, &own, &ptok) != 0) return ELDR_EEMPTY;
    pc = own;
  }
  const eldr_shape *s = &it->shape;
  size_t cells = eldr_shape_cells(s);
  if (!pc && it->prefill_raw) {
    if (!(own = calloc(cells, sizeof *own))) return ELDR_ENOMEM;
    if (eldr_counts_accumulate(s, it->prefill_raw, it->prefill_dtype, it->prefill_rows, own, NULL) != 0 ||
        it->prefill_rows > UINT32_MAX) {
      free(own);
      return ELDR_EEMPTY;
    }
    pc = own;
    ptok = (uint32_t)it->prefill_rows;
  }
  if (!pc) return ELDR_EEMPTY;
  int64_t out_tokens = it->output_tokens, drows = -1;
  if (it->decode_body) {
    if (!(dc = malloc(cells * sizeof *dc))) {
      free(own);
      return ELDR_ENOMEM;
    }
    drows = decode_counts(it, dc, &out_tokens);
  }
  /* the decision, as the "serve" object (opaque to readers) */
  sb b = {0};
  sb_lit(&b, "{\"decoder\":");
  if (it->decoder[0]) sb_str(&b, it->decoder);
  else sb_lit(&b, "null");
  sb_printf(&b, ",\"decoder_index\":%d,\"policy\":", it->decoder_index);
  sb_str(&b, it->policy);
  sb_lit(&b, ",\"reason\":");
  sb_str(&b, it->reason);
  sb_printf(&b, ",\"centroid\":%d,\"similarity\":", it->centroid);
  if (it->sims) {
    sb_lit(&b, "[");
    for (size_t k = 0; k < it->nsims; k++) {
      if (k) sb_lit(&b, ",");
      sb_num(&b, it->sims[k], "%.9g");
    }
    sb_lit(&b, "]");
  } else {
    sb_lit(&b, "null");
  }
  sb_lit(&b, ",\"ttft_ms\":");
  sb_num(&b, it->ttft_ms, "%.3f");
  sb_lit(&b, ",\"tpot_ms\":");
  sb_num(&b, it->tpot_ms, "%.3f");
  sb_printf(&b, ",\"status\":%d,\"artifact\":", it->status);
  if (it->artifact[0]) sb_str(&b, it->artifact);
  else sb_lit(&b, "null");
  sb_lit(&b, ",\"time\":");
  sb_num(&b, it->time, "%.6f");
  sb_lit(&b, ",\"prompt_tokens\":");
  if (it->prompt_tokens >= 0) sb_printf(&b, "%lld", (long long)it->prompt_tokens);
  else sb_lit(&b, "null");
  sb_lit(&b, ",\"output_tokens\":");
  if (out_tokens >= 0) sb_printf(&b, "%lld", (long long)out_tokens);
  else sb_lit(&b, "null");
  sb_lit(&b, ",\"client_request_id\":");
  if (it->client_id[0]) sb_str(&b, it->client_id);
  else sb_lit(&b, "null");
  sb_lit(&b, "}");
  sb_put(&b, "", 1); /* NUL */
  int rc = b.bad ? ELDR_ENOMEM : 0;
  if (!rc) {
    /* with counts, decode_tokens are the tokens they cover; else the output's */
    int64_t dtok = drows >= 0 ? drows : out_tokens > 0 ? out_tokens : 0;
    eldr_counts_line ln = {.id = it->id,
                           .model = it->model[0] ? it->model : "unknown",
                           .shape = s,
                           .layer_ids = it->layer_ids,
                           .arrival = it->arrival >= 0 ? it->arrival : 0,
                           .prefill_tokens = ptok,
                           .decode_tokens = (uint32_t)(dtok > UINT32_MAX ? UINT32_MAX : dtok),
                           .prefill_counts = pc,
                           .decode_counts = drows >= 0 ? dc : NULL,
                           .serve = b.p};
    size_t cap = 0;
    rc = eldr_trace_format_counts(&ln, line, len, &cap, NULL);
    if (rc) {
      free(*line);
      *line = NULL;
      *len = 0;
      if (rc != ELDR_ENOMEM) rc = ELDR_EEMPTY; /* counts that are no trace's: nothing to refit on */
    }
  }
  free(b.p);
  free(own);
  free(dc);
  return rc;
}

int64_t eldr__rec_scan_usage(const char *p, size_t n, int64_t prev) {
  static const char key[] = "\"completion_tokens\":";
  const size_t kn = sizeof key - 1;
  const char *e = p + n;
  for (const char *q = p; q + kn <= e; q++) {
    q = memmem(q, (size_t)(e - q), key, kn);
    if (!q) break;
    const char *v = q + kn;
    while (v < e && *v == ' ') v++;
    int64_t x = 0;
    int digits = 0;
    while (v < e && *v >= '0' && *v <= '9' && digits < 12) x = x * 10 + (*v++ - '0'), digits++;
    if (digits) prev = x;
  }
  return prev;
}

