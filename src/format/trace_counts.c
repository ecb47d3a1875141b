/* trace_counts.c — the counts form of a trace line (see eldr/trace.h and
 * docs/trace.md): prefill_tokens, decode_tokens and the dense per-layer
 * per-expert count matrices prefill_counts / decode_counts, read straight
 * into uint32_t L*E buffers and checked with eldr_counts_rows_check. The
 * rest of the line (header fields, serve) is trace.c's. */
#include "format/trace_internal.h"

/* The writer's compact spelling of one row after its '[': "3,0,12]" (plain
 * integers of at most 9 digits, no leading zeros, no white space, exactly E
 * of them). Returns the position after ']', or NULL for anything else,
 * which the general loop below then parses (and reports) from the row's
 * start. Every read stops at the row's ']' (found first): a digit run ends
 * at it at the latest. */
static const char *row_compact(const char *p, const char *e, uint32_t E, uint32_t *row) {
  if (p >= e) return NULL;
  const char *end = memchr(p, ']', (size_t)(e - p));
  if (!end) return NULL;
  for (uint32_t k = 0; k < E; k++) {
    uint32_t d = (uint32_t)(unsigned char)*p++ - '0';
    if (d > 9) return NULL;
    uint32_t v = d;
    if (v) {
      for (int n = 1; (d = (uint32_t)(unsigned char)*p - '0') <= 9; p++) {
        if (++n > 9) return NULL;
        v = v * 10 + d;
      }
    }
    row[k] = v;
    if (p >= end) return p == end && k + 1 == E ? p + 1 : NULL;
    if (*p++ != ',') return NULL;
  }
  return NULL; /* more than E entries */
}

/* One matrix "[[c_0,...,c_{E-1}], ... L rows]" into out (L*E). White space
 * is allowed anywhere JSON allows it. */
static int parse_matrix(const lctx *c, const char *field, span s, const eldr_shape *sh,
                        uint32_t *out) {
  const char *p = s.p, *e = s.e;
  const uint32_t L = sh->num_layers, E = sh->num_experts;
  if (p >= e || *p != '[')
    return lfail(c, ELDR_EPARSE, field, "expected an array of %u layer rows", L);
  p = skip_ws(p + 1, e);
  uint32_t l = 0;
  if (p < e && *p == ']') return lfail(c, ELDR_ESHAPE, field, "0 layer rows, expected %u", L);
  for (;;) {
    if (l >= L) return lfail(c, ELDR_ESHAPE, field, "more than %u layer rows (one per layer)", L);
    if (p >= e || *p != '[')
      return lfail(c, ELDR_EPARSE, field, "layer %u: expected an array of %u counts", l, E);
    p = skip_ws(p + 1, e);
    uint32_t *row = out + (size_t)l * E;
    uint32_t k = 0;
    const char *fast = row_compact(p, e, E, row);
    if (fast) {
      p = fast - 1; /* at the row's ']', as the general loop leaves it */
      k = E;
      goto row_done;
    }
    if (p < e && *p == ']')
      return lfail(c, ELDR_ESHAPE, field, "layer %u: 0 counts, expected num_experts %u", l, E);
    for (;;) {
      if (k >= E)
        return lfail(c, ELDR_ESHAPE, field, "layer %u: more than num_experts %u counts", l, E);
      const char *q = p;
      uint64_t v = 0;
      if (q < e && *q == '0') {
        q++;
      } else {
        while (q < e && *q >= '0' && *q <= '9' && v <= UINT32_MAX) v = v * 10 + (uint64_t)(*q++ - '0');
      }
      if (q == p || v > UINT32_MAX ||
          (q < e && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E')))
        return lfail(c, ELDR_EPARSE, field,
                     "layer %u expert %u: expected a non-negative integer count below 2^32", l, k);
      row[k++] = (uint32_t)v;
      p = skip_ws(q, e);
      if (p < e && *p == ',') {
        p = skip_ws(p + 1, e);
        continue;
      }
      if (p < e && *p == ']') break;
      return lfail(c, ELDR_EPARSE, field, "layer %u: expected ',' or ']'", l);
    }
    if (k != E)
      return lfail(c, ELDR_ESHAPE, field, "layer %u: %u counts, expected num_experts %u", l, k, E);
  row_done:
    l++;
    p = skip_ws(p + 1, e);
    if (p < e && *p == ',') {
      p = skip_ws(p + 1, e);
      continue;
    }
    if (p < e && *p == ']') break;
    return lfail(c, ELDR_EPARSE, field, "expected ',' or ']' after layer %u", l - 1);
  }
  if (l != L) return lfail(c, ELDR_ESHAPE, field, "%u layer rows, expected %u (one per layer)", l, L);
  if (skip_ws(p + 1, e) != e) return lfail(c, ELDR_EPARSE, field, "trailing characters");
  return ELDR_OK;
}

/* Parse and check one side's matrix into a new buffer. */
static int parse_side(const lctx *c, const char *field, span s, const eldr_shape *sh,
                      uint32_t ntok, uint32_t **out) {
  uint32_t *m = malloc(eldr_shape_cells(sh) * sizeof *m);
  if (!m) return ELDR_ENOMEM;
  int rc = parse_matrix(c, field, s, sh, m);
  if (rc == ELDR_OK) {
    eldr_diag why = {{0}};
    rc = eldr_counts_rows_check(sh, m, ntok, &why);
    if (rc) rc = lfail(c, rc, field, "%s", why.msg);
  }
  if (rc) {
    free(m);
    return rc;
  }
  *out = m;
  return ELDR_OK;
}

int eldr__trace_parse_counts_fields(const lctx *c, const span f[4], const eldr_shape *sh,
                                    uint32_t *n_pre, uint32_t *n_dec, uint32_t **pc,
                                    uint32_t **dc) {
  uint64_t np, nd;
  int rc;
  *pc = *dc = NULL;
  if ((rc = parse_uint(c, "prefill_tokens", f[0], UINT32_MAX, &np))) return rc;
  if ((rc = parse_uint(c, "decode_tokens", f[1], UINT32_MAX, &nd))) return rc;
  if (is_null(f[2])) return lfail(c, ELDR_EPARSE, "prefill_counts", "missing (null)");
  if ((rc = parse_side(c, "prefill_counts", f[2], sh, (uint32_t)np, pc))) return rc;
  if (f[3].p && !is_null(f[3]) &&
      (rc = parse_side(c, "decode_counts", f[3], sh, (uint32_t)nd, dc))) {
    free(*pc);
    *pc = NULL;
    return rc;
  }
  *n_pre = (uint32_t)np;
  *n_dec = (uint32_t)nd;
  return ELDR_OK;
}
