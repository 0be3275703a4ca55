"""Compiling the decode kernel: a cache keyed by (config, arch, cutlass version), offline shared-memory
supply, ptxas resource reports (registers, stack, spills) and the representative compile matrix.

Compiling needs ``nvidia-cutlass-dsl`` but no GPU: ``compile_decode(cfg, "sm_110a")`` works on a CPU
machine. The DSL asks the driver for the shared memory per SM only when min_blocks_per_mp > 1; when
the target arch is not the local device's, that value comes from the arch's target
(``mjolnir_numerics.targets.target_of_arch``) or the ``smem_per_sm`` argument.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mjolnir_numerics.targets import target_of_arch

from .arch import arch_of_capability, check_tcgen05_arch
from .config import can_implement, default_config

STRIDE_COUNT = 20  # host.STRIDE_FIELDS
COMPILE_OPTIONS = "--opt-level 2"
HOPPER_ARCH = "sm_90a"
SPILL_BASELINE_PATH = Path(__file__).with_name("spill_baseline.json")
_DUMMY_ADDRESS = 1 << 20  # compile-only pointers: any 16-B aligned address

_lock = threading.Lock()
_cache: dict = {}


def cutlass_version() -> str:
    import cutlass

    return getattr(cutlass, "__version__", "unknown")


def cutlass_available() -> str | None:
    """None when the CuTe DSL imports, else the reason it does not."""
    try:
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401
        import cuda.bindings.driver  # noqa: F401
    except Exception as e:  # ImportError, or a broken install raising at import
        return f"nvidia-cutlass-dsl / cuda-python not importable ({type(e).__name__}: {e})"
    return None


@dataclass
class KernelResources:
    """ptxas report of one entry function (bytes, registers per thread)."""

    registers: int
    stack_frame: int
    spill_stores: int
    spill_loads: int


@dataclass
class CompileResult:
    config: object  # a ThorConfig or a HopperConfig
    arch: str
    seconds: float
    resources: dict = field(default_factory=dict)  # "decode" / "reduction" -> KernelResources
    compiled: object = None  # the cute JIT executor (callable with the runtime arguments)
    log: str = ""

    @property
    def spill_bytes(self) -> int:
        """Spill stores over all entry functions (the number the baseline gates)."""
        return sum(r.spill_stores for r in self.resources.values())


_ENTRY_RE = re.compile(r"Compiling entry function\s+'([^']+)'")
_STACK_RE = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS_RE = re.compile(r"Used (\d+) registers")


def parse_ptxas_report(text: str) -> dict:
    """ptxas info/remark text -> {"decode" | "reduction": KernelResources}."""
    out = {}
    chunks = _ENTRY_RE.split(text)
    # split() gives [pre, name1, body1, name2, body2, ...]
    for name, body in zip(chunks[1::2], chunks[2::2]):
        stack = _STACK_RE.search(body)
        regs = _REGS_RE.search(body)
        if not regs:
            continue
        kind = "reduction" if "SplitReduction" in name else "decode"
        st = tuple(int(x) for x in stack.groups()) if stack else (0, 0, 0)
        out[kind] = KernelResources(int(regs.group(1)), st[0], st[1], st[2])
    return out


@contextlib.contextmanager
def _shared_memory_supply(arch: str, smem_per_sm: int | None):
    """Answer the DSL's shared-memory-per-SM query without a driver (or for a foreign arch)."""
    import cutlass.base_dsl.runtime.cuda as cuda_helpers

    attr = cuda_helpers.cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    original = cuda_helpers.get_device_attribute
    value = smem_per_sm
    if value is None:
        value = target_of_arch(arch).smem_per_sm
        try:
            import torch

            if torch.cuda.is_available() and arch_of_capability(*torch.cuda.get_device_capability()) == arch:
                value = None  # compiling for the local device: ask its driver
        except Exception:
            pass

    def supplied(attribute, device_id=0):
        if attribute == attr and value is not None:
            return int(value)
        return original(attribute, device_id)

    cuda_helpers.get_device_attribute = supplied
    try:
        yield
    finally:
        cuda_helpers.get_device_attribute = original


@contextlib.contextmanager
def _file_cache(enabled: bool):
    """A compile that must report ptxas resources bypasses the DSL's on-disk cache."""
    import cutlass.cutlass_dsl as cd

    env = cd.CuTeDSL._get_dsl().envar
    before = env.disable_file_caching
    env.disable_file_caching = not enabled
    try:
        yield
    finally:
        env.disable_file_caching = before


def compile_only_args(config, n_q: int | None = None):
    """Placeholder runtime arguments with the exact types ``decode()`` passes (pointers, int32s,
    floats, stream); values are irrelevant to the compiled code."""
    import cutlass.cute as cute
    import cuda.bindings.driver as cuda
    from cutlass.cute.runtime import make_ptr

    from .host import kernel_arguments

    def pointer(name, dtype):
        return make_ptr(dtype, _DUMMY_ADDRESS, cute.AddressSpace.gmem, assumed_align=16)

    sizes = ((2, 4, n_q or config.q_tile, config.head_dim), 8, 64, 40)
    return kernel_arguments(config, sizes, tuple([16] * STRIDE_COUNT), pointer, 0.0625, 1.0, cuda.CUstream(0))


def compile_decode(
    config,
    arch: str,
    *,
    smem_per_sm: int | None = None,
    report: bool = True,
    use_cache: bool = True,
    cubin_dir: str | None = None,
) -> CompileResult:
    """Compile (or fetch from the in-process cache) the decode kernel of ``config`` (a ThorConfig or a
    HopperConfig) for ``arch``.

    ``can_implement`` runs first and raises ``ConfigError`` before anything compiles; ValueError when
    ``arch`` does not run ``config``'s kernel. With ``report=True`` ptxas resources are collected (the
    DSL's file cache is bypassed so ptxas runs). ``cubin_dir``: compile afresh and keep the cubin there
    (for ``mjolnir_kernel.sass``). Raises the DSL's compile error unchanged.
    """
    from .hopper.config import HopperConfig

    can_implement(config)
    hopper = isinstance(config, HopperConfig)
    if check_compile_arch(arch) and (target_of_arch(arch).backend == "hopper") != hopper:
        raise ValueError(f"arch: {arch!r} does not run the {type(config).__name__} kernel")
    key = (type(config).__name__, config.key(), arch, cutlass_version())
    if cubin_dir is not None:
        report, use_cache = True, False  # ptxas must run, so the DSL's file cache is bypassed
    with _lock:
        hit = _cache.get(key)
        if hit is not None and use_cache and (hit.resources or not report):
            return hit

        import cutlass.cute as cute

        if hopper:
            from .hopper.decode_kernel import HopperDecodeKernel

            kernel = HopperDecodeKernel(config)
        else:
            from .thor.decode_kernel import ThorDecodeKernel

            kernel = ThorDecodeKernel(config)
        args = compile_only_args(config)
        options = f"{COMPILE_OPTIONS} --gpu-arch {arch}" + (" remarks{ptx}" if report else "")
        if cubin_dir is not None:
            options += f" --keep-cubin --dump-dir {cubin_dir}"
        log = io.StringIO()
        t0 = time.perf_counter()
        with _shared_memory_supply(arch, smem_per_sm), _file_cache(not report), contextlib.redirect_stderr(log):
            compiled = cute.compile(kernel, *args, options=options)
        seconds = time.perf_counter() - t0
        text = log.getvalue()
        result = CompileResult(config, arch, seconds, parse_ptxas_report(text) if report else {}, compiled, text)
        _cache[key] = result
        return result


# ---------------------------------------------------------------------------------------------
# The representative compile matrix (CI gate) and the spill baseline
# ---------------------------------------------------------------------------------------------
MATRIX_HEADS_RATIO = 6  # h_q / h_k of the matrix (the seed harness default, 24 / 4)


def compile_matrix(arch: str) -> list:
    """The compile gate's matrix for ``arch``: the config ``decode()`` compiles (``config.default_config``
    for the arch's target) for {bf16 Q, e4m3 Q} x every KV format the capability rule allows with that Q
    x page size {16, 128} x q_len {1, 4 causal, 4 non-causal} x max_splits {1, 16} x head dim {128, 256},
    with n_q = q_len * 6 query rows per KV head."""
    from mjolnir_numerics.capability import KV_FORMATS, unsupported_reason

    target = target_of_arch(arch)
    configs = []
    for q_dtype in ("bf16", "e4m3"):
        for fmt in (f for f in KV_FORMATS if unsupported_reason(f, q_dtype) is None):
            for ps in (16, 128):
                for q_len, causal in ((1, True), (4, True), (4, False)):
                    for splits in (1, 16):
                        for d in (128, 256):
                            configs.append(default_config(
                                target, head_dim=d, page_size=ps, q_len=q_len, kv_format=fmt, q_dtype=q_dtype,
                                n_q=q_len * MATRIX_HEADS_RATIO, causal=causal, max_splits=splits,
                            ))  # fmt: skip
    return configs


def ci_slice(arch: str) -> list:
    """A handful of configs of ``compile_matrix(arch)`` covering both Q paths, both head dims, q_len 1 and
    4 (causal and non-causal), split and unsplit, page sizes 16 and 128, and the packed formats' loaders
    (nvfp4, fp6)."""
    target = target_of_arch(arch)
    picks = (
        dict(head_dim=128, page_size=128, q_len=1, kv_format="e4m3", q_dtype="bf16", max_splits=16),
        dict(head_dim=256, page_size=16, q_len=4, kv_format="e4m3", q_dtype="e4m3", causal=False, max_splits=1),
        dict(head_dim=256, page_size=128, q_len=4, kv_format="e4m3", q_dtype="bf16", max_splits=16),
        dict(head_dim=256, page_size=16, q_len=1, kv_format="nvfp4", q_dtype="e4m3", max_splits=16),
        dict(head_dim=128, page_size=128, q_len=4, kv_format="e2m3", q_dtype="e4m3", causal=False, max_splits=16),
    )
    return [default_config(target, n_q=p["q_len"] * MATRIX_HEADS_RATIO, **p) for p in picks]


def load_spill_baseline(path: Path = SPILL_BASELINE_PATH) -> dict:
    """{arch: {config short name: {"decode": {...}, "reduction": {...}}}} ({} when absent)."""
    if not Path(path).exists():
        return {}
    return json.loads(Path(path).read_text())


def baseline_entry(result: CompileResult) -> dict:
    return {
        kind: {
            "registers": r.registers,
            "stack_frame": r.stack_frame,
            "spill_stores": r.spill_stores,
            "spill_loads": r.spill_loads,
        }
        for kind, r in sorted(result.resources.items())
    }


def spill_regressions(result: CompileResult, baseline: dict) -> list[str]:
    """Kernels of ``result`` that spill more (stores or loads) than the baseline allows; a config
    absent from the baseline is allowed no spills."""
    base = baseline.get(result.arch, {}).get(result.config.short_name(), {})
    problems = []
    for kind, r in result.resources.items():
        allowed = base.get(kind, {"spill_stores": 0, "spill_loads": 0})
        if r.spill_stores > allowed["spill_stores"] or r.spill_loads > allowed["spill_loads"]:
            problems.append(
                f"{result.config.short_name()} [{kind}] on {result.arch}: spills {r.spill_stores} B stored /"
                f" {r.spill_loads} B loaded, baseline {allowed['spill_stores']} / {allowed['spill_loads']}"
            )
    return problems


# ---------------------------------------------------------------------------------------------
# The gate's arch dispatch
# ---------------------------------------------------------------------------------------------
def compile_archs() -> tuple:
    """The targets the compile gate knows: the Hopper kernel's and the tcgen05 ones."""
    from .arch import KNOWN_ARCHS

    return (HOPPER_ARCH, *KNOWN_ARCHS)


def check_compile_arch(arch: str) -> str:
    """``arch`` when a decode kernel compiles for it (sm_90a: Hopper; 10.x / 11.x arch-specific: tcgen05),
    else ValueError naming ``arch`` and the accepted targets."""
    if arch == HOPPER_ARCH:
        return arch
    try:
        return check_tcgen05_arch(arch)
    except ValueError:
        raise ValueError(
            f"arch={arch!r} is not a compile target: {HOPPER_ARCH} (the Hopper kernel) or a tcgen05 arch-specific"
            f" target of compute capability 10.x / 11.x ({', '.join(compile_archs()[1:])})"
        ) from None


def gate_configs(arch: str, slice_name: str = "full") -> list:
    """The configs the compile gate builds for ``arch``: :func:`compile_matrix` or its :func:`ci_slice`."""
    if slice_name not in ("full", "ci"):
        raise ValueError(f"slice_name={slice_name!r}: 'full' or 'ci'")
    check_compile_arch(arch)
    return ci_slice(arch) if slice_name == "ci" else compile_matrix(arch)
