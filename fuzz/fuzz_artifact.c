/* fuzz_artifact.c — libFuzzer target for the routing artifact loader.
 *
 * Any input: eldr_artifact_parse must return an error or a valid artifact,
 * never crash. An accepted artifact must survive dump -> parse unchanged
 * (bit for bit), otherwise the target aborts. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "eldr/artifact.h"

static int same(const eldr_artifact *a, const eldr_artifact *b) {
  const size_t L = a->shape.num_layers, E = a->shape.num_experts;
  if (a->version != b->version || strcmp(a->model, b->model) != 0) return 0;
  if (memcmp(&a->shape, &b->shape, sizeof a->shape) != 0) return 0;
  if (memcmp(a->layer_ids, b->layer_ids, L * sizeof *a->layer_ids) != 0) return 0;
  if (a->repr != b->repr || a->idf_enabled != b->idf_enabled) return 0;
  if (a->idf_enabled && memcmp(a->idf, b->idf, L * E * sizeof *a->idf) != 0) return 0;
  if (memcmp(a->mask, b->mask, L) != 0 || a->k != b->k || a->dim != b->dim) return 0;
  if (memcmp(a->centroids, b->centroids, a->k * a->dim * sizeof *a->centroids) != 0) return 0;
  if (memcmp(&a->tau, &b->tau, sizeof a->tau) != 0) return 0;
  if (a->fit_n != b->fit_n || a->fit_seed != b->fit_seed || a->fit_balanced != b->fit_balanced)
    return 0;
  if (isnan(a->fit_rho) != isnan(b->fit_rho)) return 0;
  if (!isnan(a->fit_rho) && memcmp(&a->fit_rho, &b->fit_rho, sizeof a->fit_rho) != 0) return 0;
  if (memcmp(a->cluster_sizes, b->cluster_sizes, a->k * sizeof *a->cluster_sizes) != 0) return 0;
  if (!a->created != !b->created || (a->created && strcmp(a->created, b->created) != 0)) return 0;
  if (!a->trace != !b->trace || (a->trace && strcmp(a->trace, b->trace) != 0)) return 0;
  if (!a->placement != !b->placement) return 0;
  if (a->placement) {
    const eldr_artifact_placement *p = a->placement, *q = b->placement;
    if (p->ep_size != q->ep_size || p->redundant != q->redundant || strcmp(p->global, q->global))
      return 0;
    for (size_t i = 0; i < a->k; i++)
      if (strcmp(p->decoders[i], q->decoders[i])) return 0;
  }
  return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  eldr_artifact *a = NULL;
  eldr_diag d;
  d.msg[0] = '\0';
  int rc = eldr_artifact_parse((const char *)data, size, &a, &d);
  if (rc != 0) {
    if (a != NULL || d.msg[0] == '\0') abort(); /* errors leave nothing and say why */
    return 0;
  }
  if (eldr_artifact_validate(a, NULL) != 0) abort();
  char *s = eldr_artifact_dump(a);
  if (!s) abort();
  eldr_artifact *b = NULL;
  if (eldr_artifact_parse(s, strlen(s), &b, NULL) != 0 || !same(a, b)) abort();
  eldr_artifact_free(b);
  free(s);
  eldr_artifact_free(a);
  return 0;
}
