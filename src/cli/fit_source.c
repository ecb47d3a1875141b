/* fit_source.c — trace inputs as the fit's streaming source (see
 * fit_source.h). */
#include "fit_source.h"

#include <stdlib.h>
#include <string.h>

/* Cache the prefill counts of one usable request (pass 1 only). */
static void cache_add(cli_fit_file *f, const uint32_t *pre, const float *gates) {
  const size_t LE = eldr_shape_cells(&f->shape);
  if (f->cache_state != 0) return;
  if (gates) goto drop;
  if (f->cache_n == f->cache_cap) {
    size_t nc = f->cache_cap ? 2 * f->cache_cap : 1024;
    if (nc * LE * sizeof *f->cache > f->cache_budget) nc = f->cache_budget / (LE * sizeof *f->cache);
    if (nc <= f->cache_n) goto drop;
    uint16_t *c = realloc(f->cache, nc * LE * sizeof *c);
    if (!c) goto drop;
    f->cache = c;
    f->cache_cap = nc;
  }
  uint16_t *row = f->cache + f->cache_n * LE;
  for (size_t x = 0; x < LE; x++) {
    if (pre[x] > UINT16_MAX) goto drop;
    row[x] = (uint16_t)pre[x];
  }
  f->cache_n++;
  return;
drop:
  free(f->cache);
  f->cache = NULL;
  f->cache_n = f->cache_cap = 0;
  f->cache_state = -1;
}

static int each_cached(cli_fit_file *f, eldr_fit_visit visit, void *ud) {
  const size_t LE = eldr_shape_cells(&f->shape);
  for (size_t i = 0; i < f->cache_n; i++) {
    const uint16_t *row = f->cache + i * LE;
    for (size_t x = 0; x < LE; x++) f->pre[x] = row[x];
    eldr_fit_item it = {.n_prefill = 1, .prefill = f->pre};
    int rc = visit(ud, &it);
    if (rc) return rc;
  }
  return 0;
}

static int request_visit(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  (void)index;
  cli_fit_file *f = ud;
  eldr_fit_item it = {.n_prefill = r->n_prefill, .prefill = f->pre, .decode = f->dec};
  if (f->need_gates && eldr_request_is_counts(r))
    return eldr_diag_fail(f->d, ELDR_EUNSUPPORTED,
                          "--representation %s needs per-token prefill_gates; %s: request '%s' is "
                          "in the counts form", f->need_gates, f->label ? f->label : "", r->id);
  if (r->n_prefill) {
    eldr_trace_request_counts(t, r, 0, f->pre);
    eldr_trace_request_counts(t, r, 1, f->dec);
    if (eldr_request_is_counts(r) && !r->decode_counts) it.decode = NULL; /* unknown */
    if (r->prefill_gates && r->prefill) {
      eldr_fit_gate_sums(t, r, f->gates);
      it.gates = f->gates;
    }
    if (f->passes == 1) cache_add(f, f->pre, it.gates);
  }
  return f->visit(f->ud, &it);
}

static int each_inputs(void *ctx, eldr_fit_visit visit, void *ud, eldr_diag *d) {
  cli_fit_file *f = ctx;
  if (f->passes++ > 0 && f->cache_state == 1) return each_cached(f, visit, ud);
  f->visit = visit;
  f->ud = ud;
  f->d = d;
  eldr_trace_read_info info;
  int rc = eldr_trace_foreach_inputs(f->paths, f->n_paths, request_visit, f, &info, d);
  if (f->passes == 1) {
    f->info = info;
    if (!rc && f->cache_state == 0) f->cache_state = 1;
  }
  return rc;
}

/* The header of the first request, then stop. */
#define STOP_HEADER 1
static int header_visit(const eldr_trace *t, eldr_request *r, size_t index, void *ud) {
  (void)r;
  (void)index;
  cli_fit_file *f = ud;
  f->shape = t->shape;
  const size_t L = t->shape.num_layers;
  f->model = strdup(t->model ? t->model : "");
  f->generator = t->generator ? strdup(t->generator) : NULL;
  f->layer_ids = malloc(L * sizeof *f->layer_ids);
  if (!f->model || (t->generator && !f->generator) || !f->layer_ids) return ELDR_ENOMEM;
  memcpy(f->layer_ids, t->layer_ids, L * sizeof *f->layer_ids);
  return STOP_HEADER;
}

int cli_fit_file_open(char *const *paths, size_t n_paths, size_t cache_budget, cli_fit_file *f,
                      eldr_fit_source *src, eldr_diag *d) {
  memset(f, 0, sizeof *f);
  memset(src, 0, sizeof *src);
  f->paths = paths;
  f->n_paths = n_paths;
  f->cache_budget = cache_budget;
  if (!cache_budget) f->cache_state = -1;
  eldr_trace_read_info info;
  int rc = eldr_trace_foreach_inputs(paths, n_paths, header_visit, f, &info, d);
  if (rc == ELDR_ENOMEM) return eldr_diag_fail(d, rc, "out of memory");
  if (rc != STOP_HEADER) return rc ? rc : eldr_diag_fail(d, ELDR_EEMPTY, "no request in the input");
  const size_t LE = eldr_shape_cells(&f->shape);
  f->pre = malloc(LE * sizeof *f->pre);
  f->dec = malloc(LE * sizeof *f->dec);
  f->gates = malloc(LE * sizeof *f->gates);
  if (!f->pre || !f->dec || !f->gates) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory");
  src->model = f->model;
  src->shape = f->shape;
  src->layer_ids = f->layer_ids;
  src->generator = f->generator;
  src->each = each_inputs;
  src->ctx = f;
  return 0;
}

void cli_fit_file_close(cli_fit_file *f) {
  free(f->model);
  free(f->generator);
  free(f->layer_ids);
  free(f->cache);
  free(f->pre);
  free(f->dec);
  free(f->gates);
  memset(f, 0, sizeof *f);
}
