"""``decode()``: the decode kernel behind the same arguments as ``mjolnir_numerics.emulate_decode``.

The backend follows the device: compute capability 10.x / 11.x runs the Thor (tcgen05) kernel, 9.0 the
Hopper kernel (``mjolnir_kernel.hopper``). Host steps, in order: check every input (ValueError naming
the argument) -> pick the config (DecodeConfig or HopperConfig) -> plan the split
(mjolnir_numerics.plan_split_kv) -> pack Q (mjolnir_numerics.pack_q) -> compile
(cached by config, arch and cutlass version) -> launch -> unpack O.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import torch

from .arch import arch_of_capability, backend_of_capability, decode_device_reason
from .config import KV_FORMAT_BITS, DecodeConfig, can_implement, query_tile_for
from .host import check_decode_inputs, kernel_strides, launch_args

DEFAULT_SM_COUNT = 20  # Jetson AGX Thor


class DeviceError(RuntimeError):
    """The current device runs neither decode kernel (tcgen05 on 10.x / 11.x, Hopper on 9.0)."""


HOPPER_MAX_SPLITS = 32  # H200: 132 SMs want more chunks per sequence at small batch than Thor's 20
THOR_ONLY_OPTIONS = {"l2_prefetch": 0}  # knobs the Hopper kernel lacks
HOPPER_ONLY_OPTIONS = {  # not on Thor
    "mma": None, "q_rows": None, "loads": None, "prefetch": None, "merge": None, "v_operand": None,
    "kv_convert": None, "k_operand": None, "v_convert": None, "schedule": None, "mma_layout": None,
}  # fmt: skip
HOPPER_DEFAULT_MMA = "sync"  # HopperConfig.mma when decode() is not given one


def select_hopper_config(
    *,
    head_dim: int,
    page_size: int,
    q_len: int,
    kv_format: str,
    q_dtype: str,
    causal: bool = True,
    max_splits: int = 16,
    ring_depth: int = 0,
    pdl: bool = False,
    mma: Optional[str] = None,
    n_q: Optional[int] = None,
    q_rows: Optional[int] = None,
    ctas_per_sm: Optional[int] = None,
    loads: Optional[str] = None,
    prefetch: Optional[int] = None,
    evict_first: Optional[bool] = None,
    merge: Optional[str] = None,
    v_operand: Optional[str] = None,
    kv_convert: Optional[str] = None,
    k_operand: Optional[str] = None,
    v_convert: Optional[str] = None,
    schedule: Optional[str] = None,
    mma_layout: Optional[str] = None,
):
    """The HopperConfig ``decode()`` compiles on a compute capability 9.0 GPU (ints, strs and bools as in
    ``HopperConfig``; ``ring_depth`` is its ``stages``, 0 = default; ``causal`` only matters for q_len > 1;
    ``mma`` None = :data:`HOPPER_DEFAULT_MMA`; ``n_q`` = q_len * h_r query rows per KV head, when known:
    at most 8 selects ``q_rows=8`` on the mma.sync path; ``q_rows`` 8 or 16 overrides that choice;
    ``ctas_per_sm`` None = what shared memory and the register budget allow, else ``HopperConfig.ctas``;
    ``loads``, ``prefetch``, ``evict_first``, ``merge``, ``v_operand``, ``kv_convert``, ``k_operand``,
    ``v_convert``, ``schedule``, ``mma_layout`` None = the ``HopperConfig`` defaults, else those fields).
    Raises ConfigError (a ValueError) naming every field the Hopper kernel cannot implement, and ValueError
    for ``q_rows=8`` with more than 8 query rows."""
    from .hopper.config import HopperConfig, can_implement_hopper

    cfg = HopperConfig(
        head_dim=head_dim, page_size=page_size, q_len=q_len, kv_format=kv_format, q_dtype=q_dtype,
        causal=bool(causal) if q_len > 1 else True, max_splits=max_splits, stages=ring_depth, pdl=pdl,
        mma=HOPPER_DEFAULT_MMA if mma is None else mma,
    )  # fmt: skip
    if q_rows is None:
        q_rows = 8 if n_q is not None and n_q <= 8 and cfg.mma == "sync" else cfg.q_rows
    elif q_rows == 8 and n_q is not None and n_q > 8:
        raise ValueError(f"q_rows: 8 covers at most 8 query rows per KV head; this problem has n_q = {n_q}")
    given = dict(loads=loads, prefetch=prefetch, evict_first=evict_first, merge=merge, v_operand=v_operand,
                 kv_convert=kv_convert, k_operand=k_operand, v_convert=v_convert, schedule=schedule,
                 mma_layout=mma_layout)  # fmt: skip
    cfg = replace(cfg, q_rows=q_rows, ctas=ctas_per_sm or 0, **{k: v for k, v in given.items() if v is not None})
    can_implement_hopper(cfg)
    return cfg


def select_config(
    *,
    head_dim: int,
    n_q: int,
    page_size: int,
    q_len: int,
    kv_format: str,
    q_dtype: str,
    causal: bool = True,
    max_splits: int = 16,
    ctas_per_sm: int = 2,
    ring_depth: int = 0,
    pdl: bool = False,
    l2_prefetch: int = 0,
    evict_first: Optional[bool] = None,
) -> DecodeConfig:
    """The config ``decode()`` compiles for a problem. ``evict_first`` None = on for e4m3 Q (measured
    faster there), off for bf16 Q (costs 4-18 % at 32K-256K keys)."""
    cfg = DecodeConfig(
        head_dim=head_dim,
        q_tile=query_tile_for(n_q, q_dtype),
        page_size=page_size,
        q_len=q_len,
        kv_format=kv_format,
        q_dtype=q_dtype,
        ctas_per_sm=ctas_per_sm,
        ring_depth=ring_depth,
        max_splits=max_splits,
        causal=bool(causal) if q_len > 1 else True,
        pdl=pdl,
        l2_prefetch=l2_prefetch,
        evict_first=(q_dtype == "e4m3") if evict_first is None else bool(evict_first),
    )
    can_implement(cfg)
    return cfg


class PreparedDecode:
    """A checked, planned and compiled decode call: ``launch()`` only launches (no host checks, no
    allocation, no copies), so it can be timed or captured in a CUDA graph; ``outputs()`` returns
    (o, lse) in vLLM shapes."""

    def __init__(self, config, compiled, args, o4, lse, out, num_seqs, q_len, heads_k):
        self.config = config
        self._compiled = compiled
        self._args = args
        self._o4 = o4
        self._lse = lse
        self._out = out
        self._shape = (num_seqs, q_len, heads_k)

    def launch(self) -> None:
        self._compiled(*self._args)

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        from mjolnir_numerics.scales import unpack_o

        b, q_len, h_k = self._shape
        o = unpack_o(self._o4, b, q_len, h_k)
        if self._out is not None:
            if q_len > 1:
                self._out.copy_(o)
            o = self._out
        return o, self._lse


def prepare_decode(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    k_descale: torch.Tensor,
    v_descale: torch.Tensor,
    *,
    kv_format: str = "e4m3",
    q_len: int = 1,
    q_descale: Optional[torch.Tensor] = None,
    k_scales: Optional[torch.Tensor] = None,
    v_scales: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    scale_o: float = 1.0,
    causal: bool = True,
    plan=None,
    chunk_tiles: Optional[int] = None,
    max_splits: Optional[int] = None,
    force_splits: int = 0,
    pad_to: int = 0,
    sm_count: Optional[int] = None,
    ctas_per_sm: Optional[int] = None,
    ring_depth: int = 0,
    pdl: bool = False,
    l2_prefetch: int = 0,
    evict_first: Optional[bool] = None,
    mma: Optional[str] = None,
    q_rows: Optional[int] = None,
    loads: Optional[str] = None,
    prefetch: Optional[int] = None,
    merge: Optional[str] = None,
    v_operand: Optional[str] = None,
    kv_convert: Optional[str] = None,
    k_operand: Optional[str] = None,
    v_convert: Optional[str] = None,
    schedule: Optional[str] = None,
    mma_layout: Optional[str] = None,
    out: Optional[torch.Tensor] = None,
    check_values: bool = True,
) -> PreparedDecode:
    """Check, plan, pack and compile one decode call (arguments as :func:`decode_paged`)."""
    from mjolnir_numerics.plan import SplitPlan, chunked_plan, plan_split_kv
    from mjolnir_numerics.scales import pack_q

    problem = check_decode_inputs(
        q, k_pool, v_pool, block_table, seq_lens, k_descale, v_descale, kv_format=kv_format, q_len=q_len,
        q_descale=q_descale, k_scales=k_scales, v_scales=v_scales, out=out, check_values=check_values,
    )  # fmt: skip
    scale_qs = (1.0 / math.sqrt(problem.head_dim)) if softmax_scale is None else float(softmax_scale)
    if not (math.isfinite(scale_qs) and scale_qs > 0):
        raise ValueError(f"softmax_scale: expected a positive finite float, got {softmax_scale!r}")
    if isinstance(scale_o, bool) or not isinstance(scale_o, (int, float)) or not math.isfinite(scale_o):
        raise ValueError(f"scale_o: expected a finite float, got {scale_o!r}")
    if plan is not None and chunk_tiles is not None:
        raise ValueError("plan: pass either plan or chunk_tiles, not both")
    reason = decode_device_reason(q.device) if q.is_cuda else "q is on the CPU"
    if reason is not None:
        raise DeviceError(f"decode needs a tcgen05 GPU (10.x / 11.x) or a Hopper GPU (9.0): {reason}")
    backend = backend_of_capability(*torch.cuda.get_device_capability(q.device))
    if max_splits is None:
        max_splits = HOPPER_MAX_SPLITS if backend == "hopper" else 16
    if backend == "hopper":
        given = {"l2_prefetch": l2_prefetch}
        for name, value in given.items():
            if value != THOR_ONLY_OPTIONS[name]:
                raise ValueError(f"{name}: a Thor-kernel option; the Hopper kernel has no such knob (got {value!r})")
        cfg = select_hopper_config(
            head_dim=problem.head_dim, page_size=problem.page_size, q_len=q_len, kv_format=kv_format,
            q_dtype=problem.q_dtype, causal=causal, max_splits=max_splits, ring_depth=ring_depth, pdl=pdl, mma=mma,
            n_q=problem.n_q, q_rows=q_rows, ctas_per_sm=ctas_per_sm, loads=loads, prefetch=prefetch,
            evict_first=evict_first, merge=merge, v_operand=v_operand, kv_convert=kv_convert, k_operand=k_operand,
            v_convert=v_convert, schedule=schedule, mma_layout=mma_layout,
        )  # fmt: skip
        ctas_per_sm = cfg.ctas_per_sm
    else:
        hopper_given = {"mma": mma, "q_rows": q_rows, "loads": loads, "prefetch": prefetch, "merge": merge,
                        "v_operand": v_operand, "kv_convert": kv_convert, "k_operand": k_operand,
                        "v_convert": v_convert, "schedule": schedule, "mma_layout": mma_layout}  # fmt: skip
        for name, value in hopper_given.items():
            if value != HOPPER_ONLY_OPTIONS[name]:
                raise ValueError(f"{name}: a Hopper-kernel option; the Thor kernel has no such knob (got {value!r})")
        cfg = select_config(
            head_dim=problem.head_dim, n_q=problem.n_q, page_size=problem.page_size, q_len=q_len,
            kv_format=kv_format, q_dtype=problem.q_dtype, causal=causal, max_splits=max_splits,
            ctas_per_sm=2 if ctas_per_sm is None else ctas_per_sm, ring_depth=ring_depth, pdl=pdl,
            l2_prefetch=l2_prefetch, evict_first=evict_first,
        )  # fmt: skip
        ctas_per_sm = cfg.ctas_per_sm
    device = q.device
    b, h_k, n_q, d = problem.num_seqs, problem.heads_k, problem.n_q, problem.head_dim
    if chunk_tiles is not None:
        plan = chunked_plan(seq_lens.to("cpu"), chunk_tiles)
    if plan is None:
        if sm_count is None:
            sm_count = torch.cuda.get_device_properties(device).multi_processor_count
        # Thor: emulator.kernel_plan's tiling (ceil(n_q / 32) for n_q > 32, else 1); Hopper: 16-row tiles
        plan = plan_split_kv(
            seq_lens.tolist(), h_k, n_q_tiles=math.ceil(n_q / cfg.q_tile), sm_count=sm_count,
            ctas_per_sm=ctas_per_sm, max_splits=max_splits, force_splits=force_splits, pad_to=pad_to,
        )  # fmt: skip
    if not isinstance(plan, SplitPlan):
        raise ValueError(f"plan: expected a mjolnir_numerics SplitPlan, got {type(plan).__name__}")
    if check_values:
        plan.check(seq_lens.tolist())
    if max(plan.n_splits, default=1) > cfg.max_splits:
        raise ValueError(f"plan: splits a sequence into {max(plan.n_splits)} chunks, max_splits is {cfg.max_splits}")
    if max(plan.n_splits, default=1) == 1:
        cfg = replace(cfg, max_splits=1)  # no sequence is split: compile the reduction out

    q_desc = q_descale if q_descale is not None else torch.ones((), dtype=torch.float32, device=device)
    q4 = pack_q(q, b, q_len, h_k)
    if q_len > 1:
        q4 = q4.contiguous()
    if out is not None and q_len == 1:
        o4 = out.view(b, h_k, n_q, d)
    else:
        o4 = torch.empty(b, h_k, n_q, d, dtype=torch.bfloat16, device=device)
    lse = torch.empty(b, h_k, n_q, dtype=torch.float32, device=device)
    splits = cfg.max_splits
    # Workspace needs no initialization: the reduction reads only the slots a sequence used.
    o_part = torch.empty(splits, b, h_k, n_q, d, dtype=torch.float32, device=device)
    m_part = torch.empty(splits, b, h_k, n_q, dtype=torch.float32, device=device)
    l_part = torch.empty_like(m_part)
    # The fused merge's arrival counts: zero here, and every launch leaves them zero.
    n_counters = b * h_k * math.ceil(n_q / cfg.q_tile) if getattr(cfg, "fused_merge", False) else 1
    counters = torch.zeros(n_counters, dtype=torch.int32, device=device)
    bits = KV_FORMAT_BITS[kv_format]
    strides = kernel_strides(q4, o4, k_pool, v_pool, q_desc, k_descale, v_descale, bits, k_scales, v_scales)
    dummy_scales = k_pool.view(torch.uint8) if k_scales is None else None
    tensors = {
        "q": q4, "k": k_pool, "v": v_pool,
        "k_scales": k_scales if k_scales is not None else dummy_scales,
        "v_scales": v_scales if v_scales is not None else dummy_scales,
        "block_table": block_table, "seq_lens": seq_lens,
        "work": plan.work_tensor(device), "n_splits": plan.n_splits_tensor(device),
        "q_descale": q_desc, "k_descale": k_descale, "v_descale": v_descale,
        "o": o4, "lse": lse, "o_part": o_part, "m_part": m_part, "l_part": l_part, "split_counters": counters,
    }  # fmt: skip

    import cuda.bindings.driver as cuda

    from .compile import compile_decode

    arch = arch_of_capability(*torch.cuda.get_device_capability(device))
    compiled = compile_decode(cfg, arch, report=False).compiled
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    args = launch_args(cfg, problem, strides, max(1, plan.num_work), tensors, scale_qs, scale_o, stream)
    prepared = PreparedDecode(cfg, compiled, args, o4, lse, out, b, q_len, h_k)
    prepared._keep = tensors  # the pointers in args stay valid while this object lives
    return prepared


def decode_paged(q, k_pool, v_pool, block_table, seq_lens, k_descale, v_descale, **kwargs):
    """Paged decode attention on a tcgen05 GPU (Thor kernel) or a compute capability 9.0 GPU (Hopper kernel).

    Args:
      q: (num_seqs * q_len, h_q, d) bfloat16, or float8_e4m3fn with ``q_descale`` (quantize_q).
      k_pool, v_pool: (num_pages, PS, h_k, row) logical views of the cache (row contiguous):
        float8_e4m3fn with row = d, or uint8 byte views with row = d * bits / 8.
      block_table: int32 (num_seqs, max_blocks); seq_lens: int32 (num_seqs,), new tokens included.
      k_descale, v_descale (and q_descale): float32 (), (h_k,) or (num_seqs, h_k).
      kv_format: "e4m3", "e3m2", "e2m3", "e2m1" or "nvfp4" (with k_scales, v_scales: block scales
        (num_pages, PS, h_k, d / 16) float8_e4m3fn); q_len: query tokens per sequence.
      softmax_scale: scale of q . k (default 1 / sqrt(d)); scale_o: output multiplier; causal.
      plan: a mjolnir_numerics SplitPlan; or chunk_tiles: chunks of that many tiles (0: no split);
        default: plan_split_kv for this device (emulator.kernel_plan's tiling, this device's SMs).
      max_splits, force_splits, pad_to, sm_count: planning knobs when no plan is given.
      ctas_per_sm, ring_depth, pdl, l2_prefetch, evict_first: kernel config knobs (DecodeConfig; on
        Hopper ctas_per_sm is HopperConfig.ctas, ring_depth its stages, evict_first the KV loads' L2
        policy (None: HopperConfig's default, on), and l2_prefetch does not exist).
      mma: Hopper only: "sync" (mma.sync on widened values) or "wgmma" (fp8 warpgroup MMAs, e4m3 Q);
        None = HOPPER_DEFAULT_MMA. q_rows: Hopper only: 8 or 16 softmax rows per CTA (None: 8 when
        n_q <= 8 on the mma.sync path). loads: Hopper only: "cp_async" (None), "bulk" (e4m3 KV: one
        cp.async.bulk per key row, mbarrier completion) or "tma" (e4m3 KV: tensor-map boxes per page,
        hardware swizzle); ``HopperConfig.loads``. prefetch: Hopper only:
        the cp.async L2 prefetch-size hint, 0 (None), 64, 128 or 256 bytes. merge: Hopper only: "kernel"
        (None: a reduction grid after the decode grid) or "fused" (the last CTA of each split sequence
        merges its chunks in the decode grid); ``HopperConfig.merge``, bit-identical either way. v_operand:
        Hopper, mma="wgmma" only: "registers" (None), "smem" or "f16"; ``HopperConfig.v_operand``.
        kv_convert: Hopper only: how e2m1 / e3m2 / e2m3 codes become e4m3 tiles, "auto" (None), "exact" or
        "scaled" (bit placement with 2^k folded into Q and P: the same bits); ``HopperConfig.kv_convert``.
        k_operand: Hopper only, sub-byte KV: "tile" (None: K converted to an e4m3 tile in shared memory) or
        "registers" (each warp converts its keys' packed codes into its MMA fragments);
        ``HopperConfig.k_operand``. v_convert: Hopper only, K in registers: when V's tile is converted,
        "auto" (None), "early" or "late"; ``HopperConfig.v_convert``. schedule: Hopper only, K in
        registers: the tile loop's phase order, "auto" (None), "serial" or "overlap" (P.V of a tile with S
        of the next; the same bits); ``HopperConfig.schedule``. mma_layout: Hopper only, K in registers:
        "rows" (None) or "keys" (keys and head dims on the MMA's M, the query rows on N);
        ``HopperConfig.mma_layout``.
      out: optional bfloat16 (num_seqs * q_len, h_q, d) destination (may live inside wider rows).
      check_values: read seq_lens on the host to check the block table and plan (a device sync).

    Returns:
      (o, lse): o bfloat16 (num_seqs * q_len, h_q, d); lse float32 (num_seqs, h_k, q_len * h_r),
      natural log, packed rows n = qi * h_r + hr.
    """
    prepared = prepare_decode(q, k_pool, v_pool, block_table, seq_lens, k_descale, v_descale, **kwargs)
    prepared.launch()
    return prepared.outputs()


def decode(
    q: torch.Tensor,
    cache,
    *,
    q_descale: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    scale_o: float = 1.0,
    q_len: int = 1,
    causal: bool = True,
    plan=None,
    chunk_tiles: Optional[int] = None,
    **kernel_options,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel with the arguments and return conventions of ``mjolnir_numerics.emulate_decode``.

    Args:
      q: (num_seqs * q_len, h_q, d) bfloat16, or float8_e4m3fn with ``q_descale``.
      cache: a ``mjolnir_numerics.cache.PagedKVCache`` on the GPU (format, pools, block table,
        sequence lengths, K/V descales and NVFP4 scales come from it).
      q_descale, softmax_scale, scale_o, q_len, causal, plan, chunk_tiles: as ``emulate_decode``.
      kernel_options: ``decode_paged`` knobs (max_splits, force_splits, pad_to, sm_count, ctas_per_sm,
        ring_depth, pdl, l2_prefetch, evict_first, mma, q_rows, loads, prefetch, merge, v_operand,
        kv_convert, k_operand, v_convert, schedule, mma_layout, out, check_values).

    Returns:
      (o, lse): bfloat16 (num_seqs * q_len, h_q, d) and float32 (num_seqs, h_k, q_len * h_r), natural
      log, -inf for an empty sequence (whose O is 0).
    """
    return decode_paged(
        q, cache.k_pool, cache.v_pool, cache.block_table, cache.seq_lens, cache.k_descale, cache.v_descale,
        kv_format=cache.fmt.name, k_scales=cache.k_scales, v_scales=cache.v_scales, q_descale=q_descale,
        softmax_scale=softmax_scale, scale_o=scale_o, q_len=q_len, causal=causal, plan=plan, chunk_tiles=chunk_tiles,
        **kernel_options,
    )  # fmt: skip


def prepare(q: torch.Tensor, cache, **kwargs) -> PreparedDecode:
    """:func:`prepare_decode` on a PagedKVCache (arguments as :func:`decode`)."""
    return prepare_decode(
        q, cache.k_pool, cache.v_pool, cache.block_table, cache.seq_lens, cache.k_descale, cache.v_descale,
        kv_format=cache.fmt.name, k_scales=cache.k_scales, v_scales=cache.v_scales, **kwargs,
    )  # fmt: skip
