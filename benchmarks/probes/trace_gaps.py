"""Probe (issue 24): where the GPU waits in one profiled ``emulate_decode`` call, from the Chrome trace that
``python -m benchmarks.probes.emulator_chain --profile ROW --trace FILE`` writes (any machine can read it).

Prints the GPU's busy fraction per time bucket (the union of its kernels and copies), the longest idle gaps with
the host operations running during each, the host's synchronisations and the CUDA graph calls (stream captures,
instantiations, replays), all in ms from the first event of the trace.

    python -m benchmarks.probes.trace_gaps TRACE.json.gz [--bucket-ms 2] [--gaps 8] [--spans 0,5.6,21.02]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def load(path: str) -> list:
    """The trace's complete events (``ph == "X"``)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def busy_intervals(gpu: list) -> list:
    """The union of the GPU events' ``[start, end)`` intervals (us), in order."""
    merged: list = []
    for e in sorted(gpu, key=lambda e: e["ts"]):
        s, f = e["ts"], e["ts"] + e["dur"]
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], f)
        else:
            merged.append([s, f])
    return merged


def bucket_fractions(busy: list, t0: float, end: float, width: float) -> list:
    """The busy fraction of each bucket of ``width`` us from ``t0`` to ``end`` (the last bucket over its own
    width), from the ordered, disjoint ``busy`` intervals."""
    n = max(1, math.ceil((end - t0) / width))
    edges = [t0 + i * width for i in range(n)] + [end]
    return [busy_time(busy, lo, hi) / (hi - lo) if hi > lo else 0.0 for lo, hi in zip(edges, edges[1:])]


def busy_time(busy: list, lo: float, hi: float) -> float:
    """The time in ``[lo, hi)`` (us) that the ordered, disjoint ``busy`` intervals cover."""
    return sum(max(0.0, min(f, hi) - max(s, lo)) for s, f in busy)


def idle_time(busy: list, lo: float, hi: float) -> float:
    """The time in ``[lo, hi)`` (us) that no ``busy`` interval covers."""
    return (hi - lo) - busy_time(busy, lo, hi)


def top_level(ops: list) -> list:
    """The host operations not nested in another one, in order."""
    out, end = [], float("-inf")
    for e in sorted(ops, key=lambda e: e["ts"]):
        if e["ts"] >= end:
            out.append(e)
            end = e["ts"] + e["dur"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a Chrome trace (.json or .json.gz) of one profiled call")
    ap.add_argument("--bucket-ms", type=float, default=2.0, help="width of the busy-fraction buckets (ms)")
    ap.add_argument("--gaps", type=int, default=8, help="how many of the longest idle gaps to list")
    ap.add_argument(
        "--spans", default=None, metavar="T1,T2,...",
        help="also the GPU's idle time between these times (ms from the first event; the last span ends at the GPU's "
        "last event)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    try:
        spans = [float(t) for t in args.spans.split(",")] if args.spans else []
    except ValueError:
        ap.error(f"--spans: expected comma-separated times in ms, got {args.spans!r}")
    if not all(0 <= t for t in spans) or not all(a < b for a, b in zip(spans, spans[1:])):  # (nan fails too)
        ap.error(f"--spans: expected increasing times >= 0 ms, got {args.spans!r}")
    if not 0.01 <= args.bucket_ms <= 1e6 or args.gaps < 0:  # (not nan: every comparison with it is False)
        ap.error(f"--bucket-ms must be in [0.01, 1e6] ms and --gaps >= 0, got {args.bucket_ms} and {args.gaps}")
    events = load(args.trace)
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        print(f"trace_gaps: {args.trace} holds no GPU event (was the call profiled on CUDA?)", file=sys.stderr)
        return 1
    t0 = min(e["ts"] for e in events)
    host = top_level([e for e in events if e.get("cat") == "cpu_op"])
    busy = busy_intervals(gpu)
    end = busy[-1][1]
    host_end = f"{(max(e['ts'] + e['dur'] for e in host) - t0) / 1e3:.1f} ms" if host else "- (no host operation)"
    print(f"GPU busy {sum(f - s for s, f in busy) / 1e3:.1f} ms of {(end - t0) / 1e3:.1f} ms "
          f"(first event to the GPU's last); host operations end at {host_end}")  # fmt: skip
    print(f"GPU busy per {args.bucket_ms:g} ms (%; the last bucket over its own width):", " ".join(
        f"{100 * x:.0f}" for x in bucket_fractions(busy, t0, end, args.bucket_ms * 1e3)))  # fmt: skip
    if spans:
        edges = [t0 + 1e3 * t for t in spans] + [end]
        idle = [
            f"{(lo - t0) / 1e3:.2f}-{(hi - t0) / 1e3:.2f} ms: {idle_time(busy, lo, hi) / 1e3:.2f}"
            for lo, hi in zip(edges, edges[1:])
            if hi > lo
        ]
        print("GPU idle (ms) in", "; ".join(idle))
    gaps = sorted(((busy[i][1], busy[i + 1][0] - busy[i][1]) for i in range(len(busy) - 1)), key=lambda g: -g[1])
    print(f"longest GPU idle gaps (of {len(gaps)}, {sum(g for _, g in gaps) / 1e3:.1f} ms in all):")
    for start, length in gaps[: args.gaps]:
        during = [e for e in host if e["ts"] < start + length and e["ts"] + e["dur"] > start]
        names = sorted({e["name"][:40] for e in during})[:4]
        print(f"  at {(start - t0) / 1e3:7.2f} ms: {length / 1e3:6.2f} ms, {len(during)} host ops ({', '.join(names)})")
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    syncs = [e for e in runtime if "Synchronize" in e["name"]]
    print(f"host synchronisations: {len(syncs)}", " ".join(f"{(e['ts'] - t0) / 1e3:.2f}" for e in syncs[:24]))
    for e in runtime:  # captures (cudaStreamBeginCapture .. EndCapture, instantiation) and replays
        if "Graph" in e["name"] or "Capture" in e["name"]:
            print(f"  {(e['ts'] - t0) / 1e3:7.2f} ms  {e['name']} ({e['dur']:.0f} us)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
