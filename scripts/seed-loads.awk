# seed-loads.awk — the part the footprint summaries share
# (scripts/footprint-study.sh, scripts/footprint-noreplay.sh): one eldr sim
# CSV per seed (--csv), the rows of a seed keyed by (file, policy, rate); a
# seed's sweep ranked by rate (its load k is its k-th smallest rate); then,
# per load, each policy's mean over the seeds and its change against the
# best load balancer. Loaded before the caller's program (awk -f this -f
# that); the caller sets -v c50=COLUMN -v c99=COLUMN [-v cx=COLUMN] and
# calls rank_rates() once, then at_load(li, list) per load.
FNR == 1 { nf++ }
$1 == "policy" { for (i = 1; i <= NF; i++) col[$i] = i; next }
!((nf, $2) in seen) { seen[nf, $2] = 1; nr[nf]++; rate[nf, nr[nf]] = $2 + 0; rkey[nf, nr[nf]] = $2 }
{
  k = nf SUBSEP $1 SUBSEP $2; p50[k] = $(col[c50]); p99[k] = $(col[c99])
  if (cx != "") { ex[k] = $(col[cx]); if (ex[k] + 0 > ex_max) ex_max = ex[k] + 0 }
}

# each seed's rates sorted ascending, rkey[seed, k] the k-th as written
function rank_rates(   f, i, j, t) {
  for (f = 1; f <= nf; f++)
    for (i = 1; i <= nr[f]; i++) for (j = i + 1; j <= nr[f]; j++)
      if (rate[f, j] < rate[f, i]) {
        t = rate[f, i]; rate[f, i] = rate[f, j]; rate[f, j] = t
        t = rkey[f, i]; rkey[f, i] = rkey[f, j]; rkey[f, j] = t
      }
}

# at load li: P50[p], P99[p], EX[p] the means over the seeds of the
# policies in the space-separated list and of random, rr, jsq and p2c;
# b50, b99 the best balancer's; g50[p], g99[p] each listed policy's change
# against it in %. Returns the mean rate.
function at_load(li, list,   n, pol, lb, j, s, r, rsum, p) {
  for (p in P50) delete P50[p]
  for (p in P99) delete P99[p]
  for (p in EX) delete EX[p]
  n = split("random rr jsq p2c " list, pol, " ")
  rsum = 0
  for (s = 1; s <= nf; s++) {
    r = rkey[s, li]; rsum += rate[s, li]
    for (j = 1; j <= n; j++) {
      P50[pol[j]] += p50[s, pol[j], r] / nf; P99[pol[j]] += p99[s, pol[j], r] / nf
      EX[pol[j]] += ex[s, pol[j], r] / nf
    }
  }
  b50 = 1e30; b99 = 1e30
  for (j = 1; j <= 4; j++) { if (P50[pol[j]] < b50) b50 = P50[pol[j]]; if (P99[pol[j]] < b99) b99 = P99[pol[j]] }
  for (j = 5; j <= n; j++) { g50[pol[j]] = 100 * (P50[pol[j]] / b50 - 1); g99[pol[j]] = 100 * (P99[pol[j]] / b99 - 1) }
  return rsum / nf
}

# a share of the oracle's gain: "-" where the oracle gains less than 0.1 %
function sh(a, b) { return b < -0.1 ? sprintf("%.0f%%", 100 * a / b) : "-" }
