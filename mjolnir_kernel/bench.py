"""Benchmark harness behind ``python -m mjolnir_kernel bench`` (library code; the CLI parses args)."""

from __future__ import annotations

import math

import torch

from .api import select_config
from .config import DecodeConfig

# bench arguments that configure only the Hopper kernel (``--k-operand`` is ``args.k_operand``), passed to
# decode() when given
HOPPER_BENCH_OPTIONS = (
    "mma", "loads", "merge", "v_operand", "kv_convert", "k_operand", "v_convert", "schedule", "mma_layout",
)  # fmt: skip


def _ctas(args) -> int:
    """--ctas-per-sm (None: the Thor kernel's default, 2)."""
    return 2 if args.ctas_per_sm is None else args.ctas_per_sm


def _q_dtype(args) -> str:
    if args.q_dtype:
        return args.q_dtype
    return "bf16" if args.format == "e4m3" else "e4m3"


def bench_config(args) -> DecodeConfig:
    """The DecodeConfig the bench arguments select (the one ``decode()`` would compile)."""
    q_dtype = _q_dtype(args)
    n_q = args.q_len * (args.heads_q // args.heads_k)
    return select_config(
        head_dim=args.head_dim, n_q=n_q, page_size=args.page_size, q_len=args.q_len, kv_format=args.format,
        q_dtype=q_dtype, causal=not args.non_causal, max_splits=args.max_splits, ctas_per_sm=_ctas(args),
        ring_depth=args.ring_depth, pdl=args.pdl, l2_prefetch=args.l2_prefetch,
        evict_first=None if args.evict_first < 0 else bool(args.evict_first),
    )  # fmt: skip


def run_bench(args) -> int:
    """Build the problem, check the kernel against emulate_decode, time it; prints median us and GB/s."""
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.emulator import emulate_decode
    from mjolnir_numerics.plan import plan_split_kv
    from mjolnir_numerics.scales import quantize_q

    from .api import decode, prepare

    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(args.seed)
    q_dtype = _q_dtype(args)
    L = max(args.seqlen, args.q_len)
    if args.varlen:
        lens = torch.randint(args.q_len, L + 1, (args.batch,), generator=gen).tolist()
        lens[0] = L
    else:
        lens = [L] * args.batch
    k = [torch.randn(n, args.heads_k, args.head_dim, generator=gen) for n in lens]
    v = [torch.randn(n, args.heads_k, args.head_dim, generator=gen) for n in lens]
    cache = PagedKVCache.from_float(
        k, v, args.format, page_size=args.page_size, layout=args.layout, granularity=args.descale, seed=args.seed,
        device=dev,
    )  # fmt: skip
    rows = args.batch * args.q_len
    q = torch.randn(rows, args.heads_q, args.head_dim, generator=gen).to(torch.bfloat16)
    q_descale = None
    if q_dtype == "e4m3":
        q, q_descale = quantize_q(q, args.batch, args.q_len, args.heads_k)
        q_descale = q_descale.to(dev)
    if args.strided_qo:  # rows inside wider rows, like vLLM's fused-QKV view
        width = args.heads_q * args.head_dim + 2 * args.heads_k * args.head_dim
        buf = torch.zeros(rows, width, dtype=q.dtype)
        buf.view(torch.uint8 if q.dtype == torch.float8_e4m3fn else q.dtype)[:, : args.heads_q * args.head_dim] = (
            q.reshape(rows, -1).view(torch.uint8 if q.dtype == torch.float8_e4m3fn else q.dtype)
        )
        q = buf.to(dev)[:, : args.heads_q * args.head_dim].view(rows, args.heads_q, args.head_dim)
    else:
        q = q.to(dev)
    cfg = bench_config(args)
    n_q = args.q_len * (args.heads_q // args.heads_k)
    sm_count = torch.cuda.get_device_properties(dev).multi_processor_count
    plan = plan_split_kv(
        lens, args.heads_k, n_q_tiles=math.ceil(n_q / cfg.q_tile), sm_count=sm_count, ctas_per_sm=_ctas(args),
        max_splits=args.max_splits, force_splits=args.splits, pad_to=args.pad_work_to,
    )  # fmt: skip
    opts = dict(
        q_descale=q_descale, q_len=args.q_len, causal=not args.non_causal, plan=plan, ctas_per_sm=_ctas(args),
        ring_depth=args.ring_depth, max_splits=args.max_splits, pdl=args.pdl, l2_prefetch=args.l2_prefetch,
        evict_first=None if args.evict_first < 0 else bool(args.evict_first),
    )  # fmt: skip
    opts.update({name: getattr(args, name) for name in HOPPER_BENCH_OPTIONS if getattr(args, name) is not None})
    print(f"config {cfg.short_name()}  plan {plan}  seq_lens {lens[:8]}{' ...' if len(lens) > 8 else ''}")
    o, lse = decode(q, cache, **opts)
    torch.cuda.synchronize()
    if not args.skip_check:
        o_ref, lse_ref = emulate_decode(
            q.contiguous().cpu(),
            _cpu_cache(cache),
            q_descale=None if q_descale is None else q_descale.cpu(),
            q_len=args.q_len,
            causal=not args.non_causal,
            plan=plan,
        )
        from .conformance import compare_outputs

        report = compare_outputs(o.cpu(), lse.cpu(), o_ref, lse_ref)
        print(f"check vs emulate_decode: {report.summary()}")
        if not report.ok:
            print("bench: the kernel disagrees with the spec beyond the named tolerances")
            return 1
    flush = None if args.no_cold_l2 else torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device=dev)
    launch = prepare(q, cache, check_values=False, **opts)  # timed: the launch alone
    for _ in range(args.warmup):
        launch.launch()
    times = []
    for _ in range(args.iterations):
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch.launch()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    us = times[len(times) // 2]
    io = cache.kv_bytes() + q.numel() * q.element_size() + o.numel() * 2
    print(f"median {us:.2f} us, {io / (us * 1e-6) / 1e9:.3g} GB/s ({'hot' if flush is None else 'cold'} L2, {io} B)")
    return 0


def _cpu_cache(cache):
    """The same cache with every tensor on the CPU (the emulator runs anywhere)."""
    from dataclasses import fields, replace

    moved = {}
    for f in fields(cache):
        val = getattr(cache, f.name)
        if isinstance(val, torch.Tensor):
            moved[f.name] = val.cpu()
    return replace(cache, **moved)
