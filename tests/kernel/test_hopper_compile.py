"""The Hopper compile gate: the sm_90a kernel compiles its config matrix on any machine (no GPU), ptxas
resources stay within the checked-in spill baseline, invalid configs and mismatched archs are rejected
before compiling, and ``python -m mjolnir_kernel compile --arch sm_90a`` gates like the Thor one."""

import pytest

from conftest import test_size_name
from mjolnir_kernel import compile as kc
from mjolnir_kernel.__main__ import main
from mjolnir_kernel.config import ConfigError, DecodeConfig
from mjolnir_kernel.hopper import config as hc
from mjolnir_kernel.hopper.config import HopperConfig

_NO_CUTLASS = kc.cutlass_available()
needs_cutlass = pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"Hopper compile gate skipped: {_NO_CUTLASS}")


def _must_not_compile(*a, **k):
    raise AssertionError("compile started")


# -- the matrix, the CI slice, the baseline (no compiling) --------------------------------------------
def test_hopper_matrix_spans_every_axis():
    matrix = kc.hopper_matrix()
    names = [c.short_name() for c in matrix]
    assert len(names) == len(set(names)), "duplicate configs in the Hopper matrix"
    assert all(n.startswith("sm90-") for n in names)
    assert all(isinstance(c, HopperConfig) and c.stages == 0 for c in matrix)
    # 2 page sizes x 3 (q_len, causal) x 2 splits x 2 head dims per (Q dtype, format): bf16 Q reads e4m3
    # only, e4m3 Q every format the kernel reads
    assert len(matrix) == 24 * (("e4m3" in hc.KV_FORMATS) + len(hc.KV_FORMATS))
    assert {(c.q_dtype, c.kv_format) for c in matrix} == {("bf16", "e4m3")} | {("e4m3", f) for f in hc.KV_FORMATS}
    assert {c.q_dtype for c in matrix} == {"bf16", "e4m3"}
    assert {c.head_dim for c in matrix} == {128, 256}
    assert {c.page_size for c in matrix} == {16, 128}
    assert {(c.q_len, c.causal) for c in matrix} == {(1, True), (4, True), (4, False)}
    assert {c.max_splits for c in matrix} == {1, 16}
    for c in matrix:
        hc.can_implement_hopper(c)


def test_hopper_matrix_grows_with_the_kernels_formats(monkeypatch):
    """A format added to ``KV_FORMATS`` enters the matrix by itself, only where ``can_implement_hopper``
    allows it (non-e4m3 KV needs e4m3 Q)."""
    monkeypatch.setattr(hc, "KV_FORMATS", ("e4m3",))
    assert len(kc.hopper_matrix()) == 48
    monkeypatch.setattr(hc, "KV_FORMATS", ("e4m3", "e2m3", "nvfp4"))
    matrix = kc.hopper_matrix()
    assert len(matrix) == 48 + 2 * 24
    new = [c for c in matrix if c.kv_format != "e4m3"]
    assert {c.kv_format for c in new} == {"e2m3", "nvfp4"}
    assert {c.q_dtype for c in new} == {"e4m3"}


def test_hopper_ci_slice_covers_the_axes_and_is_in_the_matrix():
    ci = kc.hopper_ci_slice()
    assert 3 <= len(ci) <= 6 and len({c.short_name() for c in ci}) == len(ci)
    names = {c.short_name() for c in kc.hopper_matrix()}
    assert {c.short_name() for c in ci} <= names
    assert {c.q_dtype for c in ci} == {"bf16", "e4m3"}
    assert {c.head_dim for c in ci} == {128, 256}
    assert {c.page_size for c in ci} == {16, 128}
    assert {(4, True), (4, False)} <= {(c.q_len, c.causal) for c in ci}
    assert {c.max_splits > 1 for c in ci} == {True, False}
    # the packed formats' loaders, where the kernel reads them
    packed = {"nvfp4", "e2m3"} & set(hc.KV_FORMATS)
    assert packed <= {c.kv_format for c in ci}


def test_hopper_ci_slice_falls_back_to_e4m3(monkeypatch):
    monkeypatch.setattr(hc, "KV_FORMATS", ("e4m3",))
    ci = kc.hopper_ci_slice()
    assert {c.kv_format for c in ci} == {"e4m3"}
    assert {c.short_name() for c in ci} <= {c.short_name() for c in kc.hopper_matrix()}


def test_checked_in_baseline_covers_the_hopper_matrix():
    base = kc.load_spill_baseline().get(kc.HOPPER_ARCH, {})
    missing = sorted(c.short_name() for c in kc.hopper_matrix() if c.short_name() not in base)
    assert not missing, (
        f"spill baseline lacks {len(missing)} sm_90a configs (e.g. {missing[:3]}): run "
        "`python -m mjolnir_kernel compile --arch sm_90a --update-baseline`"
    )
    for c in kc.hopper_matrix():
        entry = base[c.short_name()]
        assert "decode" in entry and ("reduction" in entry) == (c.max_splits > 1), c.short_name()
    # no Hopper entry sneaks into the tcgen05 baselines (or the other way round)
    for arch in ("sm_110a", "sm_100a"):
        assert not any(n.startswith("sm90-") for n in kc.load_spill_baseline().get(arch, {}))
    assert all(n.startswith("sm90-") for n in base)


# -- rejection before compiling -------------------------------------------------------------------------
def test_invalid_hopper_config_is_rejected_before_compiling(monkeypatch):
    monkeypatch.setattr(kc, "compile_only_args", _must_not_compile)
    with pytest.raises(ConfigError, match="head_dim=96"):
        kc.compile_decode(HopperConfig(head_dim=96), kc.HOPPER_ARCH)
    with pytest.raises(ConfigError, match="kv_format='e2m3'"):
        kc.compile_decode(HopperConfig(kv_format="e2m3", q_dtype="bf16"), kc.HOPPER_ARCH)
    with pytest.raises(ConfigError, match="stages=1"):
        kc.compile_decode(HopperConfig(stages=1), kc.HOPPER_ARCH)


@pytest.mark.parametrize("arch", ["sm_110a", "sm_100a", "sm_80a"])
def test_hopper_config_with_another_arch_is_rejected(monkeypatch, arch):
    monkeypatch.setattr(kc, "compile_only_args", _must_not_compile)
    with pytest.raises(ValueError, match=rf"^arch: .*{arch}"):
        kc.compile_decode(HopperConfig(), arch)


def test_thor_config_with_sm90a_is_rejected(monkeypatch):
    monkeypatch.setattr(kc, "compile_only_args", _must_not_compile)
    with pytest.raises(ValueError, match="arch='sm_90a'"):
        kc.compile_decode(DecodeConfig(), kc.HOPPER_ARCH)


def test_gate_dispatches_by_arch():
    assert kc.gate_configs("sm_90a", "ci") == kc.hopper_ci_slice()
    assert kc.gate_configs("sm_90a") == kc.hopper_matrix()
    assert kc.gate_configs("sm_110a", "ci") == kc.ci_slice()
    assert kc.gate_configs("sm_100a") == kc.representative_matrix()
    assert "sm_90a" in kc.compile_archs() and "sm_110a" in kc.compile_archs()
    for bad in ("sm_80a", "sm_90", "sm_120a", "hopper"):
        with pytest.raises(ValueError, match=rf"arch='{bad}'"):
            kc.check_compile_arch(bad)


# -- the command line -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["compile", "bench"])
def test_cli_unknown_arch_names_the_argument(capsys, cmd):
    argv = [cmd, "--arch", "sm_80a"] + (["--compile-only"] if cmd == "bench" else [])
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --arch" in err and "sm_80a" in err and "sm_90a" in err


def _fake_result(cfg, spill_stores):
    res = {"decode": kc.KernelResources(128, spill_stores, spill_stores, spill_stores)}
    if cfg.max_splits > 1:
        res["reduction"] = kc.KernelResources(56, 0, 0, 0)
    return kc.CompileResult(cfg, kc.HOPPER_ARCH, 0.1, res)


def test_cli_hopper_gate_fails_on_a_spill_regression(monkeypatch, capsys, tmp_path):
    """The exit code logic, with ptxas's answer faked: 0 spills pass, 16 B over an empty baseline fail."""
    seen = []

    def fake(cfg, arch, **k):
        seen.append((cfg, arch))
        return _fake_result(cfg, 16 if cfg == kc.hopper_ci_slice()[1] else 0)

    monkeypatch.setattr(kc, "compile_decode", fake)
    baseline = tmp_path / "baseline.json"
    baseline.write_text("{}")
    assert main(["compile", "--arch", "sm_90a", "--slice", "ci", "--baseline", str(baseline)]) == 1
    captured = capsys.readouterr()
    assert [c for c, _ in seen] == kc.hopper_ci_slice() and {a for _, a in seen} == {"sm_90a"}
    assert "SPILL REGRESSION " + kc.hopper_ci_slice()[1].short_name() in captured.err
    assert f"{len(seen)}/{len(seen)} compiled" in captured.out
    # recorded in the baseline, the same spills pass
    assert main(["compile", "--arch", "sm_90a", "--slice", "ci", "--baseline", str(baseline), "--update-baseline"]) == 0
    assert main(["compile", "--arch", "sm_90a", "--slice", "ci", "--baseline", str(baseline)]) == 0


def test_cli_full_update_drops_stale_entries(monkeypatch, capsys, tmp_path):
    """A full, unfiltered --update-baseline records every config and drops names the matrix no longer has
    (e.g. after a default change renamed them); other archs' entries stay."""
    import json

    monkeypatch.setattr(kc, "compile_decode", lambda cfg, arch, **k: _fake_result(cfg, 0))
    baseline = tmp_path / "baseline.json"
    thor = {"bf16-e4m3-d128-t8-ps128-q1c-c2-r0-s16": {"decode": {"spill_stores": 8}}}
    baseline.write_text(json.dumps({"sm_90a": {"sm90-stale-r9": {}}, "sm_110a": thor}))
    assert main(["compile", "--arch", "sm_90a", "--baseline", str(baseline)]) == 0
    assert "1 sm_90a baseline entries are not in the matrix, e.g. sm90-stale-r9" in capsys.readouterr().out
    assert "sm90-stale-r9" in json.loads(baseline.read_text())["sm_90a"]  # only --update-baseline writes
    assert main(["compile", "--arch", "sm_90a", "--baseline", str(baseline), "--update-baseline"]) == 0
    written = json.loads(baseline.read_text())
    assert set(written["sm_90a"]) == {c.short_name() for c in kc.hopper_matrix()}
    assert written["sm_110a"] == thor


def test_cli_hopper_gate_fails_on_a_compile_error(monkeypatch, capsys, tmp_path):
    def broken(cfg, arch, **k):
        raise RuntimeError("ptxas fatal: something")

    monkeypatch.setattr(kc, "compile_decode", broken)
    assert main(["compile", "--arch", "sm_90a", "--slice", "ci", "--limit", "1"]) == 1
    captured = capsys.readouterr()
    assert "COMPILE ERROR sm90-" in captured.err and "0/1 compiled" in captured.out


def test_cli_bench_compile_only_rejects_thor_options_for_hopper(monkeypatch, capsys):
    monkeypatch.setattr(kc, "compile_decode", _must_not_compile)
    assert main(["bench", "--compile-only", "--arch", "sm_90a", "--l2-prefetch", "2"]) == 2
    assert "--l2-prefetch" in capsys.readouterr().err
    assert main(["bench", "--compile-only", "--arch", "sm_90a", "--loads", "bulk", "--format", "e2m1"]) == 2
    assert "loads='bulk'" in capsys.readouterr().err
    assert main(["bench", "--compile-only", "--arch", "sm_90a", "--head-dim", "96"]) == 2
    assert "head_dim=96" in capsys.readouterr().err


# -- real compiles ------------------------------------------------------------------------------------
def _compile_and_check(cfg):
    r = kc.compile_decode(cfg, kc.HOPPER_ARCH)
    assert "decode" in r.resources, f"no ptxas report for {cfg.short_name()}"
    assert ("reduction" in r.resources) == (cfg.max_splits > 1 and cfg.merge == "kernel")
    assert "for 'sm_90a'" in r.log, "ptxas did not compile for sm_90a"
    assert ("HopperWgmmaDecodeKernel" if cfg.mma == "wgmma" else "HopperDecodeKernel") in r.log
    problems = kc.spill_regressions(r, kc.load_spill_baseline())
    assert not problems, "\n".join(problems)
    return r


@needs_cutlass
@pytest.mark.parametrize("cfg", kc.hopper_ci_slice(), ids=lambda c: c.short_name())
def test_hopper_ci_slice_compiles(cfg):
    _compile_and_check(cfg)


@needs_cutlass
def test_hopper_pdl_config_compiles():
    """PDL (griddepcontrol in both grids, launched with use_pdl) lowers for sm_90a without spills; the
    device test (test_hopper_conformance) checks its bits."""
    cfg = HopperConfig(head_dim=128, page_size=64, q_dtype="e4m3", max_splits=32, pdl=True)
    assert cfg.short_name().endswith("-pdl")
    r = _compile_and_check(cfg)
    assert r.resources["decode"].spill_stores == 0 and r.resources["reduction"].spill_stores == 0


@needs_cutlass
@pytest.mark.parametrize("merge", ["fused", "kernel"])
def test_hopper_split_merges_compile(merge):
    """The fused merge (the last CTA of a split sequence merges it, no reduction grid) and the reduction
    grid both lower for sm_90a at 32 splits and d = 256 without spills; test_hopper_conformance checks
    that they give the same bits on the device."""
    cfg = HopperConfig(head_dim=256, page_size=64, q_dtype="e4m3", max_splits=32, merge=merge)
    r = _compile_and_check(cfg)
    assert all(res.spill_stores == 0 for res in r.resources.values())
    assert sorted(r.resources) == (["decode"] if merge == "fused" else ["decode", "reduction"])


@needs_cutlass
@pytest.mark.parametrize("fmt, d", [("e4m3", 256), ("nvfp4", 128)])
def test_hopper_wgmma_configs_compile(fmt, d):
    """The experimental fp8 wgmma path lowers for sm_90a without spills (the device test checks it
    against the fp8 MMA bound)."""
    cfg = HopperConfig(head_dim=d, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, mma="wgmma")
    assert cfg.short_name().endswith("-wg")
    r = _compile_and_check(cfg)
    assert r.resources["decode"].spill_stores == 0


@needs_cutlass
@pytest.mark.parametrize("v_operand, fmt, d", [("smem", "e4m3", 256), ("f16", "e4m3", 256), ("f16", "e2m1", 128)])
def test_hopper_wgmma_v_operands_compile(v_operand, fmt, d):
    """The wgmma path's two shared-memory V^T operands (a K-major e4m3 tile, or V widened to f16 and read
    M-major) lower for sm_90a without spills; test_hopper_conformance checks them on the device."""
    cfg = HopperConfig(head_dim=d, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, mma="wgmma",
                       v_operand=v_operand)  # fmt: skip
    r = _compile_and_check(cfg)
    assert r.resources["decode"].spill_stores == 0


@needs_cutlass
@pytest.mark.parametrize("fmt, d", [("e2m1", 256), ("e3m2", 128)])
def test_hopper_exact_kv_conversion_compiles(fmt, d):
    """kv_convert="exact" (the byte tables and f16 products that "auto" replaces for e2m1 / e3m2 / e2m3)
    still lowers for sm_90a without spills; test_hopper_conformance checks on the device that both give the
    same bits."""
    cfg = HopperConfig(head_dim=d, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, q_rows=8,
                       kv_convert="exact")  # fmt: skip
    r = _compile_and_check(cfg)
    assert r.resources["decode"].spill_stores == 0


@needs_cutlass
@pytest.mark.parametrize("fmt, d, k_operand, v_convert", [
    ("e2m1", 256, "registers", "early"), ("e3m2", 128, "tile", "auto"), ("nvfp4", 128, "registers", "auto"),
    ("e2m3", 128, "registers", "late"),
])  # fmt: skip
def test_hopper_k_operand_compiles(fmt, d, k_operand, v_convert):
    """Both K paths and both V conversion points lower for sm_90a without spills where "auto" does not pick
    them (the matrix covers the defaults: registers for the scaled formats, V late at d = 256, the tile for
    NVFP4); at d = 256 the registers path keeps one CTA per SM, so ptxas is not held to 128 registers."""
    cfg = HopperConfig(head_dim=d, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, q_rows=8,
                       k_operand=k_operand, v_convert=v_convert)  # fmt: skip
    r = _compile_and_check(cfg)
    assert r.resources["decode"].spill_stores == 0


@needs_cutlass
@pytest.mark.parametrize("fmt, d, schedule, stages", [
    ("e2m1", 128, "serial", 0), ("e2m3", 256, "overlap", 0), ("e2m1", 128, "overlap", 3),
])  # fmt: skip
def test_hopper_schedule_compiles(fmt, d, schedule, stages):
    """Both tile-loop schedules lower for sm_90a without spills where "auto" does not pick them (the matrix
    covers the defaults: overlap for e2m1, serial for fp6), at d = 256 and with a three-stage ring, within
    128 registers at d = 128 (two CTAs per SM). (fp6 overlapped at d = 128 spills 4-8 bytes: not a default.)"""
    cfg = HopperConfig(head_dim=d, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, q_rows=8,
                       schedule=schedule, stages=stages)  # fmt: skip
    r = _compile_and_check(cfg)
    assert r.resources["decode"].registers <= (128 if d == 128 else 255)


@needs_cutlass
@pytest.mark.parametrize("fmt, d, schedule, ctas, max_regs", [
    ("e2m1", 128, "serial", 3, 80), ("e3m2", 128, "overlap", 0, 128), ("e2m1", 256, "serial", 2, 128),
    ("nvfp4", 256, "serial", 0, 255),
])  # fmt: skip
def test_hopper_keys_on_m_compiles(fmt, d, schedule, ctas, max_regs):
    """mma_layout="keys" lowers for sm_90a without spills, with both schedules, within the
    registers of 3 CTAs per SM at d = 128 and of 2 at d = 256 (the query-rows layout spills there)."""
    cfg = HopperConfig(head_dim=d, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, q_rows=8,
                       schedule=schedule, ctas=ctas, k_operand="registers", mma_layout="keys")  # fmt: skip
    r = _compile_and_check(cfg)
    assert r.resources["decode"].registers <= max_regs


@needs_cutlass
@pytest.mark.parametrize("loads, d, ps", [("bulk", 128, 64), ("tma", 256, 16), ("tma", 128, 128)])
def test_hopper_load_paths_compile(loads, d, ps):
    """The bulk-copy and TMA load paths (not in the matrix: options, not defaults) lower for sm_90a without
    spills; TMA at d = 256 with 16-key pages issues 16 boxes per K tile. test_hopper_conformance checks
    their bits on the device."""
    cfg = HopperConfig(head_dim=d, page_size=ps, kv_format="e4m3", q_dtype="bf16", max_splits=16, loads=loads)
    r = _compile_and_check(cfg)
    assert r.resources["decode"].spill_stores == 0


@needs_cutlass
def test_cli_hopper_gate_prints_the_table(capsys, tmp_path):
    baseline = tmp_path / "baseline.json"
    rc = main(["compile", "--arch", "sm_90a", "--slice", "ci", "--limit", "1", "--baseline", str(baseline)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 configs for sm_90a" in out and "regs" in out and "spill st/ld" in out and "1/1 compiled" in out
    assert kc.hopper_ci_slice()[0].short_name() in out
    assert not baseline.exists()  # only --update-baseline writes


@needs_cutlass
def test_cli_bench_compile_only_for_hopper(capsys):
    rc = main(["bench", "--compile-only", "--arch", "sm_90a", "--head-dim", "128", "--page-size", "128"])
    out = capsys.readouterr().out
    assert rc == 0
    # the bench's default heads give at most 8 query rows per KV head: decode() compiles q_rows=8
    name = HopperConfig(head_dim=128, page_size=128, q_dtype="bf16", max_splits=16, q_rows=8).short_name()
    assert f"{name} [decode] sm_90a" in out and "registers" in out


@needs_cutlass
def test_cli_bench_compile_only_fused_merge(capsys):
    """--merge fused compiles one grid (no [reduction] line); the default has the reduction grid."""
    args = ["bench", "--compile-only", "--arch", "sm_90a", "--head-dim", "128", "--page-size", "128"]
    assert main(args + ["--merge", "fused"]) == 0
    out = capsys.readouterr().out
    assert "-fm [decode] sm_90a" in out and "[reduction]" not in out
    assert main(args) == 0
    assert "[reduction] sm_90a" in capsys.readouterr().out


@needs_cutlass
@pytest.mark.parametrize("option, accept, suffix, refuse, error", [
    (["--v-operand", "f16"], ["--mma", "wgmma"], "-wg-vf16", [], "v_operand='f16' with mma='sync'"),
    (["--kv-convert"], ["exact", "--format", "e2m3"], "-kx", ["scaled"], "kv_convert='scaled' with kv_format='e4m3'"),
    (["--k-operand"], ["tile", "--format", "e2m1"], "-kt", ["registers"],
     "k_operand='registers' with kv_format='e4m3'"),
    (["--schedule"], ["serial", "--format", "e2m1"], "-ts", ["overlap", "--format", "nvfp4"],
     "schedule='overlap' with k_operand='auto'"),
])  # fmt: skip
def test_cli_bench_hopper_option(capsys, option, accept, suffix, refuse, error):
    """--v-operand / --kv-convert / --k-operand / --schedule name their choice in the compiled config; a config
    that cannot take it (the mma.sync path for "f16" V^T, e4m3 KV for "scaled" or K in registers, NVFP4's K
    tile for "overlap") is refused with the field named (exit 2, nothing compiled)."""
    args = ["bench", "--compile-only", "--arch", "sm_90a", "--head-dim", "128", "--page-size", "64", "--q-dtype",
            "e4m3", *option]  # fmt: skip
    assert main(args + accept) == 0
    assert f"{suffix} [decode] sm_90a" in capsys.readouterr().out
    assert main(args + refuse) == 2
    captured = capsys.readouterr()
    assert error in captured.err and "[decode]" not in captured.out


@needs_cutlass
def test_cli_bench_refuses_hopper_options_for_thor(capsys):
    """--mma / --loads / --merge / --v-operand / --kv-convert / --k-operand / --v-convert / --schedule configure
    only the Hopper kernel:
    compiling for Thor with one of them is refused with the options named, not compiled without them."""
    rc = main(["bench", "--compile-only", "--arch", "sm_110a", "--merge", "fused", "--v-operand", "f16",
               "--kv-convert", "exact", "--k-operand", "tile", "--v-convert", "late",
               "--schedule", "serial"])  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 2 and "[decode]" not in captured.out
    assert "--merge, --v-operand, --kv-convert, --k-operand, --v-convert, --schedule: Hopper-kernel options" in (
        captured.err
    )


def _spread(matrix):
    """Two configs of every (Q dtype, KV format) block of the matrix, at offsets rotating by 7 from block to
    block (so the blocks together vary head dim, page size, q_len / causal and splits)."""
    blocks = {}
    for c in matrix:
        blocks.setdefault((c.q_dtype, c.kv_format), []).append(c)
    return [block[off % len(block)] for i, block in enumerate(blocks.values()) for off in (7 * i, 7 * i + 13)]


def test_the_small_spread_covers_every_axis():
    spread = _spread(kc.hopper_matrix())
    assert len(spread) == len({c.short_name() for c in spread})
    assert {(c.q_dtype, c.kv_format) for c in spread} == {(c.q_dtype, c.kv_format) for c in kc.hopper_matrix()}
    assert {c.head_dim for c in spread} == {128, 256} and {c.page_size for c in spread} == {16, 128}
    assert {c.max_splits for c in spread} == {1, 16}
    assert {(c.q_len, c.causal) for c in spread} == {(1, True), (4, True), (4, False)}


@needs_cutlass
@pytest.mark.slow
def test_hopper_matrix_compiles():
    """The whole Hopper matrix at MJOLNIR_TEST_SIZE=full; at the default small size, which CI runs, two
    configs of every (Q dtype, KV format) pair spread over the other axes (``_spread``)."""
    matrix = kc.hopper_matrix()
    if test_size_name() != "full":
        matrix = _spread(matrix)
    failures = []
    for cfg in matrix:
        try:
            _compile_and_check(cfg)
        except Exception as e:  # collect every failing config by name
            failures.append(f"{cfg.short_name()}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    assert not failures, "\n".join(failures)
