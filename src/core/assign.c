/* assign.c — exact capacitated assignment (min-cost flow) and Hungarian.
 *
 * eldr_assign_capacitated solves the transportation problem
 *   min sum_p cost[p][bin(p)]  s.t. |{p : bin(p) = b}| <= cap
 * by successive shortest paths, one point at a time (like the row-by-row
 * Hungarian method). Because k << n, the residual network is collapsed onto
 * the k bins (plus a sink T): moving one point q from bin a to bin b costs
 * cost[q][b] - cost[q][a], so the arc a -> b weighs the minimum of that over
 * the points in a. Those minima live in one binary heap per ordered pair
 * (a, b), with lazy insertion and removal (see hent). A shortest augmenting
 * path is then a Dijkstra over k+1 nodes with bin potentials (Johnson),
 * O(k^2) per point; a point joining or leaving a bin costs O(k) plus the
 * heaps whose minimum it was (O(log n) amortised each). Points are placed in
 * order of decreasing regret, which keeps augmenting paths short.
 *
 * Invariant (dual feasibility): every assigned point q sits in a bin that
 * minimises cost[q][b] - pi[b]; this makes all reduced arc costs >= 0, and
 * the standard SSP argument (the new assignment differs from the old optimum
 * by one augmenting path plus non-negative cycles) gives optimality.
 */
#include "eldr/assign.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/error.h"
#include "eldr/grow.h"

/* Costs beyond this magnitude could overflow when differences are summed
 * along a path; they are rejected like non-finite costs. */
#define ASSIGN_COST_LIMIT 1e150

/* Heap entry: the key of point q for one pair, valid while the point has
 * not left the bin since (stamp == the point's current stamp). Both
 * removal and insertion are lazy:
 * - a point leaving a bin only bumps its stamp; its stale entries are
 *   dropped when they reach the top of a heap;
 * - a new entry is appended unsorted (entries [hlen, len) of the heap) and
 *   only compared with the current minimum (w, topq); the pending entries
 *   are sifted into the heap when the heap's minimum leaves the bin.
 * Invariant: w/topq of each pair is the minimum of all its entries, and it
 * is valid. Most heaps never lose their minimum, so most insertions cost
 * O(1) instead of a sift through a large heap. */
typedef struct {
  double key;
  int q;
  unsigned stamp;
} hent;

typedef struct {
  hent *e;
  int len, hlen;       /* entries, heap-ordered prefix */
  size_t capa;         /* allocated */
} heap;

typedef struct {
  const double *cost;
  size_t n, k;
  heap *h;          /* k*k heaps, h[a*k+b]: points in bin a keyed by cost[q][b]-cost[q][a] */
  unsigned *stamp;  /* n */
  int *bin_of;      /* n */
  int *topq;        /* k*k: point at the top of heap (a, b), or -1 */
  double *w;        /* k*k: top key of heap (a, b), or INFINITY */
} flow;

static inline int hless(const hent *x, const hent *y) {
  return x->key < y->key || (x->key == y->key && x->q < y->q);
}

static void sift_up(heap *hp, int i) {
  hent x = hp->e[i];
  while (i > 0) {
    int par = (i - 1) / 2;
    if (!hless(&x, &hp->e[par])) break;
    hp->e[i] = hp->e[par];
    i = par;
  }
  hp->e[i] = x;
}

static void pop_top(heap *hp) {
  hent x = hp->e[--hp->len];
  hp->hlen = hp->len;
  int i = 0;
  for (;;) {
    int l = 2 * i + 1;
    if (l >= hp->len) break;
    int m = l;
    if (l + 1 < hp->len && hless(&hp->e[l + 1], &hp->e[l])) m = l + 1;
    if (!hless(&hp->e[m], &x)) break;
    hp->e[i] = hp->e[m];
    i = m;
  }
  if (hp->len > 0) hp->e[i] = x;
}

/* Put point q into bin a: one entry in each heap (a, b), b != a. */
static int bin_insert(flow *f, int q, size_t a) {
  const size_t k = f->k;
  const double *c = f->cost + (size_t)q * k;
  const unsigned st = f->stamp[q];
  double *wa = f->w + a * k;
  int *ta = f->topq + a * k;
  for (size_t b = 0; b < k; b++) {
    if (b == a) continue;
    heap *hp = &f->h[a * k + b];
    if (eldr_grow(&hp->e, &hp->capa, (size_t)hp->len + 1, sizeof *hp->e, 8)) return ELDR_ENOMEM;
    const double key = c[b] - c[a];
    hent *x = &hp->e[hp->len++];
    x->key = key;
    x->q = q;
    x->stamp = st;
    if (ta[b] < 0 || key < wa[b] || (key == wa[b] && q < ta[b])) {
      wa[b] = key;
      ta[b] = q;
    }
  }
  f->bin_of[q] = (int)a;
  return 0;
}

/* Take point q out of its bin a: invalidate its entries, and rebuild the
 * minimum of the heaps whose minimum it was. */
static void bin_remove(flow *f, int q, size_t a) {
  const size_t k = f->k;
  f->stamp[q]++;
  for (size_t b = 0; b < k; b++) {
    if (f->topq[a * k + b] != q) continue;
    heap *hp = &f->h[a * k + b];
    while (hp->hlen < hp->len) sift_up(hp, hp->hlen++);
    while (hp->len > 0 && hp->e[0].stamp != f->stamp[hp->e[0].q]) pop_top(hp);
    f->w[a * k + b] = hp->len ? hp->e[0].key : INFINITY;
    f->topq[a * k + b] = hp->len ? hp->e[0].q : -1;
  }
  f->bin_of[q] = -1;
}

typedef struct {
  double regret;
  int p;
} order_ent;

static int cmp_order(const void *x, const void *y) {
  const order_ent *a = x, *b = y;
  if (a->regret != b->regret) return a->regret > b->regret ? -1 : 1;
  return (a->p > b->p) - (a->p < b->p);
}

static int check_costs(const double *cost, size_t count) {
  for (size_t i = 0; i < count; i++)
    if (!isfinite(cost[i]) || fabs(cost[i]) > ASSIGN_COST_LIMIT) return ELDR_EINVAL;
  return 0;
}

int eldr_assign_capacitated(const double *cost, size_t n, size_t k, size_t cap, int *assign,
                            double *total) {
  if (k == 0 || k > (size_t)INT32_MAX || n > (size_t)INT32_MAX / 2) return ELDR_EINVAL;
  if (n > 0 && (!cost || !assign)) return ELDR_EINVAL;
  /* cap < n <= 2^30 and k < 2^31, so cap * k cannot overflow here. */
  if (cap < n && cap * k < n) return ELDR_EINVAL;
  if (cap > n) cap = n;
  if (n > 0 && check_costs(cost, n * k)) return ELDR_EINVAL;
  if (total) *total = 0.0;
  if (n == 0) return 0;

  int rc = ELDR_ENOMEM;
  flow f = {.cost = cost, .n = n, .k = k};
  size_t kk = k * k;
  double *pi = NULL, *d = NULL;
  int *size = NULL, *pred = NULL, *mv_q = NULL, *mv_to = NULL;
  unsigned char *done = NULL;
  order_ent *order = NULL;
  f.h = calloc(kk, sizeof *f.h);
  f.stamp = calloc(n, sizeof *f.stamp);
  f.topq = malloc(kk * sizeof *f.topq);
  f.bin_of = malloc(n * sizeof *f.bin_of);
  f.w = malloc(kk * sizeof *f.w);
  pi = calloc(k + 1, sizeof *pi);
  d = malloc((k + 1) * sizeof *d);
  size = calloc(k, sizeof *size);
  pred = malloc((k + 1) * sizeof *pred);
  mv_q = malloc(k * sizeof *mv_q);
  mv_to = malloc(k * sizeof *mv_to);
  done = malloc(k + 1);
  order = malloc(n * sizeof *order);
  if (!f.h || !f.stamp || !f.topq || !f.bin_of || !f.w || !pi || !d || !size || !pred || !mv_q || !mv_to ||
      !done || !order)
    goto out;
  /* Any order gives the optimum; placing the points with the largest regret
   * (second-best minus best cost) first means later points rarely displace
   * earlier ones, so augmenting paths stay short. */
  for (size_t p = 0; p < n; p++) {
    const double *cp = cost + p * k;
    double b1 = INFINITY, b2 = INFINITY;
    for (size_t b = 0; b < k; b++) {
      if (cp[b] < b1) {
        b2 = b1;
        b1 = cp[b];
      } else if (cp[b] < b2) {
        b2 = cp[b];
      }
    }
    order[p].regret = k > 1 ? b2 - b1 : 0.0;
    order[p].p = (int)p;
  }
  qsort(order, n, sizeof *order, cmp_order);
  for (size_t i = 0; i < kk; i++) {
    f.w[i] = INFINITY;
    f.topq[i] = -1;
  }

  const size_t T = k; /* sink node */
  for (size_t o = 0; o < n; o++) {
    const size_t p = (size_t)order[o].p;
    const double *cp = cost + p * k;
    /* Dijkstra on reduced costs from the new point p. */
    for (size_t b = 0; b < k; b++) {
      d[b] = cp[b] - pi[b];
      pred[b] = -1;
      done[b] = 0;
    }
    d[T] = INFINITY;
    done[T] = 0;
    pred[T] = -1;
    for (;;) {
      size_t u = T;
      double best = d[T];
      for (size_t b = 0; b < k; b++)
        if (!done[b] && d[b] < best) {
          best = d[b];
          u = b;
        }
      if (u == T) break; /* T reached (it always is: some bin has room) */
      done[u] = 1;
      double du = d[u] + pi[u];
      if ((size_t)size[u] < cap) {
        double cand = du - pi[T];
        if (cand < d[T]) {
          d[T] = cand;
          pred[T] = (int)u;
        }
      }
      if (size[u] > 0) {
        const double *wu = f.w + u * k;
        for (size_t v = 0; v < k; v++) {
          if (done[v] || v == u) continue;
          double cand = du + wu[v] - pi[v];
          if (cand < d[v]) {
            d[v] = cand;
            pred[v] = (int)u;
          }
        }
      }
    }
    double dT = d[T];
    /* Potentials: settled nodes by their distance, the rest by dT. */
    for (size_t b = 0; b < k; b++) pi[b] += done[b] ? d[b] : dT;
    pi[T] += dT;

    /* Walk the path back from T, record the moves, then apply them. */
    int nmv = 0;
    int cur = pred[T];
    while (pred[cur] != -1) {
      int a = pred[cur];
      mv_q[nmv] = f.topq[(size_t)a * k + (size_t)cur];
      mv_to[nmv] = cur;
      nmv++;
      cur = a;
    }
    size[pred[T]]++;
    for (int m = 0; m < nmv; m++) {
      int q = mv_q[m];
      bin_remove(&f, q, (size_t)f.bin_of[q]);
      if (bin_insert(&f, q, (size_t)mv_to[m])) goto out;
    }
    if (bin_insert(&f, (int)p, (size_t)cur)) goto out;
  }

  double sum = 0.0;
  for (size_t p = 0; p < n; p++) {
    assign[p] = f.bin_of[p];
    sum += cost[p * k + (size_t)f.bin_of[p]];
  }
  if (total) *total = sum;
  rc = 0;
out:
  if (f.h)
    for (size_t i = 0; i < kk; i++) free(f.h[i].e);
  free(order);
  free(done);
  free(mv_to);
  free(mv_q);
  free(pred);
  free(size);
  free(d);
  free(pi);
  free(f.w);
  free(f.bin_of);
  free(f.topq);
  free(f.stamp);
  free(f.h);
  return rc;
}

int eldr_assign_hungarian(const double *cost, size_t rows, size_t cols, int *row_to_col,
                          double *total) {
  if (rows > cols || cols > (size_t)INT32_MAX) return ELDR_EINVAL;
  if (rows > 0 && (!cost || !row_to_col)) return ELDR_EINVAL;
  if (rows > 0 && check_costs(cost, rows * cols)) return ELDR_EINVAL;
  if (total) *total = 0.0;
  if (rows == 0) return 0;

  /* 1-indexed: u over rows, v over columns, match[j] = row in column j. */
  double *u = calloc(rows + 1, sizeof *u);
  double *v = calloc(cols + 1, sizeof *v);
  double *minv = malloc((cols + 1) * sizeof *minv);
  size_t *match = calloc(cols + 1, sizeof *match);
  size_t *way = calloc(cols + 1, sizeof *way);
  unsigned char *used = malloc(cols + 1);
  int rc = ELDR_ENOMEM;
  if (!u || !v || !minv || !match || !way || !used) goto out;

  for (size_t i = 1; i <= rows; i++) {
    match[0] = i;
    size_t j0 = 0;
    for (size_t j = 0; j <= cols; j++) {
      minv[j] = INFINITY;
      used[j] = 0;
    }
    do {
      used[j0] = 1;
      size_t i0 = match[j0], j1 = 0;
      double delta = INFINITY;
      const double *crow = cost + (i0 - 1) * cols;
      for (size_t j = 1; j <= cols; j++) {
        if (used[j]) continue;
        double cur = crow[j - 1] - u[i0] - v[j];
        if (cur < minv[j]) {
          minv[j] = cur;
          way[j] = j0;
        }
        if (minv[j] < delta) {
          delta = minv[j];
          j1 = j;
        }
      }
      for (size_t j = 0; j <= cols; j++) {
        if (used[j]) {
          u[match[j]] += delta;
          v[j] -= delta;
        } else {
          minv[j] -= delta;
        }
      }
      j0 = j1;
    } while (match[j0] != 0);
    do {
      size_t j1 = way[j0];
      match[j0] = match[j1];
      j0 = j1;
    } while (j0);
  }
  double sum = 0.0;
  for (size_t j = 1; j <= cols; j++)
    if (match[j]) row_to_col[match[j] - 1] = (int)(j - 1);
  for (size_t i = 0; i < rows; i++) sum += cost[i * cols + (size_t)row_to_col[i]];
  if (total) *total = sum;
  rc = 0;
out:
  free(used);
  free(way);
  free(match);
  free(minv);
  free(v);
  free(u);
  return rc;
}
