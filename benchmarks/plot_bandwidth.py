"""Draw ``bench_hopper_decode --csv`` output: the Hopper kernel's bandwidth per format and batch, as a
fraction of the read-only stream, beside the fastest bare read of the same bytes and the issue's targets.

One panel per head-dim shape (32/8 heads at d = 128, 24/4 at d = 256), one group of bars per batch, one
bar per KV format (the e4m3-Q rows without sweep tags: the default configuration). A black tick over a bar
marks the fastest bare read of that format's bytes (the ``read`` rows of ``--size-matched-stream``: what
any kernel reading them could reach, launch and ramp included); dashed lines mark the 90 % (e4m3) and
80 % (sub-byte formats) targets. Runs on any machine (matplotlib; the CSV comes from the GPU run):

    python -m benchmarks.bench_hopper_decode --back-to-back 20 --size-matched-stream --no-peers --iters 10 \\
        --csv hopper.csv                       # on the H200
    python -m benchmarks.plot_bandwidth hopper.csv --out reports/figures/hopper_bandwidth.png
"""

from __future__ import annotations

import argparse
import csv
import sys

FORMAT_ORDER = ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4")
TARGETS = ((90.0, "e4m3 target (90 %)"), (80.0, "sub-byte target (80 %)"))


def read_rows(path: str) -> list[dict]:
    """The CSV's rows as dicts. Raises ValueError naming the file if it is not ``bench_hopper_decode --csv``
    output."""
    from benchmarks.bench_hopper_decode import CSV_FIELDS

    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        optional = ("plan",)  # CSVs written before the --plans flag have no plan column
        missing = [c for c in CSV_FIELDS if c not in (reader.fieldnames or []) and c not in optional]
        if missing:
            raise ValueError(f"{path}: not bench_hopper_decode --csv output (missing columns {missing})")
        return list(reader)


def bars(rows: list[dict]) -> dict:
    """``{(heads_q, heads_k, head_dim): {batch: {format: (pct_stream, read_pct or None)}}}`` from the
    default-configuration Hopper rows (kind "mjolnir", e4m3 Q, a label without sweep tags) and the "read"
    rows of the same shape and format. Raises ValueError if there is no such Hopper row."""
    out: dict = {}
    reads = {}
    for r in rows:
        key = (int(r["heads_q"]), int(r["heads_k"]), int(r["head_dim"]))
        base = f"b{r['batch']} {r['heads_q']}/{r['heads_k']} d{r['head_dim']}"
        default_plan = r.get("plan", "") in ("", "occupancy")  # rows before --plans have no plan
        if r["kind"] == "read":
            reads[(key, int(r["batch"]), r["format"])] = float(r["pct_stream"])
        elif r["kind"] == "mjolnir" and r["q"] == "e4m3" and r["label"] == base and default_plan:
            out.setdefault(key, {}).setdefault(int(r["batch"]), {})[r["format"]] = float(r["pct_stream"])
    if not out:
        raise ValueError("no default-configuration Hopper rows with e4m3 Q (kind 'mjolnir', label without sweep tags)")
    return {
        key: {b: {f: (pct, reads.get((key, b, f))) for f, pct in fmts.items()} for b, fmts in sorted(by_b.items())}
        for key, by_b in sorted(out.items(), key=lambda kv: (kv[0][2], kv[0]))
    }


def plot(rows: list[dict], out_path: str, title: str = "") -> None:
    """Write the figure (PNG, or any format matplotlib infers from ``out_path``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = bars(rows)
    formats = [f for f in FORMAT_ORDER if any(f in fm for by_b in data.values() for fm in by_b.values())]
    fig, axes = plt.subplots(1, len(data), figsize=(6.5 * len(data), 4.2), squeeze=False, sharey=True)
    width = 0.8 / len(formats)
    for ax, ((h_q, h_k, d), by_b) in zip(axes[0], data.items()):
        for i, fmt in enumerate(formats):
            xs, ys, ticks = [], [], []
            for g, fm in enumerate(by_b.values()):
                if fmt in fm:
                    x = g + (i - (len(formats) - 1) / 2) * width
                    xs.append(x)
                    ys.append(fm[fmt][0])
                    if fm[fmt][1] is not None:
                        ticks.append((x, fm[fmt][1]))
            ax.bar(xs, ys, width * 0.92, label=fmt)
            for x, y in zip(xs, ys):
                ax.text(x, y + 0.8, f"{y:.0f}", ha="center", va="bottom", fontsize=7)
            for x, y in ticks:
                ax.plot([x - width * 0.45, x + width * 0.45], [y, y], color="black", lw=2.5)
        for y, label in TARGETS:
            ax.axhline(y, ls="--", lw=0.8, color="grey")
            ax.text(len(by_b) - 0.5, y + 1, label, ha="right", va="bottom", fontsize=7, color="grey")
        ax.set_xticks(range(len(by_b)), [f"batch {b}" for b in by_b])
        ax.set_title(f"{h_q}/{h_k} heads, d = {d}")
        ax.set_ylim(0, 125)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("KV bytes / time, % of the read-only stream")
    axes[0][-1].plot([], [], color="black", lw=2.5, label="fastest bare read of the same bytes")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=len(labels), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(out_path, dpi=130)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="bench_hopper_decode --csv output")
    ap.add_argument("--out", help="figure path (default: the CSV's path with .png)")
    ap.add_argument("--title", default="", help="figure title (e.g. the GPU and the command)")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.csv)
        out = args.out or args.csv.rsplit(".", 1)[0] + ".png"
        plot(rows, out, args.title)
    except (OSError, ValueError) as e:
        print(f"plot_bandwidth: {e}", file=sys.stderr)
        return 2
    print(f"plot_bandwidth: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
