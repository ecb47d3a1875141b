/* reply_check.c — the steps every reader of a routed_experts value shares
 * (reply_experts_int.h): buffers from the caller's scratch or owned by the
 * result, an array's shape against the bounds and the artifact (which
 * fixes the layer plan), the dense layers' detection, the plan applied,
 * the ids checked (and counted) a vector at a time. Called by
 * reply_experts.c (the reply) and reply_values.c (one value); calls only
 * reply_layers.c and core's counting. */
#include <stdlib.h>
#include <string.h>

#include "eldr/counts.h"
#include "reply_experts_int.h"
#include "reply_layers_int.h"

void *eldr__re_own(rctx *c, size_t n) {
  eldr_re_scratch *sc = c->o.scratch;
  if (sc && sc->used < ELDR_RE_SCRATCH_SLOTS) { /* reused: nothing allocated once grown */
    if (!n) n = 1;
    if (sc->slot[sc->used].cap < n) { /* the old contents are not needed: no realloc copy */
      free(sc->slot[sc->used].p);
      sc->slot[sc->used].p = malloc(n);
      sc->slot[sc->used].cap = sc->slot[sc->used].p ? n : 0;
      if (!sc->slot[sc->used].p) return NULL;
    }
    return sc->slot[sc->used++].p;
  }
  void **nb = realloc(c->out->bufs, (c->out->nbufs + 1) * sizeof *nb);
  if (!nb) return NULL;
  c->out->bufs = nb;
  void *p = malloc(n ? n : 1);
  if (p) c->out->bufs[c->out->nbufs++] = p;
  return p;
}

/* layers / top_k against the bounds and the expectation; rows * L * K *
 * itemsize without overflow into *bytes. */
int eldr__re_check_dims(rctx *c, const char *what, size_t rows, size_t L, size_t K, size_t isz,
                      size_t *bytes) {
  if (rows == 0 && L == 0 && K == 0) { /* an empty list: nothing to check */
    *bytes = 0;
    return 0;
  }
  if (L < 1 || L > ELDR_MAX_LAYERS || K < 1 || K > ELDR_MAX_TOPK)
    return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu): layers must be in [1, %d] and top_k in [1, %d]", what,
                 rows, L, K, ELDR_MAX_LAYERS, ELDR_MAX_TOPK);
  if (c->plan != PLAN_NONE && L != c->La)
    return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu): %zu layers, but the reply's other routed_experts have %zu", what,
                 rows, L, K, L, c->La);
  if ((c->o.num_layers && !eldr__re_layers_mappable(L, c->o.num_layers, c->o.layer_ids)) ||
      (c->o.top_k && K != c->o.top_k)) {
    if (c->o.num_layers && c->o.layer_ids && L > c->o.num_layers)
      return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                   "%s: shape (%zu, %zu, %zu) disagrees with the artifact (%u MoE layers at model layers "
                   "%u..%u, top-%u)", what, rows, L, K, c->o.num_layers, c->o.layer_ids[0],
                   c->o.layer_ids[c->o.num_layers - 1], c->o.top_k);
    return FAILF(c, ELDR_RE_SHAPE_MISMATCH, ELDR_ESHAPE,
                 "%s: shape (%zu, %zu, %zu) disagrees with the artifact (%u layers, top-%u)", what,
                 rows, L, K, c->o.num_layers, c->o.top_k);
  }
  if (c->plan == PLAN_NONE) {
    c->La = L;
    c->out->array_layers = L;
    c->plan = PLAN_FIXED;
    c->nkeep = 0;
    if (c->o.num_layers && L != c->o.num_layers) { /* the all-layers form: the MoE layers' rows */
      c->nkeep = c->o.num_layers;
      memcpy(c->keep, c->o.layer_ids, c->nkeep * sizeof *c->keep);
    } else if (!c->o.num_layers && c->o.drop_dense) {
      c->plan = PLAN_DETECT; /* on the first array with rows */
    }
  }
  size_t n;
  if (__builtin_mul_overflow(rows, L * K, &n) || __builtin_mul_overflow(n, isz, &n))
    return FAILF(c, ELDR_RE_TOO_LARGE, ELDR_ERANGE, "%s: shape (%zu, %zu, %zu) too large", what,
                 rows, L, K);
  *bytes = n;
  return 0;
}

/* The reason and message for the bad id at flat index bad of rows
 * [row0, row0 + ...) of v. */
static int bad_id(rctx *c, const char *what, const eldr_re_view *v, size_t row0, size_t bad) {
  const size_t L = v->layers, K = v->top_k;
  const uint64_t lim = c->o.num_experts ? c->o.num_experts : ELDR_MAX_EXPERTS;
  const uint8_t *p = (const uint8_t *)v->data + row0 * L * K * eldr_sel_dtype_size(v->dtype);
  return id_ok(c, what, row0 + bad / K / L, bad / K % L, bad % K, eldr_sel_load(p, v->dtype, bad), lim);
}

/* Rows [row0, row0 + n) of v, the mask's layers: every id in [0, lim)
 * (checked a vector at a time, eldr_counts_check_masked); with counts, also
 * counted in the same pass (eldr_counts_accumulate_masked). */
int eldr__re_check_rows(rctx *c, const char *what, const eldr_re_view *v, size_t row0, size_t n,
                      uint32_t *counts) {
  const size_t L = v->layers, K = v->top_k;
  const uint32_t lim = c->o.num_experts ? c->o.num_experts : ELDR_MAX_EXPERTS;
  const uint8_t *mask = c->o.layer_mask && c->o.num_layers == L ? c->o.layer_mask : NULL;
  const eldr_shape s = {(uint32_t)L, lim, (uint32_t)K};
  const uint8_t *p = (const uint8_t *)v->data + row0 * L * K * eldr_sel_dtype_size(v->dtype);
  size_t bad = 0;
  if (!n || !v->data) return 0;
  int rc = counts ? eldr_counts_accumulate_planes(&s, p, v->dtype, n, mask, counts, &bad, c->o.planes)
                  : eldr_counts_check_masked(&s, p, v->dtype, n, mask, &bad);
  return rc ? bad_id(c, what, v, row0, bad) : 0;
}

/* Every id of the view in the mask's layers must be in [0, lim). */
int eldr__re_check_ids(rctx *c, const char *what, const eldr_re_view *v) {
  return eldr__re_check_rows(c, what, v, 0, v->rows, NULL);
}

/* The dense layers of the first array with rows, when asked to drop them:
 * the plan keeps the others. */
int eldr__re_plan_from_dense(rctx *c, const char *what, const uint8_t *dense, size_t nd) {
  if (nd == c->La)
    return FAILF(c, ELDR_RE_BAD_SHAPE, ELDR_ESHAPE,
                 "%s: every one of the %zu layers holds only a dense layer's fill (ids <= 0)", what, c->La);
  c->plan = PLAN_FIXED;
  c->nkeep = 0;
  if (nd)
    for (size_t l = 0; l < c->La; l++)
      if (!dense[l]) c->keep[c->nkeep++] = (uint32_t)l;
  return 0;
}

static int detect_plan(rctx *c, const char *what, const void *data, eldr_sel_dtype t, size_t rows, size_t K) {
  if (c->plan != PLAN_DETECT || !rows) return 0;
  uint8_t dense[ELDR_MAX_LAYERS];
  return eldr__re_plan_from_dense(c, what, dense, eldr__re_dense_layers(data, t, rows, c->La, K, dense));
}

/* A view of the arrays' La layers cut, in place, to the plan's layers. */
int eldr__re_apply_plan(rctx *c, const char *what, eldr_re_view *v) {
  int rc = detect_plan(c, what, v->data, v->dtype, v->rows, v->top_k);
  if (rc || !c->nkeep || !v->layers) return rc;
  eldr__re_keep_layers((void *)v->data, eldr_sel_dtype_size(v->dtype), v->rows, v->layers, v->top_k, c->keep,
                       c->nkeep);
  v->layers = c->nkeep;
  return 0;
}
