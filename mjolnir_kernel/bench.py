"""Benchmark harness behind ``python -m mjolnir_kernel bench`` (library code; the CLI parses args)."""

from __future__ import annotations

from dataclasses import replace

import torch

from .config import ConfigError, can_implement, default_config


def _q_dtype(args) -> str:
    if args.q_dtype:
        return args.q_dtype
    return "bf16" if args.format == "e4m3" else "e4m3"


def bench_config(args, target):
    """The config the bench arguments select on ``target`` (a ``mjolnir_numerics.Target``): what ``decode()``
    compiles, with ``--pdl`` and, for the Thor kernel, ``--ctas-per-sm`` / ``--ring-stages``. Raises
    ConfigError (the tuning knobs on the Hopper kernel, or a config the kernel cannot implement)."""
    cfg = default_config(
        target, head_dim=args.head_dim, page_size=args.page_size, q_len=args.q_len, kv_format=args.format,
        q_dtype=_q_dtype(args), n_q=args.q_len * (args.heads_q // args.heads_k), causal=not args.non_causal,
        max_splits=args.max_splits, pdl=args.pdl,
    )  # fmt: skip
    knobs = {k: v for k, v in (("ctas_per_sm", args.ctas_per_sm), ("ring_stages", args.ring_stages)) if v}
    if knobs and target.backend != "thor":
        flags = ", ".join("--" + k.replace("_", "-") for k in knobs)
        raise ConfigError(f"{flags}: tuning knobs of the Thor kernel; the Hopper kernel derives them (HopperConfig)")
    cfg = replace(cfg, **knobs)
    can_implement(cfg)
    return cfg


def run_bench(args) -> int:
    """Build the problem, check the kernel against emulate_decode, time it; prints median us and GB/s."""
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.emulator import emulate_decode
    from mjolnir_numerics.plan import default_plan, plan_split_kv
    from mjolnir_numerics.scales import quantize_q
    from mjolnir_numerics.targets import target_for

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
    target = target_for(dev)
    cfg = bench_config(args, target)
    n_q = args.q_len * (args.heads_q // args.heads_k)
    if args.splits or args.pad_work_to:
        plan = plan_split_kv(
            lens, args.heads_k, n_q_tiles=target.n_q_tiles(n_q, q_dtype), sm_count=target.sm_count,
            ctas_per_sm=cfg.ctas_per_sm, max_splits=cfg.max_splits, force_splits=args.splits, pad_to=args.pad_work_to,
        )  # fmt: skip
    else:
        plan = default_plan(lens, args.heads_k, n_q, target=target, q_dtype=q_dtype, head_dim=args.head_dim)
    opts = dict(q_descale=q_descale, q_len=args.q_len, causal=not args.non_causal, plan=plan, config=cfg)
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
    launch = prepare(q, cache, **opts)  # timed: the launch alone
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
