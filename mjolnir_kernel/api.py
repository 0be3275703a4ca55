"""``decode()``: the decode kernel behind the arguments of ``mjolnir_numerics.emulate_decode``.

The backend follows the device: compute capability 10.x / 11.x runs the Thor (tcgen05) kernel, 9.0 the
Hopper kernel. Host steps, in order: check every input (ValueError naming the argument) -> the device's
target (``mjolnir_numerics.target_for``) -> the config (``config.default_config``, or the caller's) ->
the plan (``mjolnir_numerics.default_plan``, the emulator's default too, or the caller's) -> pack Q
(``mjolnir_numerics.pack_q``) -> compile (cached by config, arch and cutlass version) -> launch ->
unpack O.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

import torch

from .arch import arch_of_capability, decode_device_reason
from .config import can_implement, default_config, shape_mismatches
from .errors import DeviceError
from .host import check_decode_inputs, kernel_strides, launch_args

__all__ = ["decode", "prepare", "PreparedDecode", "DeviceError"]


class PreparedDecode:
    """A checked, planned and compiled decode call: ``launch()`` only launches (no host checks, no
    allocation, no copies), so it can be timed or captured in a CUDA graph; ``outputs()`` returns
    (o, lse) in vLLM shapes.

    Attributes:
        config: the ThorConfig / HopperConfig that was compiled.
        plan: the ``mjolnir_numerics.SplitPlan`` the launch walks (hand it to ``emulate_decode``).
    """

    def __init__(self, config, plan, compiled, args, tensors, out, num_seqs, q_len, heads_k):
        self.config = config
        self.plan = plan
        self._compiled = compiled
        self._args = args
        self._tensors = tensors  # the pointers in args stay valid while this object lives
        self._out = out
        self._shape = (num_seqs, q_len, heads_k)

    def launch(self) -> None:
        self._compiled(*self._args)

    def outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        from mjolnir_numerics.scales import unpack_o

        b, q_len, h_k = self._shape
        o = unpack_o(self._tensors["o"], b, q_len, h_k)
        if self._out is not None:
            if q_len > 1:
                self._out.copy_(o)
            o = self._out
        return o, self._tensors["lse"]


def prepare(
    q: torch.Tensor, cache, *, q_descale: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None,
    scale_o: float = 1.0, q_len: int = 1, causal: bool = True, plan=None, out: Optional[torch.Tensor] = None,
    config=None,
) -> PreparedDecode:  # fmt: skip
    """Check, plan, pack and compile one decode call (arguments as :func:`decode`); ``launch()`` runs it."""
    from mjolnir_numerics.formats import FORMATS
    from mjolnir_numerics.checks import ArgumentTypeError, check_choice
    from mjolnir_numerics.plan import PLAN_MODES, SplitPlan, default_plan
    from mjolnir_numerics.scales import pack_q
    from mjolnir_numerics.targets import target_for

    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.checks import check_bool, check_f32

    if not isinstance(cache, PagedKVCache):
        raise ArgumentTypeError(f"cache: expected a mjolnir_numerics PagedKVCache, got {type(cache).__name__}")
    problem = check_decode_inputs(
        q, cache.k_pool, cache.v_pool, cache.block_table, cache.seq_lens, cache.k_descale, cache.v_descale,
        kv_format=cache.fmt.name, q_len=q_len, q_descale=q_descale, k_scales=cache.k_scales, v_scales=cache.v_scales,
        out=out,
    )  # fmt: skip
    default_scale = 1.0 / math.sqrt(problem.head_dim)
    scale_qs = check_f32("softmax_scale", default_scale if softmax_scale is None else softmax_scale, True)
    scale_o = check_f32("scale_o", scale_o)
    check_bool("causal", causal)
    if q.dtype == torch.float8_e4m3fn:
        if q.numel() and bool(((q.view(torch.uint8) & 0x7F) == 0x7F).any()):
            raise ValueError("q: holds the e4m3 NaN code")
    elif not bool(torch.isfinite(q).all()):
        raise ValueError("q: holds inf or NaN")
    reason = decode_device_reason(q.device) if q.is_cuda else "q is on the CPU"
    if reason is not None:
        raise DeviceError(f"decode needs a tcgen05 GPU (10.x / 11.x) or a Hopper GPU (9.0): {reason}")
    target = target_for(q.device)
    expected = default_config(
        target, head_dim=problem.head_dim, page_size=problem.page_size, q_len=q_len, kv_format=problem.kv_format,
        q_dtype=problem.q_dtype, n_q=problem.n_q, causal=causal,
    )  # fmt: skip
    if config is None:
        cfg = expected
    else:
        bad = shape_mismatches(config, expected)
        if bad:
            raise ValueError("config: does not match the call: " + "; ".join(bad))
        can_implement(config)
        cfg = config
    seq_lens = cache.seq_lens.tolist()
    if plan is None or isinstance(plan, str):
        mode = check_choice("plan", plan or "occupancy", PLAN_MODES)
        plan = default_plan(
            seq_lens, problem.heads_k, problem.n_q, target=target, q_dtype=problem.q_dtype, head_dim=problem.head_dim,
            mode=mode,
        )  # fmt: skip
    if not isinstance(plan, SplitPlan):
        raise ArgumentTypeError(f"plan: expected a SplitPlan or one of {PLAN_MODES}, got {type(plan).__name__}")
    plan.check(seq_lens)
    chunks = max(plan.n_splits, default=1)
    if chunks > cfg.max_splits and config is None:
        cfg = replace(cfg, max_splits=chunks)  # a caller's plan with more chunks than the target's default
        can_implement(cfg)
    elif chunks > cfg.max_splits:
        raise ValueError(f"plan: splits a sequence into {chunks} chunks, config.max_splits is {cfg.max_splits}")
    if chunks == 1:
        cfg = replace(cfg, max_splits=1)  # no sequence is split: compile the reduction out

    device = q.device
    b, h_k, n_q, d = problem.num_seqs, problem.heads_k, problem.n_q, problem.head_dim
    q_desc = q_descale if q_descale is not None else torch.ones((), dtype=torch.float32, device=device)
    q4 = pack_q(q, b, q_len, h_k)
    if q_len > 1:
        q4 = q4.contiguous()
    if out is not None and q_len == 1:
        o4 = out.view(b, h_k, n_q, d)
    else:
        o4 = torch.empty(b, h_k, n_q, d, dtype=torch.bfloat16, device=device)
    # Partials need no initialization: the reduction reads only the slots a sequence used.
    o_part = torch.empty(cfg.max_splits, b, h_k, n_q, d, dtype=torch.float32, device=device)
    m_part = torch.empty(cfg.max_splits, b, h_k, n_q, dtype=torch.float32, device=device)
    bits = FORMATS[problem.kv_format].bits
    strides = kernel_strides(
        q4, o4, cache.k_pool, cache.v_pool, q_desc, cache.k_descale, cache.v_descale, bits, cache.k_scales,
        cache.v_scales,
    )  # fmt: skip
    dummy_scales = cache.k_pool.view(torch.uint8)  # formats without block scales: any valid pointer
    tensors = {
        "q": q4, "k": cache.k_pool, "v": cache.v_pool,
        "k_scales": dummy_scales if cache.k_scales is None else cache.k_scales,
        "v_scales": dummy_scales if cache.v_scales is None else cache.v_scales,
        "block_table": cache.block_table, "seq_lens": cache.seq_lens,
        "work": plan.work_tensor(device), "n_splits": plan.n_splits_tensor(device),
        "q_descale": q_desc, "k_descale": cache.k_descale, "v_descale": cache.v_descale,
        "o": o4, "lse": torch.empty(b, h_k, n_q, dtype=torch.float32, device=device),
        "o_part": o_part, "m_part": m_part, "l_part": torch.empty_like(m_part),
    }  # fmt: skip

    import cuda.bindings.driver as cuda

    from .compile import compile_decode

    arch = arch_of_capability(*torch.cuda.get_device_capability(device))
    compiled = compile_decode(cfg, arch, report=False).compiled
    stream = cuda.CUstream(torch.cuda.current_stream(device).cuda_stream)
    args = launch_args(cfg, problem, strides, max(1, plan.num_work), tensors, scale_qs, scale_o, stream)
    return PreparedDecode(cfg, plan, compiled, args, tensors, out, b, q_len, h_k)


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
    out: Optional[torch.Tensor] = None,
    config=None,
    return_plan: bool = False,
):
    """Paged decode attention on the GPU, with the arguments and return conventions of
    ``mjolnir_numerics.emulate_decode``: the Thor kernel on compute capability 10.x / 11.x, the Hopper
    kernel on 9.0.

    Args:
      q: (num_seqs * q_len, h_q, d) bfloat16, or float8_e4m3fn with ``q_descale``.
      cache: a ``mjolnir_numerics.PagedKVCache`` on the GPU (format, pools, block table, sequence
        lengths, K/V descales and NVFP4 block scales come from it; wrap a serving engine's own pools in
        one to decode them in place).
      q_descale: float32 (), (h_k,) or (num_seqs, h_k); required for e4m3 Q (``quantize_q``).
      softmax_scale: scale of q . k (default 1 / sqrt(d)); scale_o: output multiplier.
      q_len: query tokens per sequence; causal: with q_len > 1, query qi sees keys 0 .. L - q_len + qi.
      plan: a ``mjolnir_numerics.SplitPlan``; None: ``mjolnir_numerics.default_plan`` for this device's
        target, which ``emulate_decode`` makes too (so default arguments on both sides agree bit for bit);
        ``"batch_invariant"``: that function's batch-invariant mode (a sequence's bits do not depend on the
        rest of the batch; ``emulate_decode(plan="batch_invariant")`` makes the same plan).
        ``default_plan(..., pad_to=N)`` gives a fixed grid for CUDA graphs, ``chunked_plan`` fixed chunks.
      out: optional bfloat16 (num_seqs * q_len, h_q, d) destination (may live inside wider rows).
      config: a ``ThorConfig`` / ``HopperConfig`` to compile instead of the default (its shape fields must
        match the call; e.g. ``dataclasses.replace(prepare(q, cache).config, pdl=True)``).
      return_plan: also return the plan the call walked.

    Returns:
      (o, lse), or (o, lse, plan) with ``return_plan``: o bfloat16 (num_seqs * q_len, h_q, d); lse float32
      (num_seqs, h_k, q_len * h_r), natural log, packed rows n = qi * h_r + hr, -inf for an empty sequence
      (whose O is 0).

    Raises:
      ValueError: a bad argument (named), a problem the kernels cannot run, a config or plan that does
        not fit the call. DeviceError: the device runs neither kernel.
    """
    prepared = prepare(
        q, cache, q_descale=q_descale, softmax_scale=softmax_scale, scale_o=scale_o, q_len=q_len, causal=causal,
        plan=plan, out=out, config=config,
    )  # fmt: skip
    prepared.launch()
    o, lse = prepared.outputs()
    return (o, lse, prepared.plan) if return_plan else (o, lse)
