/* trace_write.c — writing traces (see eldr/trace.h): one line at a time
 * into a growable buffer with hand-written integer formatting; floats via
 * "%.17g" (arrival) and "%.9g" (gates), which read back to the identical
 * double / float. eldr_trace_save writes a temporary file and renames it
 * over the path, so a failed write never leaves a half file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eldr/grow.h"
#include "eldr/trace.h"
#include "eldr/writefile.h"
#include "format/trace_internal.h"

/* ------------------------------------------------------------------------ */
/* writer                                                                    */

typedef struct wbuf {
  char *p;
  size_t n, cap;
} wbuf;

static int wb_reserve(wbuf *b, size_t more) {
  if (more > SIZE_MAX - b->n) return ELDR_ENOMEM;
  return eldr_grow(&b->p, &b->cap, b->n + more, 1, 4096);
}

static int wb_lit(wbuf *b, const char *s) {
  size_t n = strlen(s);
  if (wb_reserve(b, n)) return ELDR_ENOMEM;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  return ELDR_OK;
}

/* Unsigned decimal into p (no reserve); returns chars written. */
static inline size_t put_u32(char *p, uint32_t v) {
  if (v < 10) {
    p[0] = (char)('0' + v);
    return 1;
  }
  if (v < 100) {
    p[0] = (char)('0' + v / 10);
    p[1] = (char)('0' + v % 10);
    return 2;
  }
  if (v < 1000) {
    p[0] = (char)('0' + v / 100);
    p[1] = (char)('0' + v / 10 % 10);
    p[2] = (char)('0' + v % 10);
    return 3;
  }
  char tmp[10];
  size_t n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  for (size_t i = 0; i < n; i++) p[i] = tmp[n - 1 - i];
  return n;
}

static int wb_u32(wbuf *b, uint32_t v) {
  if (wb_reserve(b, 10)) return ELDR_ENOMEM;
  b->n += put_u32(b->p + b->n, v);
  return ELDR_OK;
}

static int wb_str(wbuf *b, const char *s) {
  size_t n = strlen(s);
  if (n > SIZE_MAX / 8 || wb_reserve(b, n * 6 + 2)) return ELDR_ENOMEM;
  char *o = b->p + b->n;
  *o++ = '"';
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    switch (ch) {
    case '"': *o++ = '\\'; *o++ = '"'; break;
    case '\\': *o++ = '\\'; *o++ = '\\'; break;
    case '\n': *o++ = '\\'; *o++ = 'n'; break;
    case '\r': *o++ = '\\'; *o++ = 'r'; break;
    case '\t': *o++ = '\\'; *o++ = 't'; break;
    case '\b': *o++ = '\\'; *o++ = 'b'; break;
    case '\f': *o++ = '\\'; *o++ = 'f'; break;
    default:
      if (ch < 0x20) {
        static const char hex[] = "0123456789abcdef";
        *o++ = '\\'; *o++ = 'u'; *o++ = '0'; *o++ = '0';
        *o++ = hex[ch >> 4]; *o++ = hex[ch & 15];
      } else {
        *o++ = (char)ch;
      }
    }
  }
  *o++ = '"';
  b->n = (size_t)(o - b->p);
  return ELDR_OK;
}

/* Decimal "id," of every expert id below ID_TAB, 8 bytes each (copied whole,
 * the write pointer advancing by the length): branch-free selection lists. */
#define ID_TAB 1024
typedef struct id_tab {
  char txt[ID_TAB][8];
  uint8_t len[ID_TAB];
} id_tab;

static void id_tab_fill(id_tab *tb, uint32_t n) {
  for (uint32_t v = 0; v < n; v++) {
    size_t m = put_u32(tb->txt[v], v);
    tb->txt[v][m] = ',';
    tb->len[v] = (uint8_t)(m + 1);
  }
}

static int wb_gates(wbuf *b, const eldr_shape *sh, const float *gates, uint32_t ntok) {
  const uint32_t L = sh->num_layers, K = sh->top_k;
  /* per token: "[" + L * ("[" + K * (max 16 chars + ",") + "],") + "],"  */
  const size_t per_tok = 2 + (size_t)L * (3 + (size_t)K * 17);
  if (wb_reserve(b, 2)) return ELDR_ENOMEM;
  b->p[b->n++] = '[';
  for (uint32_t t = 0; t < ntok; t++) {
    if (wb_reserve(b, per_tok)) return ELDR_ENOMEM;
    char *o = b->p + b->n;
    if (t) *o++ = ',';
    *o++ = '[';
    for (uint32_t l = 0; l < L; l++) {
      if (l) *o++ = ',';
      *o++ = '[';
      size_t base = ((size_t)t * L + l) * K;
      for (uint32_t k = 0; k < K; k++) {
        if (k) *o++ = ',';
        float g = gates[base + k];
        if (!isfinite(g)) return ELDR_ERANGE;
        int m = snprintf(o, 17, "%.9g", (double)g);
        if (m < 0 || m >= 17) return ELDR_ERANGE;
        o += m;
      }
      *o++ = ']';
    }
    *o++ = ']';
    b->n = (size_t)(o - b->p);
  }
  if (wb_reserve(b, 1)) return ELDR_ENOMEM;
  b->p[b->n++] = ']';
  return ELDR_OK;
}

/* "v," for an id past the table. */
static __attribute__((noinline)) char *put_id_slow(char *o, uint32_t v) {
  o += put_u32(o, v);
  *o++ = ',';
  return o;
}

/* One token's selections, "[[a,b],[c,d]]," (L rows of K ids) at o; returns
 * the end. Inlined with K a constant for the common top-k values, so the
 * row loop unrolls. */
static inline __attribute__((always_inline)) char *sel_token(char *o, const uint16_t *row,
                                                             uint32_t L, uint32_t K,
                                                             const id_tab *tb, uint32_t ntab) {
  *o++ = '[';
  for (uint32_t l = 0; l < L; l++) {
    *o++ = '[';
    _Pragma("GCC unroll 8") for (uint32_t k = 0; k < K; k++) {
      const uint32_t v = row[k];
      if (__builtin_expect(v < ntab, 1)) {
        memcpy(o, tb->txt[v], 8);
        o += tb->len[v];
      } else {
        o = put_id_slow(o, v);
      }
    }
    row += K;
    o[-1] = ']'; /* the last "," (K >= 1) */
    *o++ = ',';
  }
  o[-1] = ']';
  *o++ = ',';
  return o;
}

static int wb_sel(wbuf *b, const eldr_shape *sh, const uint16_t *ids, uint32_t ntok) {
  const uint32_t L = sh->num_layers, K = sh->top_k;
  /* per token: "[" + L * ("[" + K * (5 digits + "," + 2 spare for the
   * 8-byte copy) + "],") + "],"  */
  const size_t per_tok = 4 + (size_t)L * (3 + (size_t)K * 8);
  id_tab tb;
  const uint32_t ntab = sh->num_experts < ID_TAB ? sh->num_experts : ID_TAB;
  id_tab_fill(&tb, ntab);
  if (wb_reserve(b, 2)) return ELDR_ENOMEM;
  b->p[b->n++] = '[';
  for (uint32_t t = 0; t < ntok; t++) {
    if (wb_reserve(b, per_tok)) return ELDR_ENOMEM;
    char *o = b->p + b->n;
    const uint16_t *row = ids + (size_t)t * L * K;
    switch (K) {
    case 8: o = sel_token(o, row, L, 8, &tb, ntab); break;
    case 4: o = sel_token(o, row, L, 4, &tb, ntab); break;
    case 2: o = sel_token(o, row, L, 2, &tb, ntab); break;
    case 1: o = sel_token(o, row, L, 1, &tb, ntab); break;
    default: o = sel_token(o, row, L, K, &tb, ntab); break;
    }
    b->n = (size_t)(o - b->p);
  }
  if (ntok) b->n--; /* the last token's "," */
  if (wb_reserve(b, 1)) return ELDR_ENOMEM;
  b->p[b->n++] = ']';
  return ELDR_OK;
}

#define W(x)                                                                                       \
  do {                                                                                             \
    int rc_ = (x);                                                                                 \
    if (rc_) return rc_;                                                                           \
  } while (0)

/* The header fields every line starts with (id .. prompt). */
static int format_header(wbuf *b, const eldr_counts_line *h) {
  char num[40];
  W(wb_lit(b, "{\"id\":"));
  W(wb_str(b, h->id ? h->id : ""));
  if (h->domain) {
    W(wb_lit(b, ",\"domain\":"));
    W(wb_str(b, h->domain));
  }
  W(wb_lit(b, ",\"model\":"));
  W(wb_str(b, h->model ? h->model : ""));
  W(wb_lit(b, ",\"num_experts\":"));
  W(wb_u32(b, h->shape->num_experts));
  W(wb_lit(b, ",\"top_k\":"));
  W(wb_u32(b, h->shape->top_k));
  W(wb_lit(b, ",\"layers\":["));
  for (uint32_t l = 0; l < h->shape->num_layers; l++) {
    if (l) W(wb_lit(b, ","));
    W(wb_u32(b, h->layer_ids ? h->layer_ids[l] : l));
  }
  W(wb_lit(b, "]"));
  if (h->generator) {
    W(wb_lit(b, ",\"generator\":"));
    W(wb_str(b, h->generator));
  }
  if (h->arrival >= 0 && isfinite(h->arrival)) {
    snprintf(num, sizeof num, "%.17g", h->arrival);
    W(wb_lit(b, ",\"arrival\":"));
    W(wb_lit(b, num));
  }
  if (h->prompt) {
    W(wb_lit(b, ",\"prompt\":"));
    W(wb_str(b, h->prompt));
  }
  return ELDR_OK;
}

/* A dense counts matrix as L rows of E integers. */
static int wb_counts(wbuf *b, const eldr_shape *sh, const uint32_t *c) {
  const uint32_t L = sh->num_layers, E = sh->num_experts;
  if (wb_reserve(b, 2 + (size_t)L * (3 + (size_t)E * 11))) return ELDR_ENOMEM;
  char *o = b->p + b->n;
  *o++ = '[';
  for (uint32_t l = 0; l < L; l++) {
    if (l) *o++ = ',';
    *o++ = '[';
    const uint32_t *row = c + (size_t)l * E;
    for (uint32_t e = 0; e < E; e++) {
      if (e) *o++ = ',';
      o += put_u32(o, row[e]);
    }
    *o++ = ']';
  }
  *o++ = ']';
  b->n = (size_t)(o - b->p);
  return ELDR_OK;
}

static int format_counts(wbuf *b, const eldr_counts_line *ln) {
  W(format_header(b, ln));
  W(wb_lit(b, ",\"form\":\"counts\",\"prefill_tokens\":"));
  W(wb_u32(b, ln->prefill_tokens));
  W(wb_lit(b, ",\"decode_tokens\":"));
  W(wb_u32(b, ln->decode_tokens));
  W(wb_lit(b, ",\"prefill_counts\":"));
  W(wb_counts(b, ln->shape, ln->prefill_counts));
  if (ln->decode_counts) {
    W(wb_lit(b, ",\"decode_counts\":"));
    W(wb_counts(b, ln->shape, ln->decode_counts));
  }
  if (ln->serve) {
    W(wb_lit(b, ",\"serve\":"));
    W(wb_lit(b, ln->serve));
  }
  W(wb_lit(b, "}\n"));
  return ELDR_OK;
}

/* The header of request r of trace t as a line description. */
static eldr_counts_line line_of(const eldr_trace *t, const eldr_request *r) {
  return (eldr_counts_line){
      .id = r->id,
      .domain = r->domain >= 0 && (size_t)r->domain < t->n_domains ? t->domains[r->domain] : NULL,
      .model = t->model,
      .shape = &t->shape,
      .layer_ids = t->layer_ids,
      .generator = t->generator,
      .arrival = r->arrival,
      .prompt = r->prompt,
      .prefill_tokens = r->n_prefill,
      .decode_tokens = r->n_decode,
      .prefill_counts = r->prefill_counts,
      .decode_counts = r->decode_counts,
      .serve = r->serve};
}

static int format_request(wbuf *b, const eldr_trace *t, const eldr_request *r) {
  const eldr_counts_line h = line_of(t, r);
  if (r->prefill_counts) return format_counts(b, &h);
  W(format_header(b, &h));
  W(wb_lit(b, ",\"prefill\":"));
  W(wb_sel(b, &t->shape, r->prefill, r->n_prefill));
  W(wb_lit(b, ",\"decode\":"));
  W(wb_sel(b, &t->shape, r->decode, r->n_decode));
  if (r->prefill_gates) {
    W(wb_lit(b, ",\"prefill_gates\":"));
    W(wb_gates(b, &t->shape, r->prefill_gates, r->n_prefill));
  }
  if (r->serve) {
    W(wb_lit(b, ",\"serve\":"));
    W(wb_lit(b, r->serve));
  }
  W(wb_lit(b, "}\n"));
  return ELDR_OK;
}
#undef W

int eldr_trace_format_counts(const eldr_counts_line *ln, char **buf, size_t *len, size_t *cap,
                             eldr_diag *d) {
  if (!ln || !buf || !len || !cap || !ln->id || !ln->shape || !ln->prefill_counts)
    return eldr_diag_fail(d, ELDR_EINVAL, "counts line: id, shape or prefill_counts missing");
  int rc = eldr_shape_validate(ln->shape, d);
  if (rc) return rc;
  if ((rc = eldr_counts_rows_check(ln->shape, ln->prefill_counts, ln->prefill_tokens, d))) {
    eldr_diag_prefix(d, "request '%.60s': prefill_counts", ln->id);
    return rc;
  }
  if (ln->decode_counts &&
      (rc = eldr_counts_rows_check(ln->shape, ln->decode_counts, ln->decode_tokens, d))) {
    eldr_diag_prefix(d, "request '%.60s': decode_counts", ln->id);
    return rc;
  }
  if (ln->serve && !text_is_json_object(ln->serve, strlen(ln->serve)))
    return eldr_diag_fail(d, ELDR_EPARSE, "request '%.60s': serve is not one JSON object",
                          ln->id);
  wbuf b = {*buf, *len, *cap};
  rc = format_counts(&b, ln);
  *buf = b.p;
  *cap = b.cap;
  if (rc) return eldr_diag_fail(d, rc, "request '%.60s': %s", ln->id, eldr_strerror(rc));
  *len = b.n;
  return ELDR_OK;
}

int eldr_trace_format_request(const eldr_trace *t, const eldr_request *r, char **buf,
                              size_t *len, size_t *cap) {
  if (!t || !r || !buf || !len || !cap || t->shape.num_layers == 0) return ELDR_EINVAL;
  wbuf b = {*buf, *len, *cap};
  int rc = format_request(&b, t, r);
  *buf = b.p;
  *cap = b.cap;
  if (rc == ELDR_OK) *len = b.n;
  return rc;
}

int eldr_trace_write_request(FILE *f, const eldr_trace *t, const eldr_request *r) {
  if (!f || !t || !r || t->shape.num_layers == 0) return ELDR_EINVAL;
  wbuf b = {0};
  int rc = format_request(&b, t, r);
  if (rc == ELDR_OK && fwrite(b.p, 1, b.n, f) != b.n) rc = ELDR_EIO;
  free(b.p);
  return rc;
}

/* Lines are batched into chunks of about this size, one write each. */
#define SAVE_CHUNK ((size_t)4 << 20)

int eldr_trace_save(const char *path, const eldr_trace *t, eldr_diag *d) {
  if (!path || !t || t->shape.num_layers == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "trace or path missing");
  eldr_outfile o;
  int rc = eldr_outfile_open(&o, path, d);
  if (rc) return rc;
  wbuf b = {0};
  for (size_t i = 0; i < t->n && rc == ELDR_OK; i++) {
    rc = format_request(&b, t, &t->req[i]);
    if (rc) {
      eldr_diag_fail(d, rc, "%s: request %zu ('%.60s'): %s", path, i, t->req[i].id,
                     rc == ELDR_ERANGE ? "non-finite gate value" : eldr_strerror(rc));
      break;
    }
    if (b.n >= SAVE_CHUNK || i + 1 == t->n) {
      rc = eldr_outfile_write(&o, b.p, b.n, d);
      b.n = 0;
    }
  }
  free(b.p);
  int crc = eldr_outfile_close(&o, rc == ELDR_OK, d);
  return rc ? rc : crc;
}
