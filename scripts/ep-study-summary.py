#!/usr/bin/env python3
"""Summarise scripts/ep-study.sh: per (model, workload, placement) and rate,
ELDR's TPOT p50/p99 against the best load balancer (lowest of random, rr,
jsq, p2c at that rate and percentile), and the busiest EP rank's share of
expert traffic for ELDR and for that balancer; then what per-decoder
placement recovers for ELDR, and ELDR+per-decoder against the best balancer
on its own best (global) placement."""
import json
import os
import sys

BASE = ("random", "rr", "jsq", "p2c")


def load(path):
    with open(path) as f:
        return json.load(f)


def table(d):
    rows = {}
    for r in d["rows"]:
        rows.setdefault(r["rate"], {})[r["policy"]] = r
    return rows


def best(rs, key):
    b = min((rs[p] for p in BASE if p in rs), key=lambda r: r[key])
    return b


def main(out):
    names = sorted(n[:-5] for n in os.listdir(out) if n.endswith(".json") and "-" in n
                   and not n.startswith(("a2a", "bw")))
    groups = {}
    for n in names:
        for pl in ("per-decoder", "global", "linear"):
            if n.endswith("-" + pl):
                groups.setdefault(n[: -len(pl) - 1], {})[pl] = load(os.path.join(out, n + ".json"))
                break
    for g in sorted(groups):
        print(f"\n## {g}")
        print(f"{'placement':12} {'rate':>6} {'eldr p50':>9} {'best p50':>9} {'gain50':>7} "
              f"{'eldr p99':>9} {'best p99':>9} {'gain99':>7} {'rank eldr':>9} {'rank LB':>8}")
        tabs = {pl: table(d) for pl, d in groups[g].items()}
        for pl in ("linear", "global", "per-decoder"):
            if pl not in tabs:
                continue
            for rate in sorted(tabs[pl]):
                rs = tabs[pl][rate]
                e, b50, b99 = rs["eldr"], best(rs, "tpot_p50_ms"), best(rs, "tpot_p99_ms")
                print(f"{pl:12} {rate:6g} {e['tpot_p50_ms']:9.2f} {b50['tpot_p50_ms']:9.2f} "
                      f"{100 * (e['tpot_p50_ms'] / b50['tpot_p50_ms'] - 1):+6.1f}% "
                      f"{e['tpot_p99_ms']:9.2f} {b99['tpot_p99_ms']:9.2f} "
                      f"{100 * (e['tpot_p99_ms'] / b99['tpot_p99_ms'] - 1):+6.1f}% "
                      f"{e['ep_busiest_share']:9.3f} {b50['ep_busiest_share']:8.3f}  ({b50['policy']})")
        if "per-decoder" in tabs and "global" in tabs:
            print("ELDR + per-decoder vs the best balancer on the global placement (its best static layout):")
            for rate in sorted(tabs["per-decoder"]):
                e = tabs["per-decoder"][rate]["eldr"]
                if rate not in tabs["global"]:
                    continue
                g50 = best(tabs["global"][rate], "tpot_p50_ms")
                g99 = best(tabs["global"][rate], "tpot_p99_ms")
                lin = tabs.get("linear", {}).get(rate, {}).get("eldr")
                rec = (f", ELDR p50 linear -> per-decoder {100 * (e['tpot_p50_ms'] / lin['tpot_p50_ms'] - 1):+.1f}%"
                       if lin else "")
                print(f"  rate {rate:g}: p50 {100 * (e['tpot_p50_ms'] / g50['tpot_p50_ms'] - 1):+.1f}% "
                      f"(vs {g50['policy']}), p99 {100 * (e['tpot_p99_ms'] / g99['tpot_p99_ms'] - 1):+.1f}% "
                      f"(vs {g99['policy']}){rec}")
    compact(groups)


def compact(groups):
    """One line per (configuration, placement): means over the three highest
    rates of the sweep (60, 80, 95 % of the estimated capacity)."""
    print("\n## compact: means over the 3 highest rates")
    print(f"{'configuration':44} {'placement':12} {'gain p50':>8} {'gain p99':>8} "
          f"{'rank eldr':>9} {'rank LB':>8}")
    for g in sorted(groups):
        for pl in ("linear", "global", "per-decoder"):
            if pl not in groups[g]:
                continue
            t = table(groups[g][pl])
            rates = sorted(t)[-3:]
            g50 = g99 = se = sb = 0.0
            for rate in rates:
                rs = t[rate]
                e, b50, b99 = rs["eldr"], best(rs, "tpot_p50_ms"), best(rs, "tpot_p99_ms")
                g50 += 100 * (e["tpot_p50_ms"] / b50["tpot_p50_ms"] - 1)
                g99 += 100 * (e["tpot_p99_ms"] / b99["tpot_p99_ms"] - 1)
                se += e["ep_busiest_share"]
                sb += b50["ep_busiest_share"]
            n = len(rates)
            print(f"{g:44} {pl:12} {g50 / n:+7.1f}% {g99 / n:+7.1f}% {se / n:9.3f} {sb / n:8.3f}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ep-study")
