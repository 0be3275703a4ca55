"""The emulator against an earlier commit's, side by side in one run, with its default (hardware) arithmetic.

    python -m benchmarks.bench_emulator_vs --baseline ff79b6d            # the issue's CPU shapes
    python -m benchmarks.bench_emulator_vs --baseline ff79b6d --quick    # small shapes (a smoke run)

    python -m benchmarks.bench_emulator_vs --baseline ff79b6d --quick --format nvfp4   # another KV format

Checks ``--baseline`` out into a temporary git worktree and times ``emulate_decode`` with default
arguments on the ``--target`` (default h200: its MMA, ex2 and log models) for each case, in two worker
processes per case, one importing the baseline and one the working tree, one after the other. Each worker
builds the same inputs (a paged cache, 24/4 heads, d = 256, page size 128, seeded: e4m3 random codes, or
``--format``'s quantization of random normal K and V per head), makes one small
untimed call (table loads, allocator warm-up) and reports its best of ``--repeat`` calls and a digest of
the O and LSE bits. Prints per case both times, their ratio, and whether the bits are identical; then the
floor a non-exact emulator would reach: torch's fp32 SDPA on the dequantized cache (same shapes). Exits 1
if any case's bits differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # name: (num_seqs, keys per sequence, Q path)
    "full": [(32, 4096, "bf16"), (32, 4096, "e4m3"), (1, 131072, "e4m3")],
    "quick": [(4, 1024, "bf16"), (4, 1024, "e4m3"), (1, 16384, "e4m3")],
}
HEADS_Q, HEADS_K, HEAD_DIM, PAGE_SIZE = 24, 4, 256, 128


def _inputs(num_seqs: int, seq_len: int, q_path: str, device: str, fmt: str = "e4m3"):
    import torch

    from benchmarks.bench_emulator import random_e4m3_cache
    from mjolnir_numerics import PagedKVCache
    from mjolnir_numerics.scales import quantize_q

    if fmt == "e4m3":
        cache = random_e4m3_cache(num_seqs, seq_len, HEADS_K, HEAD_DIM, PAGE_SIZE, device)
    else:  # public API only: the same builder in both trees
        gen = torch.Generator().manual_seed(2)
        k, v = (torch.randn(num_seqs, seq_len, HEADS_K, HEAD_DIM, generator=gen) for _ in range(2))
        cache = PagedKVCache.from_float(k, v, fmt, page_size=PAGE_SIZE, granularity="per_head", device=device)
    q = torch.randn(num_seqs, HEADS_Q, HEAD_DIM, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    kw = {}
    if q_path == "e4m3":
        q, kw["q_descale"] = quantize_q(q, num_seqs, 1, HEADS_K)
        kw["q_descale"] = kw["q_descale"].to(device)
    return q.to(device), cache, kw


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def worker(case: str, target: str, device: str, repeat: int, sdpa: bool) -> dict:
    """Runs in a subprocess whose ``sys.path`` starts at the tree being timed."""
    import torch

    from mjolnir_numerics import emulate_decode

    torch.set_num_threads(1)
    num_seqs, seq_len, q_path, fmt = json.loads(case)
    q, cache, kw = _inputs(num_seqs, seq_len, q_path, device, fmt)
    small_q, small_cache, small_kw = _inputs(1, 256, q_path, device, fmt)
    emulate_decode(small_q, small_cache, **small_kw, target=target)
    best, out = float("inf"), None
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        out = emulate_decode(q, cache, **kw, target=target)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    h = hashlib.sha256()
    h.update(out[0].contiguous().view(torch.int16).cpu().numpy().tobytes())
    h.update(out[1].contiguous().cpu().numpy().tobytes())
    row = {"seconds": best, "digest": h.hexdigest()[:16], "file": sys.modules["mjolnir_numerics"].__file__}
    if sdpa:
        row["sdpa_seconds"] = _sdpa_seconds(q, cache, kw, device, repeat)
    return row


def _sdpa_seconds(q, cache, kw, device: str, repeat: int) -> float:
    """torch's fp32 SDPA on the dequantized cache, per sequence (the emulator's floor without exactness)."""
    import torch.nn.functional as F

    qf = q.float()  # timing only: the descale does not change the work
    kv = [tuple(x.transpose(0, 1)[None] for x in cache.gather(s)) for s in range(cache.num_seqs)]  # (1, h_k, L, d)
    best = float("inf")
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        for s, (k, v) in enumerate(kv):
            F.scaled_dot_product_attention(qf[s : s + 1, :, None, :], k, v, enable_gqa=True)
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _run_worker(tree: Path, case, args, sdpa: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    # this file runs as a script, so ``benchmarks`` and ``mjolnir_numerics`` are imported from ``tree``
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(case),
           "--target", args.target, "--device", args.device, "--repeat", str(args.repeat)]  # fmt: skip
    if sdpa:
        cmd.append("--sdpa")
    # run outside both trees, so neither is found through the current directory
    res = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"worker in {tree} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    from mjolnir_numerics.capability import KV_FORMATS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="the commit to time against (any git revision)")
    ap.add_argument("--quick", action="store_true", help="small shapes")
    ap.add_argument("--target", default="h200", help="the emulator's target (its hardware models)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=2, help="timed calls per worker (best reported)")
    ap.add_argument(
        "--format", default="e4m3", choices=list(KV_FORMATS), help="the cache's KV format (one the kernels run)"
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--sdpa", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat: expected a positive number of calls, got {args.repeat}")
    if args.worker:
        print(json.dumps(worker(args.worker, args.target, args.device, args.repeat, args.sdpa)))
        return 0
    if not args.baseline:
        ap.error("--baseline: required (the commit to time against)")
    rev = subprocess.run(["git", "rev-parse", "--verify", args.baseline + "^{commit}"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    if rev.returncode != 0:
        ap.error(f"--baseline {args.baseline!r}: not a commit of {ROOT}")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), rev.stdout.strip()], cwd=ROOT,
                       check=True)  # fmt: skip
        try:
            return _compare(base, args)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)


def _compare(base: Path, args) -> int:
    print(f"# baseline {args.baseline} against the working tree {ROOT}; {args.format} KV, target {args.target}, "
          f"device {args.device}, torch threads 1, best of {args.repeat} calls per worker")  # fmt: skip
    print(f"{'case':<24}{'baseline s':>11}{'now s':>9}{'speedup':>9}{'sdpa fp32 s':>13}{'now/sdpa':>10}  bits")
    failed = False
    from mjolnir_numerics.capability import unsupported_reason

    # the cases the kernels run (the sub-byte formats: e4m3 Q only)
    cases = [(*case, args.format) for case in CASES["quick" if args.quick else "full"]]
    cases = [case for case in cases if unsupported_reason(args.format, case[2]) is None]
    for case in cases:
        old = _run_worker(base, case, args, sdpa=False)
        new = _run_worker(ROOT, case, args, sdpa=True)
        if case == cases[0]:
            print(f"# baseline imported from {old['file']}, now from {new['file']}")
        same = old["digest"] == new["digest"]
        failed |= not same
        name = f"b={case[0]} L={case[1]} {case[2]} Q"
        print(f"{name:<24}{old['seconds']:>11.2f}{new['seconds']:>9.2f}{old['seconds'] / new['seconds']:>8.2f}x"
              f"{new['sdpa_seconds']:>13.3f}{new['seconds'] / new['sdpa_seconds']:>9.0f}x  "
              f"{'identical' if same else 'DIFFER'}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
