"""Named semantic decode cases: one set shared by the spec tests and the kernel conformance tests.

Each case is a small frozen :class:`DecodeCase` that builds its inputs deterministically
(:meth:`DecodeCase.build`): the float Q/K/V in real units (for the exact reference), the kernel's
inputs (Q as the kernel takes it, its descale, the paged cache), and the launch options. Failures
should be reported by case name (``case.name``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from .cache import PagedKVCache
from .plan import SplitPlan, plan_split_kv
from .targets import THOR
from .scales import quantize_q

__all__ = ["DecodeCase", "CaseInputs", "CASES", "get_case"]


@dataclass(frozen=True)
class CaseInputs:
    """What a case builds.

    Attributes:
        q: the kernel's Q, bf16 or float8_e4m3fn ``(num_seqs * q_len, h_q, d)``; q_descale: fp32
            ``(num_seqs, h_k)`` or None (bf16 Q).
        q_float, k_float, v_float: real-unit float32 inputs (K/V as lists of ``(L_i, h_k, d)``).
        cache: the paged cache.
        q_len, causal, softmax_scale: launch options; plan: the split plan (None: the kernel's).
    """

    q: torch.Tensor
    q_descale: Optional[torch.Tensor]
    q_float: torch.Tensor
    k_float: list
    v_float: list
    cache: PagedKVCache
    q_len: int
    causal: bool
    softmax_scale: Optional[float]
    plan: Optional[SplitPlan]

    def emulator_kwargs(self) -> dict:
        """Keyword arguments of :func:`~mjolnir_numerics.emulator.emulate_decode` (after q, cache)."""
        return dict(
            q_descale=self.q_descale,
            softmax_scale=self.softmax_scale,
            q_len=self.q_len,
            causal=self.causal,
            plan=self.plan,
        )


PATTERNS = ("gaussian", "sink", "moving_max", "uniform", "heavy_tail", "outlier_channels")


@dataclass(frozen=True)
class DecodeCase:
    """A named decode case.

    Attributes:
        name: unique name.
        seq_lens: keys per sequence (new tokens included).
        heads_q, heads_k, head_dim: shapes.
        q_len, causal: query tokens per sequence and the causal tail.
        fmt: KV format; q_dtype: ``"bf16"`` or ``"e4m3"``.
        page_size, layout, granularity: of the cache (``granularity`` of the K/V descales).
        force_splits: > 0 forces that many chunks on the longest sequence; 0 uses the kernel's plan.
        pattern: how K/V/Q are drawn: ``"gaussian"``; ``"sink"`` (key 0 aligned with every query,
            logit ~ +12); ``"moving_max"`` (the largest logit sits in the second tile);
            ``"uniform"`` (K = 0: every logit 0); ``"heavy_tail"`` (K and V plus rare N(0, 100) spikes);
            ``"outlier_channels"`` (four key channels 20x the rest).
        seed: RNG seed.
        notes: what the case checks.
    """

    name: str
    seq_lens: tuple[int, ...]
    heads_q: int = 8
    heads_k: int = 2
    head_dim: int = 128
    q_len: int = 1
    causal: bool = True
    fmt: str = "e4m3"
    q_dtype: str = "e4m3"
    page_size: int = 16
    layout: str = "nhd"
    granularity: str = "per_head"
    force_splits: int = 0
    pattern: str = "gaussian"
    seed: int = 0
    notes: str = field(default="", compare=False)

    def build(self, device: str | torch.device = "cpu") -> CaseInputs:
        """Deterministic inputs on ``device`` (the same values on every device)."""
        gen = torch.Generator().manual_seed(self.seed)
        b, hk, d = len(self.seq_lens), self.heads_k, self.head_dim
        q = torch.randn(b * self.q_len, self.heads_q, d, generator=gen)
        ks = [torch.randn(L, hk, d, generator=gen) for L in self.seq_lens]
        vs = [torch.randn(L, hk, d, generator=gen) for L in self.seq_lens]
        if self.pattern == "sink":
            for i, L in enumerate(self.seq_lens):
                if L:
                    qdir = q.view(b, self.q_len, hk, -1, d)[i].mean(dim=(0, 2))  # (h_k, d)
                    ks[i][0] = qdir * (12.0 * math.sqrt(d) / (qdir * qdir).sum(-1, keepdim=True).clamp(min=1e-6))
                    vs[i][0] = 4.0
        elif self.pattern == "moving_max":
            for i, L in enumerate(self.seq_lens):
                if L > 128:
                    qdir = q.view(b, self.q_len, hk, -1, d)[i].mean(dim=(0, 2))
                    ks[i][min(L - 1, 200)] = qdir * 3.0
        elif self.pattern == "uniform":
            ks = [torch.zeros_like(x) for x in ks]
        elif self.pattern == "heavy_tail":  # N(0, 1) + N(0, 100) * Bernoulli(0.001), K and V
            for x in ks + vs:
                x += 10.0 * torch.randn(x.shape, generator=gen) * (torch.rand(x.shape, generator=gen) < 1e-3)
        elif self.pattern == "outlier_channels":  # four fixed key channels at 20x the others
            for x in ks:
                x[..., :4] *= 20.0
        elif self.pattern != "gaussian":
            raise ValueError(f"pattern: {self.pattern!r} is not one of {', '.join(PATTERNS)}")
        q = q.to(torch.bfloat16).float()  # the model's bf16 query
        cache = PagedKVCache.from_float(
            ks,
            vs,
            self.fmt,
            page_size=self.page_size,
            layout=self.layout,
            granularity=self.granularity,
            shuffle=True,
            poison=True,
            seed=self.seed,
            device=device,
        )
        if self.q_dtype == "e4m3":
            q_in, qd = quantize_q(q, b, self.q_len, hk)
            qd = qd.to(device)
        elif self.q_dtype == "bf16":
            q_in, qd = q.to(torch.bfloat16), None
        else:
            raise ValueError(f"q_dtype: {self.q_dtype!r} is not one of bf16, e4m3")
        plan = None
        if self.force_splits:
            rows = self.q_len * (self.heads_q // hk)
            plan = plan_split_kv(  # Thor's query tiles; as many splits as asked for
                list(self.seq_lens), hk, n_q_tiles=THOR.n_q_tiles(rows, self.q_dtype),
                max_splits=max(16, self.force_splits), force_splits=self.force_splits,
            )  # fmt: skip
        return CaseInputs(
            q=q_in.to(device),
            q_descale=qd,
            q_float=q.to(device),
            k_float=[x.to(device) for x in ks],
            v_float=[x.to(device) for x in vs],
            cache=cache,
            q_len=self.q_len,
            causal=self.causal,
            softmax_scale=None,
            plan=plan,
        )


CASES: tuple[DecodeCase, ...] = (
    DecodeCase("one_tile", (100,), notes="a single partial tile"),
    DecodeCase("two_tiles_moving_max", (256,), pattern="moving_max", notes="the max moves in tile 2: O rescaled"),
    DecodeCase("sink_token", (300,), pattern="sink", notes="one dominant key at position 0"),
    DecodeCase("empty_sequence", (0, 77), notes="seq_len 0: O = 0, LSE = -inf, no NaN"),
    DecodeCase("poisoned_pages", (33, 5), page_size=16, notes="unreferenced pages hold NaN; tails of last pages"),
    DecodeCase("varlen", (1, 17, 128, 129, 700), notes="ragged batch, page and tile edges"),
    DecodeCase("q_len4_causal", (9, 300), q_len=4, causal=True),
    DecodeCase("q_len4_noncausal", (9, 300), q_len=4, causal=False),
    DecodeCase("forced_splits", (1000, 300), force_splits=4, notes="split-KV merge through the reduction"),
    DecodeCase(
        "split_causal_tail", (129, 520), q_len=4, force_splits=5, notes="a chunk fully masked for early queries"
    ),
    DecodeCase("bf16_q", (300, 45), q_dtype="bf16", notes="the bf16-Q path: bf16 P"),
    DecodeCase("page_size_128", (300,), page_size=128),
    DecodeCase("layout_hnd", (200,), layout="hnd"),
    DecodeCase("per_seq_head_descale", (150, 60), granularity="per_seq_head"),
    DecodeCase("fp6_e3m2", (200,), fmt="e3m2"),
    DecodeCase("fp6_e2m3", (200,), fmt="e2m3"),
    DecodeCase("fp4_e2m1", (200,), fmt="e2m1"),
    DecodeCase("nvfp4", (200, 31), fmt="nvfp4", granularity="per_tensor"),
    DecodeCase("gqa_h_r_6_d256", (260,), heads_q=24, heads_k=4, head_dim=256),
    DecodeCase("uniform_logits", (200,), pattern="uniform", notes="every logit 0: p = 1 everywhere"),
)
"""The shared semantic cases."""


def get_case(name: str) -> DecodeCase:
    """A case by name; ValueError listing the names otherwise."""
    for c in CASES:
        if c.name == name:
            return c
    raise ValueError(f"name: unknown case {name!r}; known: {', '.join(c.name for c in CASES)}")
