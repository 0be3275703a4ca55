"""A call's fixed cost and its marginal bandwidth, fitted from ``bench_hopper_decode --csv`` runs at several
sequence lengths: time per call = fixed + bytes / rate.

A decode call at batch 1 reads few bytes (67 MB at 32K keys), so a cost paid once per call (the grid's
start and end, the split's merge) weighs on its bandwidth, and the bandwidth alone does not say whether a
row is slow per byte or per call. With the same grid at every length (the plan cuts a batch-1 sequence
into the same number of chunks from 8K to 128K keys, so the chunks only grow), a straight line through
(bytes, time) separates the two: its intercept is the fixed cost, its slope the marginal rate. Every row
kind is fitted the same way, the ``read`` rows (the fastest bare read of the same bytes) included, so a
row's fixed cost can be set against a read's. Runs anywhere (the CSVs come from the GPU):

    for L in 8192 16384 32768 65536 131072; do
        python -m benchmarks.bench_hopper_decode --seqlen $L --formats e4m3 --batches 1 --back-to-back 20 \\
            --size-matched-stream --no-peers --iters 10 --csv b1_L$L.csv
    done
    python -m benchmarks.probes.fixed_cost b1_L*.csv
"""

from __future__ import annotations

import argparse
import sys

GROUP_KEYS = ("kind", "batch", "heads_q", "heads_k", "head_dim", "label", "format", "q")


def fit(points: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares line through ``(bytes, us)`` points: ``(fixed us, marginal TB/s, largest |residual| us)``.
    Raises ValueError with fewer than two distinct byte counts."""
    xs = [x for x, _ in points]
    if len(set(xs)) < 2:
        raise ValueError(f"fit: need at least two distinct byte counts, got {sorted(set(xs))}")
    n = len(points)
    mx = sum(xs) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx  # us per byte
    fixed = my - slope * mx
    worst = max(abs(y - (fixed + slope * x)) for x, y in points)
    return fixed, 1e-6 / slope if slope > 0 else float("inf"), worst  # bytes per us -> TB/s


def fits(rows: list[dict]) -> list[dict]:
    """One fit per row group (``GROUP_KEYS``) seen at two or more byte counts, in first-seen order:
    the group's keys plus ``sizes``, ``fixed_us``, ``marginal_tbps`` and ``worst_residual_us``."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in GROUP_KEYS), []).append((float(r["bytes"]), float(r["us"])))
    out = []
    for key, points in groups.items():
        if len({x for x, _ in points}) < 2:
            continue
        fixed, rate, worst = fit(points)
        out.append(dict(zip(GROUP_KEYS, key), sizes=len(points), fixed_us=fixed, marginal_tbps=rate,
                        worst_residual_us=worst))  # fmt: skip
    return out


def main(argv=None) -> int:
    from benchmarks.plot_bandwidth import read_rows

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="bench_hopper_decode --csv outputs (one per sequence length)")
    args = ap.parse_args(argv)
    try:
        rows = [r for path in args.csv for r in read_rows(path)]
    except (OSError, ValueError) as e:
        print(f"fixed_cost: {e}", file=sys.stderr)
        return 2
    result = fits(rows)
    if not result:
        print("fixed_cost: no row seen at two or more sizes (pass the CSVs of several --seqlen runs)", file=sys.stderr)
        return 2
    reads = {(f["batch"], f["heads_q"], f["heads_k"], f["head_dim"]): f for f in result if f["kind"] == "read"}
    print(f"{'row':<30} {'format':<6} {'Q':<5} {'sizes':>5} {'fixed us':>9} {'marginal TB/s':>14} {'resid us':>9}"
          f" {'vs read':>8}")  # fmt: skip
    for f in result:
        read = reads.get((f["batch"], f["heads_q"], f["heads_k"], f["head_dim"]))
        vs = f"{f['marginal_tbps'] / read['marginal_tbps']:.0%}" if read and f["kind"] != "read" else ""
        name = f"{f['label']} {f['kind']}" if f["kind"] != "mjolnir" else f["label"]
        print(f"{name:<30} {f['format']:<6} {f['q']:<5} {f['sizes']:>5} {f['fixed_us']:>9.1f}"
              f" {f['marginal_tbps']:>14.2f} {f['worst_residual_us']:>9.2f} {vs:>8}")  # fmt: skip
    print("# time per call = fixed + bytes / marginal rate (least squares over the sizes); 'vs read': the"
          " marginal rate over the fastest bare read's")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
