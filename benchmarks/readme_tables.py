"""The README's two headline tables, rendered from the committed results (never typed by hand):

* accuracy: ``reports/study.csv``, written by ``mjolnir study --out reports``;
* speed: ``reports/hopper/hopper_bandwidth.csv``, written on the H200 by
  ``python -m benchmarks.bench_hopper_decode --back-to-back 20 --size-matched-stream --csv PATH``.

    python -m benchmarks.readme_tables      # prints them; tests/test_readme.py checks the README and the docs hold them
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY_CSV = ROOT / "reports" / "study.csv"
SPEED_CSV = ROOT / "reports" / "hopper" / "hopper_bandwidth.csv"
FORMATS = ("e4m3", "e3m2", "e2m3", "nvfp4", "e2m1")
SPEED_BATCH = 32


def accuracy_table(path: Path = STUDY_CSV) -> str:
    """Per KV format (e4m3 Q, per-KV-head descales): bits per value, the synthetic and SmolLM2-layer medians of
    O's relative L2 error, and end-to-end KL and top-1 agreement (``mjolnir_study.report.summary_table``)."""
    from mjolnir_study.report import summary_table
    from mjolnir_study.study import read_csv

    t = summary_table(read_csv(path)).set_index("fmt")
    lines = [
        "| KV format | bits | synthetic rel L2 of O | SmolLM2 layers rel L2 | end-to-end KL (nats/token) |"
        " top-1 agreement |",
        "|---|---|---|---|---|---|",
    ]
    for f in FORMATS:
        r = t.loc[f]
        cells = (f"{r.bits:g}", f"{r.syn_rel_l2:.3f}", f"{r.real_rel_l2:.3f}", f"{r.e2e_kl:.3f}")
        cells += (f"{100 * r.e2e_top1:.1f}%",)
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def speed_table(path: Path = SPEED_CSV, batch: int = SPEED_BATCH) -> str:
    """Per KV format at ``batch`` sequences of 32K keys, both head dims: the Hopper kernel's time per call
    back to back, its bandwidth as a fraction of the read-only stream, and its time against e4m3 KV with
    e4m3 Q; then FlashInfer's fp8 decode and bf16 SDPA where the run has them."""
    from benchmarks.plot_bandwidth import read_rows

    rows = [r for r in read_rows(str(path)) if int(r["batch"]) == batch]
    dims = sorted({int(r["head_dim"]) for r in rows})
    shapes = {int(r["head_dim"]): f"{r['heads_q']}/{r['heads_k']}" for r in rows}

    def find(kind, fmt, q, d):
        hits = [r for r in rows if r["kind"] == kind and r["format"] == fmt and r["q"] == q and int(r["head_dim"]) == d]
        return hits[0] if hits else None

    head = "| KV format | Q |" + "".join(f" d {d} ({shapes[d]} heads): us, % of stream, vs e4m3 |" for d in dims)
    lines = [head, "|---|---|" + "---|" * len(dims)]
    entries = [("mjolnir", "e4m3", "bf16")] + [("mjolnir", f, "e4m3") for f in FORMATS]
    entries += [("flashinfer", "e4m3", "fi"), ("sdpa", "bf16", "bf16")]
    for kind, fmt, q in entries:
        cells = []
        for d in dims:
            r, base = find(kind, fmt, q, d), find("mjolnir", "e4m3", "e4m3", d)
            if r is None:
                cells.append("-")
                continue
            us, pct = float(r["us"]), float(r["pct_stream"])
            cells.append(f"{us:.0f}, {pct:.0f} %, {us / float(base['us']):.2f}x")
        if all(c == "-" for c in cells):
            continue
        name = {"flashinfer": "FlashInfer 0.5.0 (e4m3 KV)", "sdpa": "torch SDPA (bf16 K/V)"}.get(kind, fmt)
        lines.append(f"| {name} | {'bf16' if kind != 'mjolnir' else q} |" + "".join(f" {c} |" for c in cells))
    return "\n".join(lines)


def bandwidth_table(path: Path = SPEED_CSV) -> str:
    """Every Hopper row of the run (docs/performance.md): shape, KV format, Q, time per call, bandwidth, % of
    the read-only stream, and where the run has them the same bytes read by ``torch.sum`` and by the fastest
    bare read, and the row's speed over that bare read's."""
    from benchmarks.plot_bandwidth import read_rows

    rows = read_rows(str(path))

    def key(r):
        return (r["batch"], r["heads_q"], r["heads_k"], r["head_dim"], r["format"])

    ref = {(r["kind"], key(r)): r for r in rows if r["kind"] in ("sum", "read")}
    lines = [
        "| shape | KV | Q | us | TB/s | % of stream | torch.sum, same bytes | fastest bare read, same bytes |"
        " kernel / bare read |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["kind"] != "mjolnir":
            continue
        s, b = ref.get(("sum", key(r))), ref.get(("read", key(r)))
        us = float(r["us"])
        cells = [r["label"], r["format"], r["q"], f"{us:.1f}", f"{float(r['tbps']):.2f}"]
        cells.append(f"{float(r['pct_stream']):.1f} %")
        cells.append("-" if s is None else f"{float(s['pct_stream']):.1f} %")
        cells.append("-" if b is None else f"{float(b['pct_stream']):.1f} % ({float(b['us']):.1f} us)")
        cells.append("-" if b is None else f"{float(b['us']) / us:.0%}".replace("%", " %"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    print(accuracy_table())
    print()
    print(speed_table())
    print()
    print(bandwidth_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
