/* cli_ep.h — expert-parallel placements for the commands: `eldr fit
 * --ep-size` writes them next to the artifact, `eldr sim` builds or loads
 * one per decoder, `eldr worker` loads its own. Failures exit through
 * cli_fail / cli_usage_error (exit 1 / 2) naming the flag or file.
 * Single-threaded; the set owns its placements. */
#ifndef ELDR_CLI_EP_H
#define ELDR_CLI_EP_H

#include <stddef.h>
#include <stdint.h>

#include "eldr/artifact.h"
#include "eldr/placement.h"
#include "eldr/trace.h"

typedef struct cli_ep_set {
  eldr_placement **own;            /* owned placements */
  size_t n_own;
  const eldr_placement **dec;      /* D entries into own (decoder i -> dec[i]) */
  size_t D;
  double share[3];                 /* busiest-rank share of each decoder's own cluster's
                                      calibration traffic under linear, global and
                                      per-decoder layouts (mean over clusters); NaN unknown */
} cli_ep_set;

/* `eldr fit`: greedy placements from the calibration requests idx[0..n) per
 * cluster of a and globally, written as <stem>.placement.decoder-<i>.json
 * and <stem>.placement.global.json next to out_path (stem = out_path less a
 * ".json" suffix) and named in a. set->share is filled; set->dec is NULL. */
void cli_ep_fit_write(const char *cmd, const eldr_trace *t, const size_t *idx, size_t n,
                      eldr_artifact *a, const char *out_path, uint32_t ep_size, uint32_t redundant,
                      cli_ep_set *set);

/* `eldr sim`: D placements of a kind. linear needs nothing; global and
 * per-decoder load the files a names (art_path given and a->placement set,
 * same ep_size) or fit them from the calibration requests idx[0..n) of t
 * (n > 0); per-decoder gives decoder i cluster i mod a->k. */
void cli_ep_sim_placements(const char *cmd, eldr_placement_kind kind, const eldr_trace *t,
                           const size_t *idx, size_t n, const eldr_artifact *a,
                           const char *art_path, uint32_t ep_size, uint32_t redundant, size_t D,
                           cli_ep_set *set);

void cli_ep_set_free(cli_ep_set *set);

#endif
