"""The helpers users import, at serving speed: quantize, pack, NVFP4 and the cache writer on the GPU, each
against the torch operation it replaces, side by side in one run.

Rows (``--n`` values, default 16M float32, standard normal times 4):

* ``quantize`` (every element format) against torch's e4m3 cast ``x.to(torch.float8_e4m3fn)``: goal <= 2x;
* ``pack`` of 16M codes, with and without its range check, against a copy of its output bytes: goal <= 2x
  (unchecked);
* ``nvfp4_quantize`` of the same values, checked and unchecked, against the cast: goal <= 3x (unchecked);
* the unchecked ``pack`` (4 and 6 bits) and ``nvfp4_quantize`` again as replays of a CUDA graph, against a
  graph of the copy / the cast: the same goals, with the host's launch time taken out of both sides (eager
  calls back to back are bound by the host where the kernel is shorter than its launch);
* ``PagedKVCache.write`` of one decode step (32 and 256 tokens x 8 KV heads x d 128, ``check=False``) inside
  a CUDA graph, against a graph of torch's cast and ``index_put_`` of the same K and V rows: goal <= 2x;
* a prefill write (32K tokens x 8 heads x d 128, bfloat16 K and V; ``check=False`` back to back, as the layers
  of a prefill write one after another, then one call alone and one checked call): its input bytes over its
  time, against a read-only stream (``torch.sum`` of a 4 GiB tensor) timed in the same run: goal >= 50 %
  (back to back).

Times are medians over ``--iters`` timings of ``--inner`` back-to-back calls (CUDA events). Every fast row
is first checked bit for bit against the CPU reference on a slice of its input.

    python -m benchmarks.bench_helpers                 # on a GPU; --csv FILE for the rows
    python -m benchmarks.bench_helpers --n 1048576 --iters 3

``MJOLNIR_KERNELS=0`` measures the compiled formulas instead of the helper kernels (the header says which
path ran, and says so where the kernels are launched without apache-tvm-ffi). Exits 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from functools import partial

import torch

from mjolnir_numerics import PagedKVCache, nvfp4_quantize, pack, quantize

QUANTIZE_GOAL, PACK_GOAL, NVFP4_GOAL, WRITE_GOAL, PREFILL_GOAL = 2.0, 2.0, 3.0, 2.0, 0.5
PREFILL_INNER = 5  # back-to-back prefill writes per timing (each 128 MiB of input)
FORMATS = ("e4m3", "e3m2", "e2m3", "e2m1", "nvfp4")


def _time_us(fn, iters: int, inner: int) -> float:
    """Median over ``iters`` of the time per call of ``inner`` back-to-back calls, in microseconds."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(1e3 * start.elapsed_time(end) / inner)
    return statistics.median(times)


def _graph(fn):
    """``fn`` captured in a CUDA graph (after a warm-up call outside it); returns the graph's replay."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def _cache(fmt: str, seqs: int, tokens: int, device) -> PagedKVCache:
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(seqs, tokens, 8, 128, generator=gen) * 3
    v = torch.randn(seqs, tokens, 8, 128, generator=gen)
    return PagedKVCache.from_float(k, v, fmt, page_size=16, granularity="per_head", spare_pages=4096, device=device)


def _free_slots(cache: PagedKVCache, n: int) -> torch.Tensor:
    """``n`` slots on pages no sequence references (page by page)."""
    used = set(cache.block_table.reshape(-1).tolist())
    free = torch.tensor([p for p in range(cache.num_pages) if p not in used][: -(-n // cache.page_size)])
    slots = (free[:, None] * cache.page_size + torch.arange(cache.page_size)[None, :]).reshape(-1)[:n]
    if slots.numel() < n:
        raise ValueError(f"the cache has room for {slots.numel()} new tokens, not {n}")
    return slots


def _elementwise_rows(n: int, iters: int, inner: int) -> list[dict]:
    x = (torch.randn(n, generator=torch.Generator().manual_seed(0)) * 4).cuda()
    cast_us = _time_us(partial(x.to, torch.float8_e4m3fn), iters, inner)
    out = [dict(row="torch cast e4m3", us=cast_us, ref="-", ratio=1.0, goal="-")]
    for fmt in FORMATS[:4]:
        assert torch.equal(quantize(x[: 1 << 20], fmt).cpu(), quantize(x[: 1 << 20].cpu(), fmt)), fmt
        us = _time_us(partial(quantize, x, fmt), iters, inner)
        out.append(dict(row=f"quantize {fmt}", us=us, ref="cast", ratio=us / cast_us, goal=f"<= {QUANTIZE_GOAL:g}x"))
    for bits, fmt in ((8, "e4m3"), (6, "e2m3"), (4, "e2m1")):
        codes = quantize(x, fmt).reshape(-1, 128)
        packed = pack(codes, bits)
        assert torch.equal(packed[:4096].cpu(), pack(codes[:4096].cpu(), bits)), bits
        copy_us = _time_us(packed.clone, iters, inner)
        for check in (True, False):
            us = _time_us(partial(pack, codes, bits, check=check), iters, inner)
            goal = f"<= {PACK_GOAL:g}x" if not check else "-"
            name = f"pack {bits}-bit" + ("" if check else ", check=False")
            out.append(dict(row=name, us=us, ref=f"copy {copy_us:.1f} us", ratio=us / copy_us, goal=goal))
        if bits != 8:  # the serving loop's call in a graph, against a graph of the copy: the GPU's share
            copy_graph_us = _time_us(_graph(packed.clone), iters, inner)
            us = _time_us(_graph(partial(pack, codes, bits, check=False)), iters, inner)
            name, ref = f"pack {bits}-bit, check=False, graph", f"copy graph {copy_graph_us:.1f} us"
            out.append(dict(row=name, us=us, ref=ref, ratio=us / copy_graph_us, goal=f"<= {PACK_GOAL:g}x"))
    xr = x.reshape(-1, 128)
    t_gpu, t_cpu = nvfp4_quantize(xr[:8192]), nvfp4_quantize(xr[:8192].cpu())
    assert torch.equal(t_gpu.codes.cpu(), t_cpu.codes) and torch.equal(t_gpu.scales.cpu(), t_cpu.scales)
    for check in (True, False):
        us = _time_us(partial(nvfp4_quantize, xr, check=check), iters, inner)
        goal = f"<= {NVFP4_GOAL:g}x" if not check else "-"
        name = "nvfp4_quantize" + ("" if check else ", check=False")
        out.append(dict(row=name, us=us, ref="cast", ratio=us / cast_us, goal=goal))
    cast_graph_us = _time_us(_graph(partial(x.to, torch.float8_e4m3fn)), iters, inner)
    us = _time_us(_graph(partial(nvfp4_quantize, xr, check=False)), iters, inner)
    ref = f"cast graph {cast_graph_us:.1f} us"
    out.append(dict(row="nvfp4_quantize, check=False, graph", us=us, ref=ref, ratio=us / cast_graph_us,
                    goal=f"<= {NVFP4_GOAL:g}x"))  # fmt: skip
    return out


def _cast_and_put(pools, rows, page, off):
    for pool, x in zip(pools, rows):
        pool[page, off] = x.to(torch.float8_e4m3fn)


def _decode_rows(tokens: int, iters: int, inner: int) -> list[dict]:
    gen = torch.Generator().manual_seed(tokens)
    k = (torch.randn(tokens, 8, 128, generator=gen) * 3).cuda()
    v = torch.randn(tokens, 8, 128, generator=gen).cuda()
    pools = [torch.zeros(4096, 16, 8, 128, dtype=torch.float8_e4m3fn, device="cuda") for _ in range(2)]
    slots = torch.randperm(4096 * 16, generator=gen)[:tokens].cuda()
    ref_us = _time_us(_graph(partial(_cast_and_put, pools, (k, v), slots // 16, slots % 16)), iters, inner)
    out = [dict(row=f"cast + index_put_, {tokens} tokens", us=ref_us, ref="-", ratio=1.0, goal="-")]
    for fmt in FORMATS:
        cache = _cache(fmt, 4, 64, "cuda")
        write = partial(cache.write, k, v, _free_slots(cache, tokens).cuda(), check=False)
        us = _time_us(_graph(write), iters, inner)
        name = f"write {fmt}, {tokens} tokens, graph"
        out.append(dict(row=name, us=us, ref="cast + index_put_", ratio=us / ref_us, goal=f"<= {WRITE_GOAL:g}x"))
    return out


def _prefill_rows(iters: int, inner: int) -> list[dict]:
    big = torch.empty(1 << 29, dtype=torch.int64, device="cuda")  # 4 GiB
    big.random_(0, 1 << 20)
    stream_us = _time_us(big.sum, iters, 1)
    stream = big.numel() * 8 / stream_us / 1e6  # TB/s
    del big
    out = [dict(row="read stream (torch.sum, 4 GiB)", us=stream_us, ref="-", ratio=1.0, goal=f"{stream:.2f} TB/s")]
    n_tok = 32768
    gen = torch.Generator().manual_seed(1)
    k = (torch.randn(n_tok, 8, 128, generator=gen) * 3).to(torch.bfloat16).cuda()
    v = torch.randn(n_tok, 8, 128, generator=gen).to(torch.bfloat16).cuda()
    in_bytes = 2 * k.numel() * k.element_size()
    for fmt in FORMATS:
        cache = PagedKVCache.from_float(
            k[:16].float()[None], v[:16].float()[None], fmt, page_size=16, granularity="per_head",
            spare_pages=n_tok // 16 + 1, device="cuda",
        )  # fmt: skip
        slots = _free_slots(cache, n_tok).cuda()
        want = PagedKVCache.from_float(
            k[:16].float()[None].cpu(), v[:16].float()[None].cpu(), fmt, page_size=16, granularity="per_head",
            spare_pages=n_tok // 16 + 1,
        )  # fmt: skip
        want.write(k[:2048].cpu(), v[:2048].cpu(), slots[:2048].cpu(), check=False)
        cache.write(k[:2048], v[:2048], slots[:2048], check=False)
        assert all(
            torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8)) for a, b in zip(cache.storage, want.storage)
        )
        timings = (
            (False, inner, f"prefill write {fmt}, 32K tokens, check=False", f">= {PREFILL_GOAL:.0%} of stream"),
            (False, 1, f"prefill write {fmt}, 32K tokens, check=False, 1 call", "-"),
            (True, 1, f"prefill write {fmt}, 32K tokens, checked, 1 call", "-"),
        )
        for check, calls, name, goal in timings:
            us = _time_us(partial(cache.write, k, v, slots, check=check), iters, calls)
            tbs = in_bytes / us / 1e6
            out.append(dict(row=name, us=us, ref=f"{tbs:.2f} TB/s", ratio=tbs / stream, goal=goal))
    return out


def rows(n: int, iters: int, inner: int):
    """Every row of the table (see the module docstring), in order, as each group is measured."""
    yield from _elementwise_rows(n, iters, inner)
    yield from _decode_rows(32, iters, inner)
    yield from _decode_rows(256, iters, inner)
    yield from _prefill_rows(iters, min(inner, PREFILL_INNER))


def _meets(r: dict) -> bool:
    goal = r["goal"]
    if goal.startswith("<="):
        return r["ratio"] <= float(goal.split()[1].rstrip("x"))
    if goal.startswith(">="):
        return r["ratio"] >= float(goal.split()[1].rstrip("%")) / 100
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1 << 24, help="values for the quantize / pack / NVFP4 rows (16M)")
    parser.add_argument("--iters", type=int, default=20, help="timings per row; the median is reported")
    parser.add_argument("--inner", type=int, default=20, help="back-to-back calls per timing")
    parser.add_argument("--csv", help="also write the rows to this CSV file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "bench_helpers: needs a CUDA GPU (the fast paths are CUDA's; the CPU runs the reference)", file=sys.stderr
        )
        return 2
    from mjolnir_numerics import fused

    kernels = fused.helper_kernels("cuda")
    path = "helper kernels (mjolnir_kernel.helpers)" if kernels else "compiled formulas"
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; quantize / pack / NVFP4 path: {path}")
    if kernels and not kernels._tvm_ffi():
        print(
            "launches: the CuTe DSL's Python calling path (apache-tvm-ffi, which the kernel extra pins, is not "
            "importable): eager rows then pay 10-75 us more host time per call than with the kernel extra installed "
            "(the H100 runs of 2026-12-06)"
        )
    print(f"{'row':52s} {'us':>9s}  {'against':>22s} {'ratio':>7s}  goal", flush=True)
    failed, table = 0, []
    for r in rows(args.n, args.iters, args.inner):
        table.append(r)
        ok = _meets(r)
        failed += not ok
        ratio = f"{r['ratio']:.0%}" if r["goal"].startswith(">=") else f"{r['ratio']:.2f}"
        print(
            f"{r['row']:52s} {r['us']:9.1f}  {r['ref']:>22s} {ratio:>7s}  {r['goal']}{'' if ok else '  MISSED'}",
            flush=True,
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["row", "us", "ref", "ratio", "goal", "met"])
            w.writeheader()
            for r in table:
                w.writerow({**r, "met": _meets(r)})
    print(f"{failed} goal(s) missed" if failed else "every goal met")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
