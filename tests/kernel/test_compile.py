"""The compile gate: the kernel compiles for tcgen05 targets on any machine (no GPU), ptxas resources
stay within the checked-in spill baseline, and invalid configs are rejected before compiling."""

import pytest

from conftest import test_size_name
from mjolnir_kernel import compile as kc
from mjolnir_kernel.config import ConfigError, DecodeConfig

_NO_CUTLASS = kc.cutlass_available()
needs_cutlass = pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"compile gate skipped: {_NO_CUTLASS}")

_PTXAS_SAMPLE = """
ptxas info    : Compiling entry function
          'kernel_cutlass_kernel_mjolnir_kernelthorreduction_kernelSplitReduction_object_at__x_1'
          for 'sm_110a'
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 56 registers, used 0 barriers
ptxas info    : Compiling entry function 'kernel_cutlass_kernel_thordecode_kernelThorDecodeKernel_0' for 'sm_110a'
ptxas         .     88 bytes stack frame, 176 bytes spill stores, 140 bytes spill loads
ptxas info    : Used 80 registers, used 4 barriers, 88 bytes cumulative stack size
"""


def test_ptxas_report_parsing():
    r = kc.parse_ptxas_report(_PTXAS_SAMPLE)
    assert r["reduction"] == kc.KernelResources(56, 0, 0, 0)
    assert r["decode"] == kc.KernelResources(80, 88, 176, 140)


def test_invalid_config_is_rejected_before_compiling(monkeypatch):
    def must_not_run(*a, **k):
        raise AssertionError("compile started for an invalid config")

    monkeypatch.setattr(kc, "compile_only_args", must_not_run)
    bad = DecodeConfig(q_dtype="bf16", kv_format="nvfp4", head_dim=256)
    with pytest.raises(ConfigError, match="kv_format='nvfp4' with q_dtype='bf16'"):
        kc.compile_decode(bad, "sm_110a")
    with pytest.raises(ConfigError, match="page_size=48"):
        kc.compile_decode(DecodeConfig(page_size=48), "sm_110a")


def test_non_tcgen05_arch_is_rejected_before_compiling(monkeypatch):
    monkeypatch.setattr(kc, "compile_only_args", lambda *a, **k: (_ for _ in ()).throw(AssertionError("compiled")))
    with pytest.raises(ValueError, match="arch='sm_90a'"):
        kc.compile_decode(DecodeConfig(), "sm_90a")


def test_spill_regression_detection():
    cfg = DecodeConfig()
    res = kc.CompileResult(cfg, "sm_110a", 1.0, {"decode": kc.KernelResources(80, 8, 8, 8)})
    assert kc.spill_regressions(res, {}) != []  # absent from the baseline: no spills allowed
    base = {"sm_110a": {cfg.short_name(): kc.baseline_entry(res)}}
    assert kc.spill_regressions(res, base) == []
    worse = kc.CompileResult(cfg, "sm_110a", 1.0, {"decode": kc.KernelResources(80, 16, 16, 16)})
    assert "spills 16 B" in kc.spill_regressions(worse, base)[0]


def test_checked_in_baseline_covers_the_matrix():
    base = kc.load_spill_baseline()
    names = {c.short_name() for c in kc.representative_matrix()}
    for arch in ("sm_110a", "sm_100a"):
        assert names <= set(base.get(arch, {})), (
            f"spill baseline lacks {arch} configs: run the compile gate with --update-baseline"
        )


def _compile_and_check(cfg, arch):
    r = kc.compile_decode(cfg, arch)
    assert "decode" in r.resources, f"no ptxas report for {cfg.short_name()} ({arch})"
    assert ("reduction" in r.resources) == (cfg.max_splits > 1)
    problems = kc.spill_regressions(r, kc.load_spill_baseline())
    assert not problems, "\n".join(problems)
    return r


@needs_cutlass
@pytest.mark.parametrize("cfg", kc.ci_slice(), ids=lambda c: c.short_name())
def test_ci_slice_compiles_for_thor(cfg):
    _compile_and_check(cfg, "sm_110a")


@needs_cutlass
def test_compiles_for_b200():
    _compile_and_check(kc.ci_slice()[0], "sm_100a")


@needs_cutlass
def test_known_seed_spills_are_gone():
    """The seed spilled 176 B (nvfp4, 2 CTAs/SM) and 104 B (e4m3 Q, q_len 4); these configs spill none."""
    nvfp4 = DecodeConfig(head_dim=256, q_tile=16, page_size=128, kv_format="nvfp4", q_dtype="e4m3", evict_first=True)
    q4 = DecodeConfig(
        head_dim=256, q_tile=32, page_size=128, q_len=4, kv_format="e4m3", q_dtype="e4m3", evict_first=True
    )
    for cfg in (nvfp4, q4):
        r = kc.compile_decode(cfg, "sm_110a")
        assert r.resources["decode"].spill_stores == 0, cfg.short_name()


@needs_cutlass
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_110a", "sm_100a"])
def test_full_matrix_compiles(arch):
    """The whole representative matrix at MJOLNIR_TEST_SIZE=full; an evenly spread seventeenth of it
    (9 configs: both Q paths, every format, both head dims and page sizes) at the default small size, which CI runs."""
    matrix = kc.representative_matrix()
    if test_size_name() != "full":
        matrix = matrix[::17]
    failures = []
    for cfg in matrix:
        try:
            _compile_and_check(cfg, arch)
        except Exception as e:  # collect every failing config by name
            failures.append(f"{cfg.short_name()}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    assert not failures, "\n".join(failures)
