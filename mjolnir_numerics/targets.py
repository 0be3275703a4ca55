"""The GPUs the decode kernels run on, as data: one frozen declaration per target and a registry.

A :class:`Target` holds what the spec and the kernels' host code need to know about a GPU: its
architecture, which kernel runs there, its SM count, how many CTAs of the kernel fit one SM, the
query-row tiles the kernel compiles and its split limit. Planning (:func:`~mjolnir_numerics.plan.
default_plan`), the emulator and both kernels read these values from here, so that default arguments
plan identically on every side; no module hard-codes "20 SMs" or "132 SMs".

==========  ========  =======  ===  =================  ===========  ==========
target      arch      kernel   SMs  CTAs per SM         query tiles  max splits
==========  ========  =======  ===  =================  ===========  ==========
``thor``    sm_110a   thor     20   2                   8, 16, 32    16
``b200``    sm_100a   thor     148  2                   8, 16, 32    16
``h200``    sm_90a    hopper   132  2 (d 128), 1 (256)  8, 16        32
``h100``    sm_90a    hopper   132  2 (d 128), 1 (256)  8, 16        32
==========  ========  =======  ===  =================  ===========  ==========

Where the values come from:

* SM counts: NVIDIA's specifications (Jetson AGX Thor 20, B200 148, H100 SXM5 and H200 132);
  :func:`target_for` takes the count of the device at hand when it differs (an H100 PCIe has 114).
* CTAs per SM: Thor's kernel is compiled for 2 (the seed kernel's measurement on Thor: 2 CTAs per
  SM beat 1; this kernel has not run on Thor). The Hopper kernel runs 256 threads per CTA; at d = 128
  it needs about 125 registers per thread, so 2 CTAs fit the 64 K-register file, and at d = 256 it
  needs 180-255, so 1 does (``mjolnir_kernel.hopper.config`` checks that shared memory agrees).
* Query tiles: the packed query rows (``q_len * h_q / h_k`` per KV head) one CTA covers. Thor's
  tcgen05 MMA takes N = 8, 16 or 32 (16 or 32 on the e4m3-Q path, whose fp8 MMA needs N >= 16); the
  Hopper kernel's mma.sync tile has 16 rows, of which it computes 8 when a KV head has at most 8.
* Max splits: the most chunks the default plan cuts one sequence into (the reduction's compile-time
  bound). 16 on Thor; 32 on Hopper, whose 132 SMs want more chunks per sequence at small batch.
* Shared memory: 228 KiB per SM on all four, 227 KiB per CTA at most, 1 KiB reserved per resident CTA
  (the CUDA programming guide's table of compute capabilities).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional, Union

from .checks import check_int

__all__ = [
    "Target", "TARGETS", "THOR", "B200", "H200", "H100", "get_target", "target_for", "target_of_arch", "default_target",
]  # fmt: skip

BACKENDS = ("thor", "hopper")
Q_DTYPES = ("bf16", "e4m3")
EX2_MODELS = ("correctly_rounded", "sm90_mufu")
LOG_MODELS = ("libdevice_logf", "correctly_rounded")
MAX_TILE_STREAMS = 32  # a stream is at least one warp, and a CTA has at most 32


@dataclass(frozen=True)
class Target:
    """A GPU the decode kernels run on.

    Attributes:
        name: registry name (``"thor"``, ``"b200"``, ``"h200"``, ``"h100"``).
        arch: the arch-specific compile target (``"sm_110a"``).
        backend: the kernel that runs there: ``"thor"`` (tcgen05, compute capability 10.x / 11.x) or
            ``"hopper"`` (mma.sync, 9.0).
        sm_count: streaming multiprocessors.
        ctas_per_sm: ``((head_dim, ctas), ...)``: co-resident CTAs of the kernel per SM, by head dim.
        q_tiles: query-row tiles the kernel compiles, ascending (rows of one CTA).
        fp8_min_q_tile: the smallest tile on the e4m3-Q path.
        max_splits: most chunks per sequence in the default plan.
        smem_per_sm: shared memory of one SM in bytes (228 KiB on sm_90, sm_100 and sm_110).
        smem_per_cta: the most shared memory one CTA may opt in to (227 KiB).
        smem_reserved_per_cta: shared memory the driver reserves for each resident CTA (1 KiB).
        walk: the kernel's MMA walk (``mjolnir_numerics.arithmetic.kstep_groups``): which head dims and
            keys each MMA instruction adds, in which order.
        mma_e4m3_q, mma_bf16_q: the MMA models (``arithmetic.MMA_MODELS``) of the e4m3-Q and bf16-Q paths.
        ex2: the model of the kernel's ``ex2.approx.ftz.f32``: ``"sm90_mufu"`` (the H200's SFU, measured on
            every input: :func:`mjolnir_numerics.emulator_stages.exp2_sm90_f32`) or ``"correctly_rounded"``
            (with flush to zero), on targets whose SFU is not measured.
        log: the model of the LSE's log: ``"libdevice_logf"`` (the kernels' ``cute.math.log(fastmath=False)``,
            plain fp32 fmas: :func:`mjolnir_numerics.emulator_stages.log_libdevice_f32`) or
            ``"correctly_rounded"``.
        arithmetic_verified: where the MMA models were checked against this target's silicon ("" for
            predicted only).
        tile_streams: how a work item's 128-key tiles are walked: 1, front to back with one online softmax
            (every kernel today); S in 2 .. 32 (a stream is at least one warp), in S interleaved streams
            (stream s: tiles s, s + S, s + 2S, ... of the chunk; for instance two warpgroups on alternate
            tiles), each with its own running max, row sums and O, their partials merged by the split
            reduction (``emulator_stages.reduction``) in order (split j of stream s at index j * S + s),
            unsplit sequences included.
    """

    name: str
    arch: str
    backend: str
    sm_count: int
    ctas_per_sm: tuple[tuple[int, int], ...]
    q_tiles: tuple[int, ...]
    fp8_min_q_tile: int
    max_splits: int
    smem_per_sm: int = 233472
    smem_per_cta: int = 232448
    smem_reserved_per_cta: int = 1024
    walk: str = "tcgen05"
    mma_e4m3_q: str = "sm100_e4m3"
    mma_bf16_q: str = "sm100_bf16"
    ex2: str = "correctly_rounded"
    log: str = "libdevice_logf"
    arithmetic_verified: str = ""
    tile_streams: int = 1

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend: {self.backend!r} is not one of {BACKENDS}")
        for name in ("sm_count", "fp8_min_q_tile", "max_splits", "smem_per_sm", "smem_per_cta"):
            check_int(name, getattr(self, name), low=1)
        check_int("smem_reserved_per_cta", self.smem_reserved_per_cta, low=0)
        check_int("tile_streams", self.tile_streams, low=1, high=MAX_TILE_STREAMS)
        tiles = self.q_tiles
        if not isinstance(tiles, tuple) or not tiles or list(tiles) != sorted(set(tiles)):
            raise ValueError(f"q_tiles: expected a non-empty ascending tuple of distinct ints, got {tiles!r}")
        for t in tiles:
            check_int("q_tiles", t, low=1)
        if not isinstance(self.ctas_per_sm, tuple) or not self.ctas_per_sm:
            raise ValueError(f"ctas_per_sm: expected a non-empty tuple of (head_dim, ctas), got {self.ctas_per_sm!r}")
        for entry in self.ctas_per_sm:
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise ValueError(f"ctas_per_sm: entry {entry!r} is not (head_dim, ctas)")
            check_int("ctas_per_sm head_dim", entry[0], low=1)
            check_int("ctas_per_sm ctas", entry[1], low=1)
        from .arithmetic import MMA_MODELS, WALKS

        if self.walk not in WALKS:
            raise ValueError(f"walk: {self.walk!r} is not one of {WALKS}")
        for name in ("mma_e4m3_q", "mma_bf16_q"):
            if getattr(self, name) not in MMA_MODELS:
                raise ValueError(f"{name}: {getattr(self, name)!r} is not one of {', '.join(MMA_MODELS)}")
        if self.ex2 not in EX2_MODELS:
            raise ValueError(f"ex2: {self.ex2!r} is not one of {EX2_MODELS}")
        if self.log not in LOG_MODELS:
            raise ValueError(f"log: {self.log!r} is not one of {LOG_MODELS}")

    def mma_model(self, q_dtype: str) -> str:
        """The name of the MMA model of the ``q_dtype`` path (``"e4m3"`` or ``"bf16"``)."""
        if q_dtype not in Q_DTYPES:
            raise ValueError(f"q_dtype: {q_dtype!r} is not one of {Q_DTYPES}")
        return self.mma_e4m3_q if q_dtype == "e4m3" else self.mma_bf16_q

    def ctas(self, head_dim: int) -> int:
        """Co-resident CTAs per SM at ``head_dim``; ValueError for a head dim the kernel does not compile."""
        head_dim = check_int("head_dim", head_dim)
        for d, n in self.ctas_per_sm:
            if d == head_dim:
                return n
        allowed = tuple(d for d, _ in self.ctas_per_sm)
        raise ValueError(f"head_dim: {head_dim!r} is not one of the {self.name} kernel's head dims {allowed}")

    def q_tile(self, n_q: int, q_dtype: str) -> int:
        """Query rows per CTA for ``n_q`` packed rows per KV head: the smallest tile that holds them (at
        least ``fp8_min_q_tile`` for e4m3 Q), else the largest (wider problems tile over the grid)."""
        if isinstance(n_q, bool) or not isinstance(n_q, int) or n_q < 1:
            raise ValueError(f"n_q: expected an int >= 1 (query rows per KV head), got {n_q!r}")
        if q_dtype not in Q_DTYPES:
            raise ValueError(f"q_dtype: {q_dtype!r} is not one of {Q_DTYPES}")
        floor = self.fp8_min_q_tile if q_dtype == "e4m3" else 1
        fits = [t for t in self.q_tiles if t >= max(n_q, floor)]
        return fits[0] if fits else self.q_tiles[-1]

    def n_q_tiles(self, n_q: int, q_dtype: str) -> int:
        """Query tiles per KV head (the grid's y dimension) for ``n_q`` packed rows."""
        return -(-n_q // self.q_tile(n_q, q_dtype))


THOR = Target("thor", "sm_110a", "thor", 20, ((128, 2), (256, 2)), (8, 16, 32), 16, 16)
B200 = Target("b200", "sm_100a", "thor", 148, ((128, 2), (256, 2)), (8, 16, 32), 16, 16)
# H100 is the same sm_90 SM as H200 (GH100): the same models, predicted there, measured on the H200
_HOPPER_ARITHMETIC = dict(walk="mma_sync_sm90", mma_e4m3_q="sm90_f16", mma_bf16_q="sm90_bf16", ex2="sm90_mufu")
_H200_VERIFIED = "H200: benchmarks.probes.arithmetic_sweep, 2026-12-01 (MMA, log) and 2026-12-02 (ex2)"
H200 = Target("h200", "sm_90a", "hopper", 132, ((128, 2), (256, 1)), (8, 16), 8, 32, **_HOPPER_ARITHMETIC,
              arithmetic_verified=_H200_VERIFIED)  # fmt: skip
H100 = Target("h100", "sm_90a", "hopper", 132, ((128, 2), (256, 1)), (8, 16), 8, 32, **_HOPPER_ARITHMETIC)

TARGETS: dict[str, Target] = {t.name: t for t in (THOR, B200, H200, H100)}


def get_target(target: Union[str, Target]) -> Target:
    """A target by name, or ``target`` itself; ValueError naming the known ones."""
    if isinstance(target, Target):
        return target
    if isinstance(target, str) and target in TARGETS:
        return TARGETS[target]
    raise ValueError(f"target: {target!r} is not a Target or one of {', '.join(TARGETS)}")


def target_of_arch(arch: str) -> Target:
    """The target a compile for ``arch`` builds the kernel of: the declared target of that arch (``h200``
    for sm_90a), or for another arch-specific 10.x / 11.x target (e.g. sm_103a) B200's / Thor's with that
    arch. ValueError naming ``arch`` otherwise."""
    for t in TARGETS.values():
        if t.arch == arch:
            return t
    if isinstance(arch, str) and arch.endswith("a") and arch.startswith(("sm_10", "sm_11")) and arch[3:-1].isdigit():
        return replace(B200 if arch.startswith("sm_10") else THOR, arch=arch)
    known = sorted({t.arch for t in TARGETS.values()})
    raise ValueError(f"arch: {arch!r} is not a decode target; known: {', '.join(known)} (or sm_10Xa / sm_11Xa)")


def target_for(device=None) -> Target:
    """The target of a CUDA device (default: the current one), from its compute capability, name and
    SM count: 9.0 -> ``h200`` (name contains "H200") or ``h100``; 10.x -> ``b200``; 11.x -> ``thor``.
    The declared SM count is replaced by the device's where they differ.

    Raises:
        ValueError: no CUDA device, or a compute capability neither kernel runs on.
    """
    import torch

    if not torch.cuda.is_available():
        raise ValueError("device: no CUDA device is visible")
    props = torch.cuda.get_device_properties(device)
    major, minor = props.major, props.minor
    if (major, minor) == (9, 0):
        base = H200 if "H200" in props.name else H100
    elif major == 10:
        base = replace(B200, arch=f"sm_{major}{minor}a")
    elif major == 11:
        base = replace(THOR, arch=f"sm_{major}{minor}a")
    else:
        raise ValueError(
            f"device: {props.name} is compute capability {major}.{minor}; the decode kernels run on 9.0"
            " (Hopper), 10.x and 11.x (tcgen05)"
        )
    if props.multi_processor_count != base.sm_count:
        base = replace(base, sm_count=props.multi_processor_count)
    return base


def default_target(device=None) -> Target:
    """The target a call plans for when it is given none: that of ``device`` when it is a CUDA device a
    kernel runs on, else Thor (the kernel this project models first)."""
    import torch

    if device is not None and torch.device(device).type == "cuda":
        try:
            return target_for(device)
        except ValueError:
            return THOR
    return THOR


def _resolve(target: Optional[Union[str, Target]], device=None) -> Target:
    return default_target(device) if target is None else get_target(target)
