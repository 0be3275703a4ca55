"""The two kernels' compile keys behind one vocabulary: the config a problem gets on a target, and
``can_implement``.

Both configs (``ThorConfig`` in ``thor/config.py``, ``HopperConfig`` in ``hopper/config.py``) are frozen
dataclasses whose fields share names and meanings:

==============  ============================================================================
field           meaning (both kernels)
==============  ============================================================================
head_dim        d: 128 or 256
page_size       keys per KV-cache page: 16, 32, 64 or 128
q_len           query tokens per sequence
kv_format       the cache's format (``mjolnir_numerics.capability.KV_FORMATS``)
q_dtype         ``"bf16"`` or ``"e4m3"``
causal          with q_len > 1: query qi sees keys 0 .. L - q_len + qi
q_tile          query rows per CTA (``mjolnir_numerics.targets.Target.q_tile``)
max_splits      partial slots per sequence; 1 compiles the split reduction out
pdl             programmatic dependent launch (a feature for callers that chain kernels)
==============  ============================================================================

and both expose ``ctas_per_sm`` and ``ring_stages`` (Thor: tuning fields, which the first Thor run can
sweep; Hopper: derived properties, measured on the H200). No cutlass import.
"""

from __future__ import annotations

from typing import Union

from mjolnir_numerics.capability import check_supported
from mjolnir_numerics.checks import check_bool, check_int
from mjolnir_numerics.targets import Target, get_target

from .errors import ConfigError

__all__ = ["ConfigError", "SHAPE_FIELDS", "default_config", "can_implement", "shape_mismatches"]

SHAPE_FIELDS = ("head_dim", "page_size", "q_len", "kv_format", "q_dtype", "causal", "q_tile")
"""The config fields a problem fixes (a config given to ``decode`` must agree with the call on them)."""


def default_config(
    target: Union[str, Target],
    *,
    head_dim: int,
    page_size: int,
    q_len: int,
    kv_format: str,
    q_dtype: str,
    n_q: int,
    causal: bool = True,
    max_splits: int | None = None,
    pdl: bool = False,
):
    """The config ``decode()`` compiles for a problem on ``target``: a ``ThorConfig`` on a tcgen05 target,
    a ``HopperConfig`` on a Hopper one. ``n_q``: query rows per KV head (q_len * h_q / h_k);
    ``max_splits`` None: the target's; ``causal`` only matters for q_len > 1.

    Raises:
        ValueError: a problem the kernels cannot run (``mjolnir_numerics.capability``).
        ConfigError: a config the target's kernel cannot implement (naming every field).
    """
    t = get_target(target)
    for name, value in (("head_dim", head_dim), ("page_size", page_size)):
        check_int(name, value)
    for name, value in (("causal", causal), ("pdl", pdl)):
        check_bool(name, value)
    check_supported(kv_format, q_dtype, head_dim, page_size)
    shape = dict(
        head_dim=head_dim, page_size=page_size, q_len=q_len, kv_format=kv_format, q_dtype=q_dtype,
        causal=causal if q_len > 1 else True, q_tile=t.q_tile(n_q, q_dtype),
        max_splits=t.max_splits if max_splits is None else max_splits, pdl=pdl,
    )  # fmt: skip
    if t.backend == "hopper":
        from .hopper.config import HopperConfig

        cfg = HopperConfig(**shape)
    else:
        from .thor.config import ThorConfig, default_ctas

        ctas = default_ctas(t.ctas(head_dim), shape["q_tile"], q_dtype, kv_format)
        cfg = ThorConfig(**shape, ctas_per_sm=ctas)
    can_implement(cfg)
    return cfg


def can_implement(config) -> None:
    """Raise ``ConfigError`` (a ValueError) naming every field of ``config`` (a ThorConfig or a
    HopperConfig) its kernel cannot implement, or return None. Pure Python: runs before anything compiles."""
    from .hopper.config import HopperConfig, can_implement_hopper
    from .thor.config import ThorConfig, can_implement_thor

    if isinstance(config, HopperConfig):
        can_implement_hopper(config)
    elif isinstance(config, ThorConfig):
        can_implement_thor(config)
    else:
        raise ConfigError(f"config: expected a ThorConfig or a HopperConfig, got {type(config).__name__}")


def shape_mismatches(config, expected) -> list[str]:
    """``"field=value (the call needs other)"`` for each of :data:`SHAPE_FIELDS` where ``config`` differs
    from ``expected`` (the default config of the call), plus a kernel mismatch."""
    if type(config) is not type(expected):
        return [f"a {type(config).__name__}, but this device runs the {type(expected).__name__} kernel"]
    return [
        f"{name}={getattr(config, name)!r} (the call needs {getattr(expected, name)!r})"
        for name in SHAPE_FIELDS
        if getattr(config, name) != getattr(expected, name)
    ]
