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

static int wb_sel(wbuf *b, const eldr_shape *sh, const uint16_t *ids, const float *gates,
                  uint32_t ntok) {
  const uint32_t L = sh->num_layers, K = sh->top_k;
  /* per token: "[" + L * ("[" + K * (max 16 chars + ",") + "],") + "],"  */
  const size_t per_tok = 2 + (size_t)L * (3 + (size_t)K * (gates ? 17 : 6));
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
        if (gates) {
          float g = gates[base + k];
          if (!isfinite(g)) return ELDR_ERANGE;
          int m = snprintf(o, 17, "%.9g", (double)g);
          if (m < 0 || m >= 17) return ELDR_ERANGE;
          o += m;
        } else {
          o += put_u32(o, ids[base + k]);
        }
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

static int format_request(wbuf *b, const eldr_trace *t, const eldr_request *r) {
  int rc = ELDR_OK;
  char num[40];
#define W(x)                                                                                       \
  do {                                                                                             \
    if ((rc = (x))) return rc;                                                                     \
  } while (0)
  W(wb_lit(b, "{\"id\":"));
  W(wb_str(b, r->id ? r->id : ""));
  if (r->domain >= 0 && (size_t)r->domain < t->n_domains) {
    W(wb_lit(b, ",\"domain\":"));
    W(wb_str(b, t->domains[r->domain]));
  }
  W(wb_lit(b, ",\"model\":"));
  W(wb_str(b, t->model ? t->model : ""));
  W(wb_lit(b, ",\"num_experts\":"));
  W(wb_u32(b, t->shape.num_experts));
  W(wb_lit(b, ",\"top_k\":"));
  W(wb_u32(b, t->shape.top_k));
  W(wb_lit(b, ",\"layers\":["));
  for (uint32_t l = 0; l < t->shape.num_layers; l++) {
    if (l) W(wb_lit(b, ","));
    W(wb_u32(b, t->layer_ids ? t->layer_ids[l] : l));
  }
  W(wb_lit(b, "]"));
  if (t->generator) {
    W(wb_lit(b, ",\"generator\":"));
    W(wb_str(b, t->generator));
  }
  if (r->arrival >= 0 && isfinite(r->arrival)) {
    snprintf(num, sizeof num, "%.17g", r->arrival);
    W(wb_lit(b, ",\"arrival\":"));
    W(wb_lit(b, num));
  }
  if (r->prompt) {
    W(wb_lit(b, ",\"prompt\":"));
    W(wb_str(b, r->prompt));
  }
  W(wb_lit(b, ",\"prefill\":"));
  W(wb_sel(b, &t->shape, r->prefill, NULL, r->n_prefill));
  W(wb_lit(b, ",\"decode\":"));
  W(wb_sel(b, &t->shape, r->decode, NULL, r->n_decode));
  if (r->prefill_gates) {
    W(wb_lit(b, ",\"prefill_gates\":"));
    W(wb_sel(b, &t->shape, NULL, r->prefill_gates, r->n_prefill));
  }
  W(wb_lit(b, "}\n"));
#undef W
  return ELDR_OK;
}

int eldr_trace_write_request(FILE *f, const eldr_trace *t, const eldr_request *r) {
  if (!f || !t || !r || t->shape.num_layers == 0) return ELDR_EINVAL;
  wbuf b = {0};
  int rc = format_request(&b, t, r);
  if (rc == ELDR_OK && fwrite(b.p, 1, b.n, f) != b.n) rc = ELDR_EIO;
  free(b.p);
  return rc;
}

int eldr_trace_save(const char *path, const eldr_trace *t, eldr_diag *d) {
  if (!path || !t || t->shape.num_layers == 0)
    return eldr_diag_fail(d, ELDR_EINVAL, "trace or path missing");
  size_t pl = strlen(path);
  char *tmp = malloc(pl + 16);
  if (!tmp) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  memcpy(tmp, path, pl);
  memcpy(tmp + pl, ".tmp.XXXXXX", 12);
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int err = errno;
    free(tmp);
    return eldr_diag_fail(d, ELDR_EIO, "%s: cannot create temporary file: %s", path, strerror(err));
  }
  (void)fchmod(fd, 0644);
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    int err = errno;
    close(fd);
    unlink(tmp);
    free(tmp);
    return eldr_diag_fail(d, ELDR_EIO, "%s: %s", path, strerror(err));
  }
  wbuf b = {0};
  int rc = ELDR_OK;
  for (size_t i = 0; i < t->n && rc == ELDR_OK; i++) {
    b.n = 0;
    rc = format_request(&b, t, &t->req[i]);
    if (rc) {
      eldr_diag_fail(d, rc, "%s: request %zu ('%.60s'): %s", path, i, t->req[i].id,
                     rc == ELDR_ERANGE ? "non-finite gate value" : eldr_strerror(rc));
      break;
    }
    if (fwrite(b.p, 1, b.n, f) != b.n) {
      rc = eldr_diag_fail(d, ELDR_EIO, "%s: write failed: %s", path, strerror(errno));
    }
  }
  free(b.p);
  if (fclose(f) != 0 && rc == ELDR_OK)
    rc = eldr_diag_fail(d, ELDR_EIO, "%s: write failed: %s", path, strerror(errno));
  if (rc == ELDR_OK && rename(tmp, path) != 0)
    rc = eldr_diag_fail(d, ELDR_EIO, "%s: rename failed: %s", path, strerror(errno));
  if (rc) unlink(tmp);
  free(tmp);
  return rc;
}
