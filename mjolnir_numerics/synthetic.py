"""Synthetic decode inputs that look like real post-RoPE queries, keys and values.

Real K/V caches are not Gaussian; what makes them hard to quantize is known (see docs/data.md, "What
real K/V look like"). Each *kind* below models one of those properties, so the accuracy study can
measure every KV format against each of them separately:

=============  ==========================================================================================
kind           what it models
=============  ==========================================================================================
gaussian       i.i.d. N(0, 1) keys and values: the easy baseline.
outlier_keys   K has a few fixed outlier channels per kv head, 10-50x the median channel std; V has none.
rope_outliers  outliers sit in low-frequency RoPE pairs of the *pre*-RoPE keys; real RoPE then rotates
               them with position (``theta`` 1e4 or 5e5).
sinks          the first token(s) take 30-50% of the attention mass (a logit gap of ~5-10 over the rest).
heavy_tail     N(0, 1) + N(0, tail_std^2) * Bernoulli(tail_prob) in K and V (default 10^2, 1e-3).
peaked         long-context heads: a sink plus a few recent tokens take most of the mass.
=============  ==========================================================================================

Kinds are data: :data:`KINDS` maps a name to a :class:`KindSpec` that names the key and value
generators, whether queries are rotated by RoPE, which token groups get a planted attention mass,
and the default *knobs* (keyword arguments of :func:`make_kv`).

Conventions (shared with :mod:`mjolnir_numerics.scales` and the emulator):

* ``q`` is ``(num_seqs * q_len, heads_q, head_dim)``, row ``s * q_len + j`` is query ``j`` of sequence
  ``s``; keys/values are ``(num_seqs, L, heads_k, head_dim)`` (or a list of per-sequence
  ``(L_s, heads_k, head_dim)`` tensors when lengths differ).
* The ``q_len`` queries of a sequence are its *last* ``q_len`` tokens (positions ``L_s - q_len + j``),
  whose keys/values are already in the cache; query ``j`` attends causally to keys ``0 .. L_s - q_len + j``.
* GQA: query head ``h`` reads kv head ``h // (heads_q // heads_k)``.
* Logits are ``softmax_scale * q . k`` with ``softmax_scale = head_dim ** -0.5`` unless overridden.
* All tensors are float32. Random draws come from a CPU ``torch.Generator`` (float32 draws, widened), the
  construction runs in float64 and the result is rounded once to float32, so a seed gives the same data
  on every machine: another CPU's vector libm and BLAS move a float64 value by a few ulps, which changes
  its float32 rounding only within ~2^-29 (relative) of a rounding boundary. The construction in float32
  of earlier versions moved the ``sinks`` and ``peaked`` keys with the CPU (``docs/studies.md``). The
  result is moved to ``device`` at the end.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from .checks import ArgumentTypeError, check_float, check_int

__all__ = [
    "KINDS",
    "KindSpec",
    "SyntheticKV",
    "apply_rope",
    "attention_probs",
    "make_kv",
    "rope_inv_freq",
]

KV = torch.Tensor | list[torch.Tensor]

# Norm of the planted key component of a sink / recent token: sqrt(head_dim), the typical norm of a
# unit-variance key, so planted keys are not outliers in magnitude (the mass comes from the query).
_PLANT_KEY_NORM_PER_SQRT_D = 1.0


# --------------------------------------------------------------------------------------------------
# RoPE
# --------------------------------------------------------------------------------------------------
def rope_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """Angular frequency of each RoPE pair: ``theta ** (-2 i / head_dim)`` for ``i < head_dim / 2``.

    Returns float64 ``(head_dim // 2,)`` in radians per position. Pair ``i`` rotates slower as ``i``
    grows: the last pairs are the *low-frequency* ones.
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim={head_dim!r}: must be a positive even integer for RoPE")
    if not theta > 0:
        raise ValueError(f"theta={theta!r}: must be > 0 (typical: 1e4, 1e5, 5e5)")
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float, interleaved: bool) -> torch.Tensor:
    """Rotate each channel pair of ``x`` by ``position * theta ** (-2 i / head_dim)`` radians.

    Args:
        x: ``(..., T, H, D)`` float tensor (``D`` even): T tokens, H heads, head dim D.
        positions: token positions, integer or float, shape broadcastable to ``x.shape[:-2]``
            (typically ``(T,)``). Negative positions rotate backwards: ``apply_rope(apply_rope(x, p),
            -p)`` recovers ``x``.
        theta: RoPE base (1e4 Llama-2, 1e5 SmolLM2, 5e5 Llama-3).
        interleaved: pairs are ``(x[2i], x[2i+1])`` when True (llama.cpp / GGUF, GPT-J convention),
            ``(x[i], x[i + D/2])`` when False (Hugging Face "rotate_half" convention).

    Returns:
        Tensor like ``x`` (same shape, dtype, device). Pair ``(a, b)`` becomes
        ``(a cos - b sin, a sin + b cos)``. Angles are computed in float64, then cos/sin are cast to
        ``x.dtype``, so long positions do not lose phase accuracy.
    """
    if x.dim() < 3:
        raise ValueError(f"x.shape={tuple(x.shape)}: expected (..., T, H, D)")
    d = x.shape[-1]
    inv_freq = rope_inv_freq(d, theta).to(x.device)
    positions = torch.as_tensor(positions, device=x.device)
    angles = positions.to(torch.float64).unsqueeze(-1) * inv_freq  # (..., T, D/2)
    cos = angles.cos().to(x.dtype).unsqueeze(-2)  # (..., T, 1, D/2)
    sin = angles.sin().to(x.dtype).unsqueeze(-2)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _pair_channels(pairs: torch.Tensor, head_dim: int, interleaved: bool) -> torch.Tensor:
    """Channels ``(..., 2)`` of RoPE pair indices ``pairs`` under either pairing convention."""
    if interleaved:
        return torch.stack((2 * pairs, 2 * pairs + 1), dim=-1)
    return torch.stack((pairs, pairs + head_dim // 2), dim=-1)


# --------------------------------------------------------------------------------------------------
# Geometry of one call
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Geometry:
    """Shapes and positions of one :func:`make_kv` call (all tensors on CPU)."""

    num_seqs: int
    seq_lens: tuple[int, ...]
    q_len: int
    heads_q: int
    heads_k: int
    head_dim: int

    @property
    def l_max(self) -> int:
        return max(self.seq_lens)

    @property
    def group_size(self) -> int:
        return self.heads_q // self.heads_k

    def key_positions(self) -> torch.Tensor:
        """int64 ``(L_max,)``: key position ``0 .. L_max - 1`` (padding beyond ``L_s`` is masked)."""
        return torch.arange(self.l_max)

    def key_valid(self) -> torch.Tensor:
        """bool ``(num_seqs, L_max)``: key ``t`` exists in sequence ``s`` (``t < L_s``)."""
        return self.key_positions()[None, :] < torch.tensor(self.seq_lens)[:, None]

    def q_positions(self) -> torch.Tensor:
        """int64 ``(num_seqs, q_len)``: position ``L_s - q_len + j`` of query ``j``."""
        return torch.tensor(self.seq_lens)[:, None] - self.q_len + torch.arange(self.q_len)[None, :]

    def visible(self) -> torch.Tensor:
        """bool ``(num_seqs, q_len, L_max)``: query ``j`` of sequence ``s`` may attend key ``t``."""
        causal = self.key_positions()[None, None, :] <= self.q_positions()[:, :, None]
        return causal & self.key_valid()[:, None, :]

    def kv_shape(self) -> tuple[int, int, int, int]:
        return (self.num_seqs, self.l_max, self.heads_k, self.head_dim)


def _randn(gen: torch.Generator, shape: Sequence[int]) -> torch.Tensor:
    """float64 values of float32 standard normal draws (the float32 stream of earlier versions, widened)."""
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32).double()


def _uniform(gen: torch.Generator, shape: Sequence[int], lo: float, hi: float) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(tuple(shape), generator=gen, dtype=torch.float32).double()


def _choose(gen: torch.Generator, rows: int, n: int, k: int) -> torch.Tensor:
    """int64 ``(rows, k)``: ``k`` distinct indices in ``[0, n)`` per row, sorted."""
    return torch.rand((rows, n), generator=gen).argsort(dim=-1)[:, :k].sort(dim=-1).values


def _check_range(name: str, value: Any) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: expected a (low, high) pair of floats") from None
    if not 0 < lo <= hi:
        raise ValueError(f"{name}={value!r}: expected 0 < low <= high")
    return lo, hi


def _check_prob(name: str, value: float) -> float:
    if not 0 < value < 1:
        raise ValueError(f"{name}={value!r}: expected a probability in (0, 1)")
    return float(value)


def _check_count(name: str, value: int, low: int = 0, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}={value!r}: expected an integer {allowed}")
    return value


# --------------------------------------------------------------------------------------------------
# Key / value generators: (generator, geometry, knobs) -> (tensor (S, L_max, H_k, D), meta dict)
# --------------------------------------------------------------------------------------------------
def _gaussian(gen: torch.Generator, geo: _Geometry, knobs: Mapping[str, Any]) -> tuple[torch.Tensor, dict]:
    return _randn(gen, geo.kv_shape()), {}


def _heavy_tail(gen: torch.Generator, geo: _Geometry, knobs: Mapping[str, Any]) -> tuple[torch.Tensor, dict]:
    """N(0, 1) + N(0, tail_std^2) * Bernoulli(tail_prob), elementwise."""
    p = _check_prob("tail_prob", knobs["tail_prob"])
    tail_std = float(knobs["tail_std"])
    if not tail_std > 0:
        raise ValueError(f"tail_std={tail_std!r}: expected > 0")
    shape = geo.kv_shape()
    base, tail = _randn(gen, shape), _randn(gen, shape)
    hit = torch.rand(shape, generator=gen) < p
    valid = geo.key_valid()[:, :, None, None].expand(shape)
    frac = (hit & valid).sum().item() / max(int(valid.sum().item()), 1)
    return base + tail_std * tail * hit, {"tail_fraction": frac}


def _outlier_channel_keys(gen: torch.Generator, geo: _Geometry, knobs: Mapping[str, Any]) -> tuple[torch.Tensor, dict]:
    """Unit-variance keys with ``n_outliers`` fixed channels per kv head scaled by U(outlier_scale)."""
    n = _check_count("n_outliers", knobs["n_outliers"], 0, geo.head_dim // 2)
    lo, hi = _check_range("outlier_scale", knobs["outlier_scale"])
    k = _randn(gen, geo.kv_shape())
    channels = _choose(gen, geo.heads_k, geo.head_dim, n)  # (H_k, n)
    stds = _uniform(gen, (geo.heads_k, n), lo, hi)
    channel_std = torch.ones(geo.heads_k, geo.head_dim, dtype=torch.float64).scatter_(1, channels, stds)
    return k * channel_std, {"outlier_channels": channels, "outlier_stds": stds}


def _rope_outlier_keys(gen: torch.Generator, geo: _Geometry, knobs: Mapping[str, Any]) -> tuple[torch.Tensor, dict]:
    """Pre-RoPE keys with outliers in low-frequency pairs, rotated by real RoPE at positions 0..L-1."""
    half = geo.head_dim // 2
    low = knobs["low_freq_pairs"]
    low = max(1, half // 4) if low is None else _check_count("low_freq_pairs", low, 1, half)
    n = _check_count("n_outlier_pairs", knobs["n_outlier_pairs"], 0, low)
    lo, hi = _check_range("outlier_scale", knobs["outlier_scale"])
    k_pre = _randn(gen, geo.kv_shape())
    pairs = half - low + _choose(gen, geo.heads_k, low, n)  # (H_k, n): among the `low` slowest pairs
    stds = _uniform(gen, (geo.heads_k, n), lo, hi)
    channels = _pair_channels(pairs, geo.head_dim, knobs["interleaved"])  # (H_k, n, 2)
    channel_std = torch.ones(geo.heads_k, geo.head_dim, dtype=torch.float64).scatter_(
        1, channels.flatten(1), stds.repeat_interleave(2, dim=1)
    )
    k = apply_rope(k_pre * channel_std, geo.key_positions(), knobs["rope_theta"], knobs["interleaved"])
    return k, {"outlier_pairs": pairs, "outlier_channels": channels, "outlier_stds": stds}


# --------------------------------------------------------------------------------------------------
# Planted attention groups: (geometry, knobs) -> [(name, key mask (S, L_max) bool, target mass)]
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Group:
    name: str
    keys: torch.Tensor  # bool (num_seqs, L_max)
    mass: float


def _sink_group(geo: _Geometry, knobs: Mapping[str, Any]) -> list[_Group]:
    n = _check_count("n_sinks", knobs["n_sinks"], 1)
    mass = _check_prob("sink_mass", knobs["sink_mass"])
    keys = (geo.key_positions() < n)[None, :].expand(geo.num_seqs, -1) & geo.key_valid()
    return [_Group("sink", keys, mass)]


def _sink_and_recent_groups(geo: _Geometry, knobs: Mapping[str, Any]) -> list[_Group]:
    n = _check_count("n_recent", knobs["n_recent"], 1)
    if n < geo.q_len:
        raise ValueError(f"n_recent={n}: must be >= q_len={geo.q_len} so every query sees a recent token")
    mass = _check_prob("recent_mass", knobs["recent_mass"])
    lens = torch.tensor(geo.seq_lens)[:, None]
    keys = (geo.key_positions()[None, :] >= lens - n) & geo.key_valid()
    return _sink_group(geo, knobs) + [_Group("recent", keys, mass)]


# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------
KVGenerator = Callable[[torch.Generator, _Geometry, Mapping[str, Any]], tuple[torch.Tensor, dict]]

#: Knobs every kind accepts.
COMMON_KNOBS: Mapping[str, Any] = MappingProxyType(
    {
        # Std over keys of the (pre-planting) logits softmax_scale * q.k: the softmax temperature.
        # Each query row is rescaled so that, given the per-channel key variances, it holds exactly.
        "logit_std": 1.0,
        # None: head_dim ** -0.5.
        "softmax_scale": None,
    }
)


@dataclass(frozen=True)
class KindSpec:
    """One synthetic data kind.

    Attributes:
        name: registry key.
        summary: one line for tables and error messages.
        keys: generator of float32 ``(num_seqs, L_max, heads_k, head_dim)`` post-RoPE keys and meta.
        values: generator of values, same signature.
        rope_queries: rotate the queries by RoPE (knobs ``rope_theta``, ``interleaved``) at their
            positions, matching keys that were rotated the same way.
        groups: token groups whose attention mass is planted exactly (``None``: no planting).
        defaults: the kind's own knobs and their defaults (:data:`COMMON_KNOBS` are added).
    """

    name: str
    summary: str
    keys: KVGenerator
    values: KVGenerator
    rope_queries: bool = False
    groups: Callable[[_Geometry, Mapping[str, Any]], list[_Group]] | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def resolve(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``knobs``; unknown knob names raise ValueError."""
        allowed = {**COMMON_KNOBS, **self.defaults}
        unknown = sorted(set(knobs) - set(allowed))
        if unknown:
            raise ValueError(f"knobs {unknown} are not knobs of kind {self.name!r}; allowed: {sorted(allowed)}")
        return {**allowed, **knobs}


KINDS: Mapping[str, KindSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            KindSpec("gaussian", "i.i.d. N(0,1) K and V", _gaussian, _gaussian),
            KindSpec(
                "outlier_keys",
                "K has fixed outlier channels at 10-50x the median std; V has none",
                _outlier_channel_keys,
                _gaussian,
                defaults={"n_outliers": 4, "outlier_scale": (10.0, 50.0)},
            ),
            KindSpec(
                "rope_outliers",
                "outliers in low-frequency pairs of pre-RoPE K, then real RoPE by position",
                _rope_outlier_keys,
                _gaussian,
                rope_queries=True,
                defaults={
                    "n_outlier_pairs": 2,
                    "low_freq_pairs": None,  # None: the head_dim // 8 slowest pairs
                    "outlier_scale": (10.0, 50.0),
                    "rope_theta": 1e4,
                    "interleaved": True,
                },
            ),
            KindSpec(
                "sinks",
                "the first token(s) take sink_mass (default 40%) of every query's attention",
                _gaussian,
                _gaussian,
                groups=_sink_group,
                defaults={"n_sinks": 1, "sink_mass": 0.4},
            ),
            KindSpec(
                "heavy_tail",
                "K and V are N(0,1) + N(0,tail_std^2) * Bernoulli(tail_prob)",
                _heavy_tail,
                _heavy_tail,
                defaults={"tail_prob": 1e-3, "tail_std": 10.0},
            ),
            KindSpec(
                "peaked",
                "long-context head: a sink plus the n_recent last tokens take most of the mass",
                _gaussian,
                _gaussian,
                groups=_sink_and_recent_groups,
                defaults={"n_sinks": 1, "sink_mass": 0.3, "n_recent": 8, "recent_mass": 0.5},
            ),
        )
    }
)


# --------------------------------------------------------------------------------------------------
# Result
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SyntheticKV:
    """Decode inputs of one :func:`make_kv` call.

    Attributes:
        kind: the :data:`KINDS` name.
        q: float32 ``(num_seqs * q_len, heads_q, head_dim)`` post-RoPE queries, row ``s * q_len + j``.
        k: float32 post-RoPE keys: ``(num_seqs, L, heads_k, head_dim)`` when all sequences have length
            ``L``, else a list of ``num_seqs`` tensors ``(L_s, heads_k, head_dim)``.
        v: float32 values, laid out like ``k``.
        seq_lens: ``L_s`` per sequence.
        q_len: queries per sequence (the last ``q_len`` tokens of each sequence).
        softmax_scale: logit scale (``head_dim ** -0.5`` by default).
        knobs: the resolved knobs (defaults + overrides).
        meta: kind-specific facts, e.g. ``outlier_channels`` int64 ``(heads_k, n)``, ``tail_fraction``;
            for planted kinds ``groups[name]`` with ``keys`` bool ``(num_seqs, L_max)``, ``target_mass``,
            and the realized ``mass`` and ``logit_gap`` (mean group logit minus mean logit of the other
            visible keys) as float32 ``(num_seqs, q_len, heads_q)``. Always ``q_positions`` int64
            ``(num_seqs, q_len)``. Meta tensors live on CPU.
    """

    kind: str
    q: torch.Tensor
    k: KV
    v: KV
    seq_lens: tuple[int, ...]
    q_len: int
    softmax_scale: float
    knobs: Mapping[str, Any]
    meta: dict[str, Any]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)

    @property
    def heads_q(self) -> int:
        return self.q.shape[1]

    @property
    def heads_k(self) -> int:
        return self.k_list()[0].shape[1]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    def k_list(self) -> list[torch.Tensor]:
        """Keys as a list of per-sequence ``(L_s, heads_k, head_dim)`` tensors (views)."""
        return list(self.k.unbind(0)) if isinstance(self.k, torch.Tensor) else list(self.k)

    def v_list(self) -> list[torch.Tensor]:
        """Values as a list of per-sequence ``(L_s, heads_k, head_dim)`` tensors (views)."""
        return list(self.v.unbind(0)) if isinstance(self.v, torch.Tensor) else list(self.v)


# --------------------------------------------------------------------------------------------------
# Query construction and mass planting (all on CPU, float64)
# --------------------------------------------------------------------------------------------------
def _expand_kv_heads(x: torch.Tensor, geo: _Geometry) -> torch.Tensor:
    """``(..., heads_k, D)`` -> ``(..., heads_q, D)`` (query head h reads kv head h // group_size)."""
    return x.repeat_interleave(geo.group_size, dim=-2)


def _logits(q: torch.Tensor, k: torch.Tensor, geo: _Geometry, scale: float) -> torch.Tensor:
    """q ``(S, Tq, Hq, D)``, k ``(S, L, Hk, D)`` -> float32 ``(S, Tq, Hq, L)`` scaled logits."""
    return scale * torch.einsum("sjhd,slhd->sjhl", q, _expand_kv_heads(k, geo))


def _masked_logsumexp(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(~mask, -math.inf).logsumexp(dim=-1)


def _normalize_queries(q: torch.Tensor, k: torch.Tensor, geo: _Geometry, scale: float, logit_std: float):
    """Rescale each query row so ``std_t(scale * q . k_t) == logit_std`` under diagonal key variances.

    q ``(S, Tq, Hq, D)``; k ``(S, L, Hk, D)``. Key variances are per (sequence, kv head, channel) over
    the valid tokens.
    """
    if not logit_std > 0:
        raise ValueError(f"logit_std={logit_std!r}: expected > 0")
    w = geo.key_valid()[:, :, None, None].to(k.dtype)  # (S, L, 1, 1)
    n = w.sum(dim=1)
    mean = (k * w).sum(dim=1) / n
    var = (((k - mean[:, None]) * w) ** 2).sum(dim=1) / n  # (S, Hk, D)
    var = _expand_kv_heads(var, geo)[:, None]  # (S, 1, Hq, D)
    std = scale * (q.square() * var).sum(dim=-1, keepdim=True).sqrt()
    return q * (logit_std / std)


def _plant_groups(
    q: torch.Tensor,
    k: torch.Tensor,
    groups: list[_Group],
    gen: torch.Generator,
    geo: _Geometry,
    scale: float,
    logit_std: float,
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Give each group exactly its target share of every query's softmax mass.

    One orthonormal direction ``e_g`` per group and kv head is removed from all queries and keys;
    group keys then get ``beta * e_g`` and each query gets ``a_g * e_g`` with ``a_g`` solved in closed
    form, so the logits of group ``g`` shift by ``t_g = scale * a_g * beta`` and nothing else moves:
    ``t_g = log(m_g / m_rest) + logsumexp(rest logits) - logsumexp(group logits)``.
    """
    total = sum(g.mass for g in groups)
    if not total < 1:
        raise ValueError(f"planted masses {[(g.name, g.mass) for g in groups]} sum to {total}; must be < 1")
    member = torch.stack([g.keys for g in groups])  # (G, S, L)
    if (member.sum(dim=0) > 1).any():
        raise ValueError(f"seq_lens={geo.seq_lens}: too short, planted groups {[g.name for g in groups]} overlap")
    n_groups = len(groups)
    if n_groups >= geo.head_dim:
        raise ValueError(f"head_dim={geo.head_dim}: must exceed the number of planted groups ({n_groups})")
    basis = torch.linalg.qr(_randn(gen, (geo.heads_k, geo.head_dim, n_groups))).Q  # (Hk, D, G) orthonormal
    basis_q = basis.repeat_interleave(geo.group_size, dim=0)  # (Hq, D, G): query head h uses kv head h // group

    k = k - torch.einsum("slhd,hdg,heg->slhe", k, basis, basis)
    q = q - torch.einsum("sjhd,hdg,heg->sjhe", q, basis_q, basis_q)
    q = _normalize_queries(q, k, geo, scale, logit_std)

    beta = _PLANT_KEY_NORM_PER_SQRT_D * math.sqrt(geo.head_dim)
    visible = geo.visible()  # (S, Tq, L)
    x = _logits(q, k, geo, scale)  # (S, Tq, Hq, L), before planting
    k = k + beta * torch.einsum("gsl,hdg->slhd", member.to(k.dtype), basis)
    rest = visible & ~member.any(dim=0)[:, None, :]
    if not rest.any(dim=-1).all():
        raise ValueError(f"seq_lens={geo.seq_lens}: some query sees no token outside the planted groups")
    log_rest = _masked_logsumexp(x, rest[:, :, None, :])  # (S, Tq, Hq)
    rest_mass = 1.0 - total
    for g, group in enumerate(groups):
        seen = visible & group.keys[:, None, :]
        if not seen.any(dim=-1).all():
            raise ValueError(f"seq_lens={geo.seq_lens}: some query sees no {group.name!r} token")
        shift = math.log(group.mass / rest_mass) + log_rest - _masked_logsumexp(x, seen[:, :, None, :])
        q = q + (shift / (scale * beta))[..., None] * basis_q[:, :, g]

    logits = _logits(q, k, geo, scale).masked_fill(~visible[:, :, None, :], -math.inf)
    probs = logits.softmax(dim=-1)
    mean_rest = logits.masked_fill(~rest[:, :, None, :], 0).sum(-1) / rest.sum(-1)[:, :, None]
    info = {}
    for group in groups:
        seen = (visible & group.keys[:, None, :])[:, :, None, :]
        mean_group = logits.masked_fill(~seen, 0).sum(-1) / seen.sum(-1)
        info[group.name] = {
            "keys": group.keys,
            "target_mass": group.mass,
            "mass": probs.masked_fill(~seen, 0).sum(-1),
            "logit_gap": mean_group - mean_rest,
        }
    return q, k, {"groups": info, "plant_directions": basis}


# --------------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------------
def _check_seq_lens(seq_len: int | Sequence[int], num_seqs: int, q_len: int) -> tuple[tuple[int, ...], bool]:
    ragged = not isinstance(seq_len, int)
    if ragged and not isinstance(seq_len, (list, tuple)):
        raise ArgumentTypeError(f"seq_len: expected an int or a list of ints, got {type(seq_len).__name__} {seq_len!r}")
    lens = tuple(seq_len) if ragged else (seq_len,) * num_seqs
    if ragged and len(lens) != num_seqs:
        raise ValueError(f"seq_len has {len(lens)} entries; expected num_seqs={num_seqs}")
    for n in lens:
        if isinstance(n, bool) or not isinstance(n, int) or n < q_len:
            raise ValueError(f"seq_len={seq_len!r}: every length must be an integer >= q_len={q_len}")
    return lens, ragged


def make_kv(
    kind: str,
    num_seqs: int,
    seq_len: int | Sequence[int],
    heads_q: int,
    heads_k: int,
    head_dim: int,
    q_len: int = 1,
    *,
    seed: int = 0,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    **knobs: Any,
) -> SyntheticKV:
    """Synthetic post-RoPE decode inputs of one :data:`KINDS` kind.

    Args:
        kind: a key of :data:`KINDS` (``gaussian``, ``outlier_keys``, ``rope_outliers``, ``sinks``,
            ``heavy_tail``, ``peaked``).
        num_seqs: number of sequences (batch).
        seq_len: KV length ``L`` of every sequence, or one length per sequence (then ``k``/``v`` are
            lists). Each length must be ``>= q_len``; it includes the ``q_len`` query tokens.
        heads_q, heads_k: query and kv heads; ``heads_q`` must be a multiple of ``heads_k`` (GQA).
        head_dim: ``D``, even.
        q_len: queries per sequence (1 for plain decode, 2-8 for speculative decoding).
        seed: seed of a fresh CPU ``torch.Generator`` (ignored when ``generator`` is given).
        generator: a CPU ``torch.Generator`` to draw from (advanced in place).
        device: where the returned tensors live (default CPU); data are identical on every device.
        **knobs: kind parameters; see ``KINDS[kind].defaults`` and :data:`COMMON_KNOBS`.

    Returns:
        :class:`SyntheticKV` with float32 ``q (num_seqs * q_len, heads_q, head_dim)`` and ``k``, ``v``
        ``(num_seqs, L, heads_k, head_dim)`` (lists of ``(L_s, heads_k, head_dim)`` if ragged).

    Raises:
        ValueError: naming the offending argument or knob.
    """
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: unknown; allowed: {sorted(KINDS)}")
    spec = KINDS[kind]
    resolved = spec.resolve(knobs)
    _check_count("num_seqs", num_seqs, 1)
    _check_count("q_len", q_len, 1)
    _check_count("heads_k", heads_k, 1)
    _check_count("heads_q", heads_q, 1)
    if heads_q % heads_k:
        raise ValueError(f"heads_q={heads_q}: must be a multiple of heads_k={heads_k}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim={head_dim!r}: expected an even integer >= 2")
    lens, ragged = _check_seq_lens(seq_len, num_seqs, q_len)
    if generator is None:
        generator = torch.Generator().manual_seed(check_int("seed", seed))
    elif not isinstance(generator, torch.Generator):
        raise ArgumentTypeError(f"generator: expected a torch.Generator or None, got {type(generator).__name__}")
    elif generator.device.type != "cpu":
        raise ValueError(f"generator.device={generator.device}: expected a CPU generator")
    scale = resolved["softmax_scale"]
    scale = head_dim**-0.5 if scale is None else check_float("softmax_scale", scale)
    if not scale > 0:
        raise ValueError(f"softmax_scale={resolved['softmax_scale']!r}: expected a finite number > 0, or None")

    geo = _Geometry(num_seqs, lens, q_len, heads_q, heads_k, head_dim)
    k, meta = spec.keys(generator, geo, resolved)
    v, v_meta = spec.values(generator, geo, resolved)
    meta.update({f"v_{name}": value for name, value in v_meta.items()})
    q = _randn(generator, (num_seqs, q_len, heads_q, head_dim))
    if spec.rope_queries:
        q = apply_rope(q, geo.q_positions(), resolved["rope_theta"], resolved["interleaved"])
    if spec.groups is None:
        q = _normalize_queries(q, k, geo, scale, float(resolved["logit_std"]))
    else:
        q, k, planted = _plant_groups(
            q, k, spec.groups(geo, resolved), generator, geo, scale, float(resolved["logit_std"])
        )
        meta.update(planted)
    k = k * geo.key_valid()[:, :, None, None]  # padding beyond L_s is never read; keep it zero
    v = v * geo.key_valid()[:, :, None, None]
    meta["q_positions"] = geo.q_positions()

    q, k, v = q.float(), k.float(), v.float()  # the one rounding of the float64 construction
    meta = _as_float32(meta)
    device = torch.device("cpu") if device is None else torch.device(device)
    q = q.reshape(num_seqs * q_len, heads_q, head_dim).to(device)
    if ragged:
        k_out: KV = [k[s, :n].to(device) for s, n in enumerate(lens)]
        v_out: KV = [v[s, :n].to(device) for s, n in enumerate(lens)]
    else:
        k_out, v_out = k.to(device), v.to(device)
    return SyntheticKV(kind, q, k_out, v_out, lens, q_len, scale, MappingProxyType(resolved), meta)


def _as_float32(value):
    """``value`` with every float64 tensor in it (nested dicts too) rounded to float32."""
    if isinstance(value, dict):
        return {name: _as_float32(v) for name, v in value.items()}
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.float()
    return value


def attention_probs(data: SyntheticKV) -> list[torch.Tensor]:
    """Exact float32 causal softmax of ``data``: one ``(q_len, heads_q, L_s)`` tensor per sequence.

    Entry ``[j, h, t]`` is the weight query ``j`` (position ``L_s - q_len + j``) of head ``h`` puts on
    key ``t``; keys after the query's position get 0. Useful to check where the mass goes.
    """
    out = []
    q = data.q.view(data.num_seqs, data.q_len, data.heads_q, data.head_dim)
    group = data.heads_q // data.heads_k
    for s, k in enumerate(data.k_list()):
        n = k.shape[0]
        logits = data.softmax_scale * torch.einsum("jhd,lhd->jhl", q[s], k.repeat_interleave(group, dim=1))
        causal = torch.arange(n, device=k.device)[None, :] <= (n - data.q_len + torch.arange(data.q_len))[:, None].to(
            k.device
        )
        out.append(logits.masked_fill(~causal[:, None, :], -math.inf).softmax(dim=-1))
    return out
