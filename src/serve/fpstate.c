/* fpstate.c — the footprint policy's state in the router: one generation
 * per configuration (built by a reload off to the side), kept alive by the
 * server while current and by every request holding a ticket on it, so a
 * reload never frees footprint sums a decode leg in flight will subtract
 * from. Loop thread only. */
#include <stdlib.h>
#include <string.h>

#include "serve_types.h"

int eldr__fps_new(eldr__art *art, const eldr_serve_config *c, size_t n_decode, eldr__fpstate **out,
                  eldr_diag *d) {
  *out = NULL;
  const eldr_artifact *a = art ? art->a : NULL;
  if (c->policy != ELDR_POLICY_FOOTPRINT || !a || !a->latency || n_decode == 0) return 0;
  eldr__fpstate *f = calloc(1, sizeof *f);
  if (!f) return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the footprint state");
  /* B: the engines' --max-num-seqs (config decode_max_batch) */
  eldr_footprint_opts o = {.n_decoders = n_decode, .max_batch = c->decode_max_batch, .layer_mask = a->mask,
                           .prior = a->fp_prior, .n_priors = a->fp_n_priors,
                           .prior_tokens = a->fp_prior_tokens, .centroids = a->centroids,
                           .dim = a->dim, .own_weight = c->fp_own_weight};
  float *home = NULL;
  if (c->fp_home_weight > 0 && a->k && a->centroids) { /* decoder j's centroid: j mod k, as ELDR's */
    if (!(home = malloc(n_decode * a->dim * sizeof *home))) {
      free(f);
      return eldr_diag_fail(d, ELDR_ENOMEM, "out of memory for the footprint state");
    }
    for (size_t j = 0; j < n_decode; j++)
      memcpy(home + j * a->dim, a->centroids + (j % a->k) * a->dim, a->dim * sizeof *home);
    o.home_weight = c->fp_home_weight;
    o.home_centroids = home;
  }
  int rc = eldr_footprint_new(a->latency, &o, &f->fp, d);
  free(home); /* copied */
  if (rc) {
    free(f);
    eldr_diag_prefix(d, "footprint policy");
    return rc;
  }
  eldr_policy_init(&f->pol, ELDR_POLICY_FOOTPRINT, 0, 0, NULL, 0, 0, 1);
  eldr_policy_attach_footprint(&f->pol, f->fp);
  f->n = n_decode;
  f->refs = 1;
  f->art = eldr__art_ref(art);
  *out = f;
  return 0;
}

void eldr__fps_put(eldr__fpstate *f) {
  if (!f || --f->refs) return;
  eldr_footprint_free(f->fp);
  eldr__art_put(f->art);
  free(f);
}

void eldr__fps_route(rq *r, eldr__fpstate *f, eldr_policy *p, int k, const eldr_fp_request *fr) {
  if (!f || k < 0) return;
  uint64_t t = eldr_policy_on_route(p, k, fr);
  if (t == ELDR_FP_NO_TICKET) return;
  r->fps = f;
  r->fp_ticket = t;
  f->refs++;
}

void eldr__fps_end(rq *r) {
  if (!r->fps) return;
  eldr_policy_on_end(&r->fps->pol, r->fp_ticket);
  eldr__fps_put(r->fps);
  r->fps = NULL;
  r->fp_ticket = ELDR_FP_NO_TICKET;
}

size_t eldr__fps_inflight(const eldr__fpstate *f) {
  size_t t = 0;
  for (size_t k = 0; f && k < f->n; k++) t += eldr_footprint_inflight(f->fp, k);
  return t;
}
