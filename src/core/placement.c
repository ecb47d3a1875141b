/* placement.c — expert-parallel placements (linear, greedy per-cluster),
 * activation estimates from a calibration trace, and the per-step EP tally
 * (see include/eldr/placement.h). */
#include "eldr/placement.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/fit.h"

int eldr_placement_alloc(uint32_t layers, uint32_t experts, uint32_t ep_size, uint32_t redundant,
                         eldr_placement **out, eldr_diag *d) {
  *out = NULL;
  if (layers == 0 || layers > ELDR_MAX_LAYERS || experts == 0 || experts > ELDR_MAX_EXPERTS) {
    return eldr_diag_fail(d, ELDR_ERANGE, "placement: %u layers x %u experts out of range", layers,
                          experts);
  }
  if (ep_size == 0 || ep_size > ELDR_PLACEMENT_MAX_RANKS) {
    return eldr_diag_fail(d, ELDR_ERANGE, "placement: EP size %u must be in [1, %d]", ep_size,
                          ELDR_PLACEMENT_MAX_RANKS);
  }
  if (redundant > ELDR_MAX_EXPERTS) {
    return eldr_diag_fail(d, ELDR_ERANGE, "placement: %u redundant experts is more than %d",
                          redundant, ELDR_MAX_EXPERTS);
  }
  uint32_t P = experts + redundant;
  if (P % ep_size) {
    return eldr_diag_fail(d, ELDR_ERANGE,
                          "placement: %u experts + %u redundant = %u physical experts is not a "
                          "multiple of the EP size %u",
                          experts, redundant, P, ep_size);
  }
  eldr_placement *p = calloc(1, sizeof *p);
  if (p) p->phys = calloc((size_t)layers * P, sizeof *p->phys);
  if (!p || !p->phys) {
    eldr_placement_free(p);
    return eldr_diag_fail(d, ELDR_ENOMEM, "placement: out of memory");
  }
  p->num_layers = layers;
  p->num_experts = experts;
  p->ep_size = ep_size;
  p->num_physical = P;
  *out = p;
  return 0;
}

void eldr_placement_free(eldr_placement *p) {
  if (!p) return;
  free(p->phys);
  free(p->ncopies);
  free(p->copies);
  free(p);
}

int eldr_placement_index(eldr_placement *p, eldr_diag *d) {
  const uint32_t L = p->num_layers, E = p->num_experts, P = p->num_physical;
  uint8_t *nc = calloc((size_t)L * E, 1);
  if (!nc) return eldr_diag_fail(d, ELDR_ENOMEM, "placement: out of memory");
  uint32_t maxc = 0;
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t s = 0; s < P; s++) {
      uint16_t e = p->phys[(size_t)l * P + s];
      if (e >= E) {
        free(nc);
        return eldr_diag_fail(d, ELDR_ERANGE,
                              "placement: layer %u, physical expert %u: logical id %u >= %u experts",
                              l, s, e, E);
      }
      if (nc[(size_t)l * E + e] == 255) {
        free(nc);
        return eldr_diag_fail(d, ELDR_ERANGE, "placement: layer %u: expert %u has over 255 copies", l, e);
      }
      uint32_t c = ++nc[(size_t)l * E + e];
      if (c > maxc) maxc = c;
    }
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t e = 0; e < E; e++)
      if (!nc[(size_t)l * E + e]) {
        free(nc);
        return eldr_diag_fail(d, ELDR_ERANGE, "placement: layer %u: logical expert %u has no physical slot",
                              l, e);
      }
  uint16_t *cp = malloc((size_t)L * E * maxc * sizeof *cp);
  uint8_t *fill = calloc((size_t)L * E, 1);
  if (!cp || !fill) {
    free(nc);
    free(cp);
    free(fill);
    return eldr_diag_fail(d, ELDR_ENOMEM, "placement: out of memory");
  }
  for (uint32_t l = 0; l < L; l++)
    for (uint32_t s = 0; s < P; s++) {
      size_t cell = (size_t)l * E + p->phys[(size_t)l * P + s];
      cp[cell * maxc + fill[cell]++] = (uint16_t)s;
    }
  free(fill);
  free(p->ncopies);
  free(p->copies);
  p->ncopies = nc;
  p->copies = cp;
  p->max_copies = maxc;
  return 0;
}

int eldr_placement_linear(uint32_t layers, uint32_t experts, uint32_t ep_size,
                          uint32_t redundant, eldr_placement **out, eldr_diag *d) {
  *out = NULL;
  eldr_placement *p;
  int rc = eldr_placement_alloc(layers, experts, ep_size, redundant, &p, d);
  if (rc < 0) return rc;
  for (uint32_t l = 0; l < layers; l++)
    for (uint32_t s = 0; s < p->num_physical; s++)
      p->phys[(size_t)l * p->num_physical + s] = (uint16_t)(s % experts);
  rc = eldr_placement_index(p, d);
  if (rc < 0) {
    eldr_placement_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

typedef struct item {
  double share;
  uint32_t e, copy;
} item;

static int cmp_item(const void *a, const void *b) {
  const item *x = a, *y = b;
  if (x->share != y->share) return x->share > y->share ? -1 : 1;
  if (x->e != y->e) return x->e < y->e ? -1 : 1;
  return (x->copy > y->copy) - (x->copy < y->copy);
}

static int cmp_u16(const void *a, const void *b) {
  uint16_t x = *(const uint16_t *)a, y = *(const uint16_t *)b;
  return (x > y) - (x < y);
}

/* One layer of the greedy: a (E activations) -> row (P slots). Scratch:
 * ncp (E), items (P), load (R), fill (R), holds (R * E flags). */
static void greedy_layer(const double *a, uint32_t E, uint32_t R, uint32_t P, uint16_t *row,
                         uint32_t *ncp, item *items, double *load, uint32_t *fill, uint8_t *holds) {
  const uint32_t per = P / R;
  for (uint32_t e = 0; e < E; e++) ncp[e] = 1;
  for (uint32_t extra = E; extra < P; extra++) { /* a copy for the highest activation per copy */
    uint32_t best = UINT32_MAX;
    double bv = -1;
    for (uint32_t e = 0; e < E; e++) {
      if (ncp[e] >= R) continue; /* no rank left without it */
      double v = a[e] / ncp[e];
      if (v > bv) {
        bv = v;
        best = e;
      }
    }
    if (best == UINT32_MAX) best = extra % E; /* every expert on every rank already */
    ncp[best]++;
  }
  uint32_t n = 0;
  for (uint32_t e = 0; e < E; e++)
    for (uint32_t c = 0; c < ncp[e]; c++) items[n++] = (item){a[e] / ncp[e], e, c};
  qsort(items, n, sizeof *items, cmp_item);
  memset(load, 0, R * sizeof *load);
  memset(fill, 0, R * sizeof *fill);
  memset(holds, 0, (size_t)R * E);
  for (uint32_t i = 0; i < n; i++) {
    const item *it = &items[i];
    uint32_t best = UINT32_MAX;
    for (int pass = 0; pass < 2 && best == UINT32_MAX; pass++)
      for (uint32_t r = 0; r < R; r++) {
        if (fill[r] >= per) continue;
        if (pass == 0 && holds[(size_t)r * E + it->e]) continue; /* copies on distinct ranks */
        if (best == UINT32_MAX || load[r] < load[best]) best = r;
      }
    row[best * per + fill[best]++] = (uint16_t)it->e;
    load[best] += it->share;
    holds[(size_t)best * E + it->e] = 1;
  }
  for (uint32_t r = 0; r < R; r++) qsort(row + r * per, per, sizeof *row, cmp_u16);
}

int eldr_placement_greedy(const double *act, uint32_t layers, uint32_t experts, uint32_t ep_size,
                          uint32_t redundant, eldr_placement **out, eldr_diag *d) {
  *out = NULL;
  if (!act) return eldr_diag_fail(d, ELDR_EINVAL, "placement: NULL activation");
  for (size_t i = 0; i < (size_t)layers * experts; i++)
    if (!(act[i] >= 0) || !isfinite(act[i]))
      return eldr_diag_fail(d, ELDR_ERANGE, "placement: activation of layer %zu expert %zu is %g",
                            i / experts, i % experts, act[i]);
  eldr_placement *p;
  int rc = eldr_placement_alloc(layers, experts, ep_size, redundant, &p, d);
  if (rc < 0) return rc;
  const uint32_t R = ep_size, P = p->num_physical, E = experts;
  uint32_t *ncp = malloc(E * sizeof *ncp), *fill = malloc(R * sizeof *fill);
  item *items = malloc(P * sizeof *items);
  double *load = malloc(R * sizeof *load);
  uint8_t *holds = malloc((size_t)R * E);
  if (!ncp || !fill || !items || !load || !holds) {
    rc = eldr_diag_fail(d, ELDR_ENOMEM, "placement: out of memory");
  } else {
    for (uint32_t l = 0; l < layers; l++)
      greedy_layer(act + (size_t)l * E, E, R, P, p->phys + (size_t)l * P, ncp, items, load, fill,
                   holds);
    rc = eldr_placement_index(p, d);
  }
  free(ncp);
  free(fill);
  free(items);
  free(load);
  free(holds);
  if (rc < 0) {
    eldr_placement_free(p);
    return rc;
  }
  *out = p;
  return 0;
}

void eldr_placement_rank_loads(const eldr_placement *p, const double *act, uint32_t l,
                               double *loads) {
  const uint32_t E = p->num_experts, P = p->num_physical, per = eldr_placement_per_rank(p);
  memset(loads, 0, p->ep_size * sizeof *loads);
  for (uint32_t s = 0; s < P; s++) {
    uint16_t e = p->phys[(size_t)l * P + s];
    loads[s / per] += act[(size_t)l * E + e] / p->ncopies[(size_t)l * E + e];
  }
}

double eldr_placement_busiest_share(const eldr_placement *p, const double *act) {
  double loads[ELDR_PLACEMENT_MAX_RANKS], top = 0, all = 0;
  for (uint32_t l = 0; l < p->num_layers; l++) {
    eldr_placement_rank_loads(p, act, l, loads);
    double mx = 0;
    for (uint32_t r = 0; r < p->ep_size; r++) {
      all += loads[r];
      if (loads[r] > mx) mx = loads[r];
    }
    top += mx;
  }
  return all > 0 ? top / all : NAN;
}

int eldr_placement_activation(const eldr_trace *t, const size_t *idx, size_t n,
                              const eldr_artifact *a, double *act, eldr_diag *d) {
  if (!t || !a || !act || (n && !idx)) return eldr_diag_fail(d, ELDR_EINVAL, "placement: NULL argument");
  const eldr_shape S = t->shape;
  if (a->shape.num_layers != S.num_layers || a->shape.num_experts != S.num_experts ||
      a->shape.top_k != S.top_k)
    return eldr_diag_fail(d, ELDR_ESHAPE, "placement: artifact shape %ux%u top-%u differs from the "
                          "trace's %ux%u top-%u", a->shape.num_layers, a->shape.num_experts,
                          a->shape.top_k, S.num_layers, S.num_experts, S.top_k);
  const size_t LE = eldr_shape_cells(&S), K = a->k;
  memset(act, 0, (K + 1) * LE * sizeof *act);
  uint32_t *counts = malloc(LE * sizeof *counts);
  float *gates = malloc(LE * sizeof *gates), *sig = malloc((a->dim ? a->dim : 1) * sizeof *sig);
  if (!counts || !gates || !sig) {
    free(counts);
    free(gates);
    free(sig);
    return eldr_diag_fail(d, ELDR_ENOMEM, "placement: out of memory");
  }
  for (size_t i = 0; i < n; i++) {
    if (idx[i] >= t->n) continue;
    const eldr_request *r = &t->req[idx[i]];
    size_t c = K; /* no valid signature: global only */
    if (r->n_prefill && eldr_fit_request_signature(a, t, r, counts, gates, sig) == 0) {
      float best = -INFINITY;
      for (size_t j = 0; j < K; j++) {
        const float *cj = a->centroids + j * a->dim;
        float dot = 0;
        for (size_t q = 0; q < a->dim; q++) dot += cj[q] * sig[q];
        if (dot > best) {
          best = dot;
          c = j;
        }
      }
    }
    eldr_trace_request_counts(t, r, eldr_request_has_decode(r), counts);
    for (size_t q = 0; q < LE; q++) {
      if (!counts[q]) continue;
      if (c < K) act[c * LE + q] += counts[q];
      act[K * LE + q] += counts[q];
    }
  }
  free(counts);
  free(gates);
  free(sig);
  return 0;
}

static const char *const KIND_NAMES[] = {"linear", "global", "per-decoder"};

const char *eldr_placement_kind_name(eldr_placement_kind k) {
  return (unsigned)k < 3 ? KIND_NAMES[k] : "?";
}

int eldr_placement_kind_parse(const char *s, eldr_placement_kind *out) {
  for (int i = 0; s && i < 3; i++)
    if (!strcmp(s, KIND_NAMES[i])) {
      *out = (eldr_placement_kind)i;
      return 0;
    }
  return ELDR_EINVAL;
}

int eldr_placement_fit_all(const double *act, size_t k, uint32_t layers, uint32_t experts,
                           uint32_t ep_size, uint32_t redundant, eldr_placement **out,
                           eldr_diag *d) {
  const size_t LE = (size_t)layers * experts;
  for (size_t c = 0; c <= k; c++) out[c] = NULL;
  for (size_t c = 0; c <= k; c++) {
    int rc = eldr_placement_greedy(act + c * LE, layers, experts, ep_size, redundant, &out[c], d);
    if (rc < 0) {
      for (size_t j = 0; j < c; j++) {
        eldr_placement_free(out[j]);
        out[j] = NULL;
      }
      return rc;
    }
  }
  return 0;
}

/* ---- EP tally ------------------------------------------------------------ */
int eldr_ep_tally_init(eldr_ep_tally *t, uint32_t L, uint32_t K, uint32_t R, uint32_t P,
                       eldr_diag *d) {
  memset(t, 0, sizeof *t);
  if (!L || !K || !R || !P) return eldr_diag_fail(d, ELDR_EINVAL, "ep tally: zero dimension");
  t->L = L;
  t->K = K;
  t->R = R;
  t->P = P;
  t->rank_experts = calloc((size_t)L * R, sizeof *t->rank_experts);
  t->rank_tokens = calloc((size_t)L * R, sizeof *t->rank_tokens);
  t->stamp = calloc((size_t)L * P, sizeof *t->stamp);
  if (!t->rank_experts || !t->rank_tokens || !t->stamp) {
    eldr_ep_tally_free(t);
    return eldr_diag_fail(d, ELDR_ENOMEM, "ep tally: out of memory");
  }
  return 0;
}

void eldr_ep_tally_free(eldr_ep_tally *t) {
  free(t->rank_experts);
  free(t->rank_tokens);
  free(t->stamp);
  t->rank_experts = t->rank_tokens = t->stamp = NULL;
}

void eldr_ep_tally_begin(eldr_ep_tally *t) {
  memset(t->rank_experts, 0, (size_t)t->L * t->R * sizeof *t->rank_experts);
  memset(t->rank_tokens, 0, (size_t)t->L * t->R * sizeof *t->rank_tokens);
  if (++t->step == 0) { /* stamps wrapped: clear them */
    memset(t->stamp, 0, (size_t)t->L * t->P * sizeof *t->stamp);
    t->step = 1;
  }
}

void eldr_ep_tally_add(eldr_ep_tally *t, const eldr_placement *p, const uint16_t *sel,
                       uint32_t member) {
  const uint32_t L = t->L, K = t->K, R = t->R, P = t->P, E = p->num_experts;
  const uint32_t per = P / R, mc = p->max_copies;
  for (uint32_t l = 0; l < L; l++) {
    const uint16_t *sl = sel + (size_t)l * K;
    uint32_t *stl = t->stamp + (size_t)l * P;
    uint32_t *rex = t->rank_experts + (size_t)l * R, *rtk = t->rank_tokens + (size_t)l * R;
    for (uint32_t k = 0; k < K; k++) {
      size_t cell = (size_t)l * E + sl[k];
      uint32_t nc = p->ncopies[cell];
      uint32_t slot = p->copies[cell * mc + (nc > 1 ? member % nc : 0)];
      uint32_t r = slot / per;
      rtk[r]++;
      if (stl[slot] != t->step) {
        stl[slot] = t->step;
        rex[r]++;
      }
    }
  }
}

void eldr_ep_tally_end(eldr_ep_tally *t) {
  for (uint32_t l = 0; l < t->L; l++) {
    const uint32_t *rtk = t->rank_tokens + (size_t)l * t->R;
    uint32_t mx = 0, sum = 0;
    for (uint32_t r = 0; r < t->R; r++) {
      sum += rtk[r];
      if (rtk[r] > mx) mx = rtk[r];
    }
    t->busiest_tokens += mx;
    t->all_tokens += sum;
  }
}
