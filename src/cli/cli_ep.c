/* cli_ep.c — EP placement files and sets for fit, sim and worker
 * (see cli_ep.h). */
#include "cli_ep.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eldr/placement_io.h"

void cli_ep_set_free(cli_ep_set *set) {
  for (size_t i = 0; i < set->n_own; i++) eldr_placement_free(set->own[i]);
  free(set->own);
  free(set->dec);
  memset(set, 0, sizeof *set);
}

static uint32_t model_rows(const eldr_trace *t) {
  uint32_t rows = 0;
  for (uint32_t l = 0; l < t->shape.num_layers; l++)
    if (t->layer_ids[l] + 1 > rows) rows = t->layer_ids[l] + 1;
  return rows;
}

/* Activation blocks and the k + 1 greedy placements into set->own. */
static double *fit_set(const char *cmd, const eldr_trace *t, const size_t *idx, size_t n,
                       const eldr_artifact *a, uint32_t R, uint32_t N, cli_ep_set *set) {
  const uint32_t L = t->shape.num_layers, E = t->shape.num_experts;
  const size_t LE = (size_t)L * E;
  eldr_diag d = {{0}};
  double *act = malloc((a->k + 1) * LE * sizeof *act);
  set->own = calloc(a->k + 1, sizeof *set->own);
  if (!act || !set->own) cli_fail(cmd, "out of memory");
  int rc = eldr_placement_activation(t, idx, n, a, act, &d);
  if (!rc) rc = eldr_placement_fit_all(act, a->k, L, E, R, N, set->own, &d);
  if (rc) cli_usage_error(cmd, "--ep-size %u --redundant-experts %u: %s", R, N, eldr_diag_msg(&d, rc));
  set->n_own = a->k + 1;
  /* calibration estimate of the busiest rank's share of each decoder's own
   * (cluster's) traffic under each layout, averaged over the clusters */
  eldr_placement *lin = NULL;
  if ((rc = eldr_placement_linear(L, E, R, N, &lin, &d))) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  double sum[3] = {0, 0, 0};
  size_t used = 0;
  for (size_t c = 0; c < a->k; c++) {
    const double *own = act + c * LE;
    double s0 = eldr_placement_busiest_share(lin, own);
    if (!isfinite(s0)) continue; /* an empty cluster */
    sum[0] += s0;
    sum[1] += eldr_placement_busiest_share(set->own[a->k], own);
    sum[2] += eldr_placement_busiest_share(set->own[c], own);
    used++;
  }
  for (int i = 0; i < 3; i++) set->share[i] = used ? sum[i] / (double)used : NAN;
  eldr_placement_free(lin);
  return act;
}

void cli_ep_fit_write(const char *cmd, const eldr_trace *t, const size_t *idx, size_t n,
                      eldr_artifact *a, const char *out_path, uint32_t R, uint32_t N,
                      cli_ep_set *set) {
  memset(set, 0, sizeof *set);
  free(fit_set(cmd, t, idx, n, a, R, N, set));
  const char *base = strrchr(out_path, '/');
  base = base ? base + 1 : out_path;
  size_t blen = strlen(base);
  if (blen > 5 && !strcmp(base + blen - 5, ".json")) blen -= 5;
  if (blen > 200) cli_usage_error(cmd, "-o: file name too long for placement names");
  char **names = calloc(a->k + 1, sizeof *names);
  if (!names) cli_fail(cmd, "out of memory");
  uint32_t rows = model_rows(t);
  eldr_diag d = {{0}};
  for (size_t c = 0; c <= a->k; c++) {
    names[c] = malloc(256);
    if (!names[c]) cli_fail(cmd, "out of memory");
    if (c < a->k)
      snprintf(names[c], 256, "%.*s.placement.decoder-%zu.json", (int)blen, base, c);
    else
      snprintf(names[c], 256, "%.*s.placement.global.json", (int)blen, base);
    char path[4096];
    int rc = eldr_artifact_placement_path(out_path, names[c], path, sizeof path, &d);
    if (!rc) rc = eldr_placement_save(path, set->own[c], t->layer_ids, rows, &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  }
  int rc = eldr_artifact_set_placement(a, R, N, names[a->k], (const char *const *)names, &d);
  if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
  for (size_t c = 0; c <= a->k; c++) free(names[c]);
  free(names);
}

static void load_named(const char *cmd, const eldr_trace *t, const eldr_artifact *a,
                       const char *art_path, uint32_t R, cli_ep_set *set) {
  const eldr_artifact_placement *ap = a->placement;
  if (ap->ep_size != R)
    cli_usage_error(cmd, "--ep-size %u but the artifact's placements are for EP %u", R, ap->ep_size);
  set->own = calloc(a->k + 1, sizeof *set->own);
  if (!set->own) cli_fail(cmd, "out of memory");
  eldr_diag d = {{0}};
  for (size_t c = 0; c <= a->k; c++) {
    char path[4096];
    const char *name = c < a->k ? ap->decoders[c] : ap->global;
    int rc = eldr_artifact_placement_path(art_path, name, path, sizeof path, &d);
    if (!rc)
      rc = eldr_placement_load(path, t->shape.num_experts, R, t->layer_ids, t->shape.num_layers,
                               &set->own[c], &d);
    if (rc) cli_fail(cmd, "%s", eldr_diag_msg(&d, rc));
    set->n_own = c + 1;
    if (set->own[c]->num_physical != set->own[0]->num_physical)
      cli_fail(cmd, "%s: %u physical experts, the first placement has %u", path,
               set->own[c]->num_physical, set->own[0]->num_physical);
  }
}

void cli_ep_sim_placements(const char *cmd, eldr_placement_kind kind, const eldr_trace *t,
                           const size_t *idx, size_t n, const eldr_artifact *a,
                           const char *art_path, uint32_t R, uint32_t N, size_t D,
                           cli_ep_set *set) {
  memset(set, 0, sizeof *set);
  set->share[0] = set->share[1] = set->share[2] = NAN;
  set->D = D;
  set->dec = calloc(D, sizeof *set->dec);
  if (!set->dec) cli_fail(cmd, "out of memory");
  eldr_diag d = {{0}};
  if (kind == ELDR_PLACEMENT_LINEAR) {
    set->own = calloc(1, sizeof *set->own);
    if (!set->own) cli_fail(cmd, "out of memory");
    int rc = eldr_placement_linear(t->shape.num_layers, t->shape.num_experts, R, N, &set->own[0], &d);
    if (rc) cli_usage_error(cmd, "--ep-size %u: %s", R, eldr_diag_msg(&d, rc));
    set->n_own = 1;
    for (size_t i = 0; i < D; i++) set->dec[i] = set->own[0];
    return;
  }
  if (!a) cli_usage_error(cmd, "--placement %s needs the routing artifact", eldr_placement_kind_name(kind));
  if (art_path && a->placement) {
    load_named(cmd, t, a, art_path, R, set);
  } else {
    if (!n)
      cli_usage_error(cmd, "--placement %s: the artifact names no placements and there are no "
                      "calibration requests to fit them (give --fit-fraction or fit with --ep-size)",
                      eldr_placement_kind_name(kind));
    free(fit_set(cmd, t, idx, n, a, R, N, set));
  }
  for (size_t i = 0; i < D; i++)
    set->dec[i] = kind == ELDR_PLACEMENT_GLOBAL ? set->own[a->k] : set->own[i % a->k];
}
