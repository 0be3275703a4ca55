"""The compile gate, for both kernels: each compiles its config matrix on any machine (no GPU), ptxas
resources stay within the checked-in spill baseline, invalid configs and mismatched archs are rejected
before compiling, and ``python -m mjolnir_kernel compile`` fails on a spill, a compile error or an empty
selection."""

import json

import pytest

from conftest import test_size_name
from mjolnir_kernel import compile as kc
from mjolnir_kernel.__main__ import main
from mjolnir_kernel.config import ConfigError, default_config
from mjolnir_kernel.hopper.config import HopperConfig
from mjolnir_kernel.thor.config import ThorConfig
from mjolnir_numerics.capability import KV_FORMATS

_NO_CUTLASS = kc.cutlass_available()
needs_cutlass = pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"compile gate skipped: {_NO_CUTLASS}")
ARCHS = ("sm_110a", "sm_100a", "sm_90a")
CONFIG_OF = {"sm_110a": ThorConfig, "sm_100a": ThorConfig, "sm_90a": HopperConfig}

_PTXAS_SAMPLE = """
ptxas info    : Compiling entry function
          'kernel_cutlass_kernel_mjolnir_kernelreductionSplitReduction_object_at__x_1'
          for 'sm_110a'
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 56 registers, used 0 barriers
ptxas info    : Compiling entry function 'kernel_cutlass_kernel_thordecode_kernelThorDecodeKernel_0' for 'sm_110a'
ptxas         .     88 bytes stack frame, 176 bytes spill stores, 140 bytes spill loads
ptxas info    : Used 80 registers, used 4 barriers, 88 bytes cumulative stack size
"""


def _must_not_compile(*a, **k):
    raise AssertionError("compile started")


def test_ptxas_report_parsing():
    r = kc.parse_ptxas_report(_PTXAS_SAMPLE)
    assert r["reduction"] == kc.KernelResources(56, 0, 0, 0)
    assert r["decode"] == kc.KernelResources(80, 88, 176, 140)


# -- the matrix, the CI slice, the baseline (no compiling) --------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_matrix_spans_every_axis_with_the_default_configs(arch):
    matrix = kc.compile_matrix(arch)
    names = [c.short_name() for c in matrix]
    assert len(names) == len(set(names)) == 24 * (1 + len(KV_FORMATS)) == 144
    assert all(type(c) is CONFIG_OF[arch] for c in matrix)
    # bf16 Q reads e4m3 only, e4m3 Q every format
    assert {(c.q_dtype, c.kv_format) for c in matrix} == {("bf16", "e4m3")} | {("e4m3", f) for f in KV_FORMATS}
    assert {c.head_dim for c in matrix} == {128, 256} and {c.page_size for c in matrix} == {16, 128}
    assert {(c.q_len, c.causal) for c in matrix} == {(1, True), (4, True), (4, False)}
    assert {c.max_splits for c in matrix} == {1, 16}
    target = kc.target_of_arch(arch)
    for c in matrix:  # each is what decode() compiles for that problem (n_q = q_len * 6)
        shape = dict(head_dim=c.head_dim, page_size=c.page_size, q_len=c.q_len, kv_format=c.kv_format)
        again = default_config(target, **shape, q_dtype=c.q_dtype, n_q=6 * c.q_len, causal=c.causal,
                               max_splits=c.max_splits)  # fmt: skip
        assert again == c


@pytest.mark.parametrize("arch", ARCHS)
def test_ci_slice_covers_the_axes_and_is_in_the_matrix(arch):
    ci = kc.ci_slice(arch)
    assert {c.short_name() for c in ci} <= {c.short_name() for c in kc.compile_matrix(arch)}
    assert {c.q_dtype for c in ci} == {"bf16", "e4m3"} and {c.head_dim for c in ci} == {128, 256}
    assert {c.page_size for c in ci} == {16, 128}
    assert {(4, True), (4, False)} <= {(c.q_len, c.causal) for c in ci}
    assert {c.max_splits > 1 for c in ci} == {True, False}
    assert {"nvfp4", "e2m3"} <= {c.kv_format for c in ci}  # the packed formats' loaders


@pytest.mark.parametrize("arch", ARCHS)
def test_checked_in_baseline_covers_the_matrix(arch):
    base = kc.load_spill_baseline().get(arch, {})
    matrix = kc.compile_matrix(arch)
    missing = sorted(c.short_name() for c in matrix if c.short_name() not in base)
    assert not missing, (
        f"spill baseline lacks {len(missing)} {arch} configs (e.g. {missing[:3]}): run "
        f"`python -m mjolnir_kernel compile --arch {arch} --update-baseline`"
    )
    for c in matrix:
        entry = base[c.short_name()]
        assert "decode" in entry and ("reduction" in entry) == (c.max_splits > 1), c.short_name()
    assert all(n.startswith("sm90-") == (arch == "sm_90a") for n in base)


def test_spill_regression_detection():
    cfg = ThorConfig()
    res = kc.CompileResult(cfg, "sm_110a", 1.0, {"decode": kc.KernelResources(80, 8, 8, 8)})
    assert kc.spill_regressions(res, {}) != []  # absent from the baseline: no spills allowed
    base = {"sm_110a": {cfg.short_name(): kc.baseline_entry(res)}}
    assert kc.spill_regressions(res, base) == []
    worse = kc.CompileResult(cfg, "sm_110a", 1.0, {"decode": kc.KernelResources(80, 16, 16, 16)})
    assert "spills 16 B" in kc.spill_regressions(worse, base)[0]


# -- rejection before compiling -------------------------------------------------------------------------
def test_invalid_configs_are_rejected_before_compiling(monkeypatch):
    monkeypatch.setattr(kc, "compile_only_args", _must_not_compile)
    with pytest.raises(ConfigError, match="kv_format='nvfp4' with q_dtype='bf16'"):
        kc.compile_decode(ThorConfig(q_dtype="bf16", kv_format="nvfp4", head_dim=256), "sm_110a")
    with pytest.raises(ConfigError, match="page_size: 48"):
        kc.compile_decode(ThorConfig(page_size=48), "sm_110a")
    with pytest.raises(ConfigError, match="head_dim: 96"):
        kc.compile_decode(HopperConfig(head_dim=96), "sm_90a")
    with pytest.raises(ConfigError, match="e2m3 KV runs only with e4m3 Q"):
        kc.compile_decode(HopperConfig(kv_format="e2m3", q_dtype="bf16"), "sm_90a")


@pytest.mark.parametrize("cfg, arch", [(HopperConfig(), "sm_110a"), (HopperConfig(), "sm_100a"),
                                       (ThorConfig(), "sm_90a")])  # fmt: skip
def test_a_config_with_the_other_kernels_arch_is_rejected(monkeypatch, cfg, arch):
    monkeypatch.setattr(kc, "compile_only_args", _must_not_compile)
    with pytest.raises(ValueError, match=rf"^arch: '{arch}' does not run the {type(cfg).__name__} kernel"):
        kc.compile_decode(cfg, arch)


def test_gate_dispatches_by_arch():
    for arch in ARCHS:
        assert kc.gate_configs(arch, "ci") == kc.ci_slice(arch)
        assert kc.gate_configs(arch) == kc.compile_matrix(arch)
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


def _fake_result(cfg, arch, spill_stores):
    res = {"decode": kc.KernelResources(128, spill_stores, spill_stores, spill_stores)}
    if cfg.max_splits > 1:
        res["reduction"] = kc.KernelResources(56, 0, 0, 0)
    return kc.CompileResult(cfg, arch, 0.1, res)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_110a"])
def test_cli_gate_fails_on_a_spill_regression(monkeypatch, capsys, tmp_path, arch):
    """The exit code logic, with ptxas's answer faked: 0 spills pass, 16 B over an empty baseline fail."""
    seen = []

    def fake(cfg, a, **k):
        seen.append((cfg, a))
        return _fake_result(cfg, a, 16 if cfg == kc.ci_slice(arch)[1] else 0)

    monkeypatch.setattr(kc, "compile_decode", fake)
    baseline = tmp_path / "baseline.json"
    baseline.write_text("{}")
    assert main(["compile", "--arch", arch, "--slice", "ci", "--baseline", str(baseline)]) == 1
    captured = capsys.readouterr()
    assert [c for c, _ in seen] == kc.ci_slice(arch) and {a for _, a in seen} == {arch}
    assert "SPILL REGRESSION " + kc.ci_slice(arch)[1].short_name() in captured.err
    assert f"{len(seen)}/{len(seen)} compiled" in captured.out
    # recorded in the baseline, the same spills pass
    assert main(["compile", "--arch", arch, "--slice", "ci", "--baseline", str(baseline), "--update-baseline"]) == 0
    assert main(["compile", "--arch", arch, "--slice", "ci", "--baseline", str(baseline)]) == 0


def test_cli_full_update_drops_stale_entries(monkeypatch, capsys, tmp_path):
    """A full, unfiltered --update-baseline records every config and drops names the matrix no longer has
    (e.g. after a default change renamed them); other archs' entries stay."""
    monkeypatch.setattr(kc, "compile_decode", lambda cfg, arch, **k: _fake_result(cfg, arch, 0))
    baseline = tmp_path / "baseline.json"
    thor = {"bf16-e4m3-d128-t8-ps128-q1c-c2-r0-s16": {"decode": {"spill_stores": 8}}}
    baseline.write_text(json.dumps({"sm_90a": {"sm90-stale-r9": {}}, "sm_110a": thor}))
    assert main(["compile", "--arch", "sm_90a", "--baseline", str(baseline)]) == 0
    assert "1 sm_90a baseline entries are not in the matrix, e.g. sm90-stale-r9" in capsys.readouterr().out
    assert "sm90-stale-r9" in json.loads(baseline.read_text())["sm_90a"]  # only --update-baseline writes
    assert main(["compile", "--arch", "sm_90a", "--baseline", str(baseline), "--update-baseline"]) == 0
    written = json.loads(baseline.read_text())
    assert set(written["sm_90a"]) == {c.short_name() for c in kc.compile_matrix("sm_90a")}
    assert written["sm_110a"] == thor


def test_cli_gate_fails_on_a_compile_error(monkeypatch, capsys):
    def broken(cfg, arch, **k):
        raise RuntimeError("ptxas fatal: something")

    monkeypatch.setattr(kc, "compile_decode", broken)
    assert main(["compile", "--arch", "sm_90a", "--slice", "ci", "--limit", "1"]) == 1
    captured = capsys.readouterr()
    assert "COMPILE ERROR sm90-" in captured.err and "0/1 compiled" in captured.out


def test_cli_gate_fails_when_it_would_compile_nothing(monkeypatch, capsys):
    """A --filter that matches no config, or a negative --limit, is an error (exit 2), not a green gate."""
    monkeypatch.setattr(kc, "compile_decode", _must_not_compile)
    assert main(["compile", "--arch", "sm_90a", "--filter", "no-such-config"]) == 2
    assert "no full sm_90a config matches --filter" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["compile", "--arch", "sm_90a", "--limit", "-1"])
    assert e.value.code == 2 and "--limit" in capsys.readouterr().err


def test_cli_bench_compile_only_refuses_thor_knobs_for_hopper(monkeypatch, capsys):
    monkeypatch.setattr(kc, "compile_decode", _must_not_compile)
    assert main(["bench", "--compile-only", "--arch", "sm_90a", "--ring-stages", "3"]) == 2
    assert "--ring-stages: tuning knobs of the Thor kernel" in capsys.readouterr().err
    assert main(["bench", "--compile-only", "--arch", "sm_90a", "--ctas-per-sm", "1"]) == 2
    assert "--ctas-per-sm" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # not a head dim of the kernels: refused by the parser
        main(["bench", "--compile-only", "--arch", "sm_90a", "--head-dim", "96"])
    assert e.value.code == 2 and "--head-dim: invalid choice: 96" in capsys.readouterr().err


# -- real compiles ------------------------------------------------------------------------------------
def _compile_and_check(cfg, arch):
    r = kc.compile_decode(cfg, arch)
    assert "decode" in r.resources, f"no ptxas report for {cfg.short_name()} ({arch})"
    assert ("reduction" in r.resources) == (cfg.max_splits > 1)
    assert f"for '{arch}'" in r.log, f"ptxas did not compile for {arch}"
    problems = kc.spill_regressions(r, kc.load_spill_baseline())
    assert not problems, "\n".join(problems)
    return r


@needs_cutlass
@pytest.mark.parametrize("arch, i", [(a, i) for a in ("sm_110a", "sm_90a") for i in range(5)])
def test_ci_slice_compiles(arch, i):
    _compile_and_check(kc.ci_slice(arch)[i], arch)


@needs_cutlass
def test_compiles_for_b200():
    _compile_and_check(kc.ci_slice("sm_100a")[0], "sm_100a")


@needs_cutlass
def test_known_seed_spills_are_gone():
    """The seed spilled 176 B (nvfp4, 2 CTAs/SM) and 104 B (e4m3 Q, q_len 4); these configs spill none."""
    nvfp4 = ThorConfig(head_dim=256, q_tile=16, page_size=128, kv_format="nvfp4", q_dtype="e4m3")
    q4 = ThorConfig(head_dim=256, q_tile=32, page_size=128, q_len=4, kv_format="e4m3", q_dtype="e4m3")
    for cfg in (nvfp4, q4):
        r = kc.compile_decode(cfg, "sm_110a")
        assert r.resources["decode"].spill_stores == 0, cfg.short_name()


@needs_cutlass
def test_hopper_pdl_config_compiles():
    """PDL (griddepcontrol in both grids, launched with use_pdl) lowers for sm_90a without spills; the
    device test (test_hopper_conformance) checks its bits."""
    cfg = HopperConfig(head_dim=128, page_size=64, q_dtype="e4m3", max_splits=32, pdl=True)
    assert cfg.short_name().endswith("-pdl")
    r = _compile_and_check(cfg, "sm_90a")
    assert r.resources["decode"].spill_stores == 0 and r.resources["reduction"].spill_stores == 0


@needs_cutlass
@pytest.mark.parametrize("fmt, head_dim", [("e3m2", 128), ("e2m3", 128), ("nvfp4", 128), ("nvfp4", 256)])
def test_hopper_converter_warp_kernel_compiles_without_spills(fmt, head_dim):
    """fp6 at d = 128 and NVFP4 (``HopperConfig.converters``): 384 threads at one CTA per SM leave up to 168
    registers a thread; this config (the benchmark's page size 64, 32 slots) lowers for sm_90a within them with
    no spill (NVFP4 at d = 256 spilled 32 B while four warps converted K and V in one pass; other NVFP4 configs
    at d = 256 spill 4-24 B, recorded in the spill baseline), and has two tile loops (the converter warps' and
    the MMA warps')."""
    from mjolnir_kernel.sass import kernel_loops, sass_tools

    cfg = HopperConfig(head_dim=head_dim, page_size=64, kv_format=fmt, q_dtype="e4m3", q_tile=8, max_splits=32)
    assert cfg.converters
    r = kc.compile_decode(cfg, "sm_90a")
    assert r.resources["decode"].spill_stores == 0 and r.resources["decode"].registers <= 65536 // cfg.threads
    if sass_tools()[0] is not None:
        loops = kernel_loops(cfg, "sm_90a")
        hmma = [lp for lp in loops if dict(lp.opcodes).get("HMMA")]
        converts = [lp for lp in loops if dict(lp.opcodes).get("STS") and not dict(lp.opcodes).get("HMMA")]
        assert len(hmma) == 1 and len(converts) == 1, [lp.summary() for lp in loops]


@needs_cutlass
def test_cli_gate_prints_the_table(capsys, tmp_path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text("{}")
    rc = main(["compile", "--arch", "sm_90a", "--slice", "ci", "--limit", "1", "--baseline", str(baseline)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "1 configs for sm_90a" in out and "regs" in out and "spill st/ld" in out and "1/1 compiled" in out
    assert kc.ci_slice("sm_90a")[0].short_name() in out
    assert baseline.read_text() == "{}"  # only --update-baseline writes


@needs_cutlass
def test_cli_bench_compile_only_compiles_the_default_config(capsys):
    rc = main(["bench", "--compile-only", "--arch", "sm_90a", "--head-dim", "128", "--page-size", "128"])
    out = capsys.readouterr().out
    assert rc == 0
    # the bench's default heads (24 / 4) give 6 query rows per KV head: decode() compiles an 8-row tile
    name = HopperConfig(head_dim=128, page_size=128, q_dtype="bf16", max_splits=32, q_tile=8).short_name()
    assert f"{name} [decode] sm_90a" in out and f"{name} [reduction] sm_90a" in out and "registers" in out


def _spread(matrix):
    """Two configs of every (Q dtype, KV format) block of the matrix, at offsets rotating by 7 from block to
    block (so the blocks together vary head dim, page size, q_len / causal and splits)."""
    blocks = {}
    for c in matrix:
        blocks.setdefault((c.q_dtype, c.kv_format), []).append(c)
    return [block[off % len(block)] for i, block in enumerate(blocks.values()) for off in (7 * i, 7 * i + 13)]


def test_the_small_spread_covers_every_axis():
    matrix = kc.compile_matrix("sm_90a")
    spread = _spread(matrix)
    assert len(spread) == len({c.short_name() for c in spread})
    assert {(c.q_dtype, c.kv_format) for c in spread} == {(c.q_dtype, c.kv_format) for c in matrix}
    assert {c.head_dim for c in spread} == {128, 256} and {c.page_size for c in spread} == {16, 128}
    assert {c.max_splits for c in spread} == {1, 16}
    assert {(c.q_len, c.causal) for c in spread} == {(1, True), (4, True), (4, False)}


@needs_cutlass
@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_full_matrix_compiles(arch):
    """The whole matrix at MJOLNIR_TEST_SIZE=full; at the default small size, which CI runs, two configs of
    every (Q dtype, KV format) pair spread over the other axes (``_spread``)."""
    matrix = kc.compile_matrix(arch)
    if test_size_name() != "full":
        matrix = _spread(matrix)
    failures = []
    for cfg in matrix:
        try:
            _compile_and_check(cfg, arch)
        except Exception as e:  # collect every failing config by name
            failures.append(f"{cfg.short_name()}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    assert not failures, "\n".join(failures)
