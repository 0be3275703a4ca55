"""One Hopper decode shape, launched eagerly a few times: a target for Nsight Compute.

The docs' profile of the Hopper kernel (DRAM / L2 busy, issue rate, stall reasons) came from:

    ncu --target-processes all -k regex:Hopper --launch-skip 3 --launch-count 1 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section SchedulerStats \\
        python -m benchmarks.probes.profile_hopper_decode --format e2m1 --q-dtype e4m3 --batch 32

(stall reasons: ``--metrics smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio``).
``--kernel-times`` needs no Nsight: it times the launches with ``torch.profiler`` and prints each grid's
mean duration (the decode grid, and the reduction grid of split sequences); with ``--graph-calls N``
the launches are CUDA-graph replays of N calls each, as the bench times them. The call is the bench's:
``mjolnir_kernel.prepare`` with default arguments on a ``mjolnir_numerics.PagedKVCache`` over the bench's
pools (``benchmarks.bench_hopper_decode.build_pools``: L = 32768, page size 64, shuffled pages, 32/8
heads at d = 128 or 24/4 at d = 256).
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--format", default="e4m3", help="KV format (e4m3, e3m2, e2m3, e2m1, nvfp4)")
    ap.add_argument("--q-dtype", default="bf16", choices=("bf16", "e4m3"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seqlen", type=int, default=32768)
    ap.add_argument("--head-dim", type=int, default=128, choices=(128, 256))
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--kernel-times", action="store_true", help="print each grid's mean duration (torch.profiler)")
    ap.add_argument("--graph-calls", type=int, default=0, metavar="N",
                    help="launch through CUDA-graph replays of N calls each (0: eager launches)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.graph_calls < 0:
        ap.error(f"--graph-calls: expected N >= 0 (0: eager launches), got {args.graph_calls}")
    if args.launches < 1:
        ap.error(f"--launches: expected at least 1, got {args.launches}")
    if not torch.cuda.is_available():
        print("profile_hopper_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    from benchmarks.bench_hopper_decode import build_pools
    from mjolnir_kernel import prepare
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.formats import get_format
    from mjolnir_numerics.scales import quantize_q

    page_size = 64  # the bench's default
    h_q, h_k = (32, 8) if args.head_dim == 128 else (24, 4)
    gen = torch.Generator(device="cuda").manual_seed(0)
    k_pool, v_pool, bt, lens, kd, vd, scales, nbytes = build_pools(
        args.batch, args.seqlen, h_k, args.head_dim, args.format, page_size, gen, "nhd"
    )
    cache = PagedKVCache(
        get_format(args.format), page_size, "nhd", args.head_dim, k_pool, v_pool, scales.get("k_scales"),
        scales.get("v_scales"), bt, lens, kd, vd,
    )  # fmt: skip
    q = torch.randn(args.batch, h_q, args.head_dim, generator=gen, device="cuda").to(torch.bfloat16)
    q_descale = None
    if args.q_dtype == "e4m3":
        q, q_descale = quantize_q(q, args.batch, 1, h_k)
    stream = torch.cuda.Stream()  # a prepared call launches on the stream current when it was prepared
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        prep = prepare(q, cache, q_descale=q_descale)
        for _ in range(3):  # warm-up: the first launch loads the module
            prep.launch()
    torch.cuda.synchronize()
    launch = prep.launch
    if args.graph_calls:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(args.graph_calls):
                prep.launch()
        launch = graph.replay
    cuda = [torch.profiler.ProfilerActivity.CUDA]
    prof = torch.profiler.profile(activities=cuda) if args.kernel_times else contextlib.nullcontext()
    replays = -(-args.launches // max(1, args.graph_calls))
    with torch.cuda.stream(stream), prof:
        for _ in range(replays):
            launch()
        torch.cuda.synchronize()
    splits = max(prep.plan.n_splits, default=1)
    how = f"CUDA-graph replays of {args.graph_calls} calls" if args.graph_calls else "eager"
    launches = replays * max(1, args.graph_calls)
    print(
        f"profile_hopper_decode: {launches} launches of {prep.config.short_name()} (batch {args.batch},"
        f" L {args.seqlen}, {splits} chunks per sequence; {how}), {nbytes / 1e9:.3f} GB ({int(nbytes)} bytes) of KV"
    )
    if args.kernel_times:
        for name, (count, us) in kernel_times(prof).items():
            print(f"  {name}: {count} launches, mean {us:.1f} us")
    return 0


def kernel_times(prof) -> dict:
    """{grid: (launches, mean device microseconds)} of the decode and reduction grids in a profile."""
    out = {}
    for e in prof.key_averages():
        for grid in ("HopperDecodeKernel", "SplitReduction"):
            if grid in e.key and e.count:
                out[grid] = (e.count, e.device_time_total / e.count)
    return out


if __name__ == "__main__":
    sys.exit(main())
