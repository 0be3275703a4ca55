"""The command line: compile gate table, bench without a tcgen05 GPU, bench --compile-only."""

import pytest

from mjolnir_kernel.__main__ import main
from mjolnir_kernel.arch import tcgen05_device_reason
from mjolnir_kernel.compile import cutlass_available

_NO_CUTLASS = cutlass_available()
needs_cutlass = pytest.mark.skipif(_NO_CUTLASS is not None, reason=f"needs the CuTe DSL: {_NO_CUTLASS}")


@pytest.mark.skipif(tcgen05_device_reason() is None, reason="a tcgen05 GPU is present: bench would run")
def test_bench_without_tcgen05_gpu_says_so_and_fails(capsys):
    assert main(["bench", "--seqlen", "256"]) != 0
    err = capsys.readouterr().err
    assert "tcgen05" in err and "10.x or 11.x" in err


@needs_cutlass
def test_bench_compile_only_works_anywhere(capsys):
    rc = main(
        [
            "bench",
            "--compile-only",
            "--format",
            "e4m3",
            "--head-dim",
            "128",
            "--page-size",
            "128",
            "--heads-q",
            "24",
            "--heads-k",
            "4",
            "--arch",
            "sm_110a",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "bf16-e4m3-d128-t8-ps128-q1c-c2" in out and "registers" in out


@needs_cutlass
def test_compile_gate_prints_the_table(capsys, tmp_path):
    baseline = tmp_path / "baseline.json"
    baseline.write_text("{}")
    rc = main(["compile", "--arch", "sm_110a", "--slice", "ci", "--limit", "1", "--baseline", str(baseline)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "regs" in out and "spill st/ld" in out and "1/1 compiled" in out
    assert baseline.read_text() == "{}"  # only --update-baseline writes


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["bench", "--batch", "-1"], "--batch"),
        (["bench", "--q-len", "0"], "--q-len"),
        (["bench", "--heads-k", "0"], "--heads-k"),
        (["bench", "--iterations", "0"], "--iterations"),
        (["bench", "--compile-only", "--heads-q", "3", "--heads-k", "2"], "--heads-q"),
        (["bench", "--q-len", "9", "--seqlen", "8"], "--q-len"),
        (["bench", "--page-size", "24"], "--page-size"),
        (["conform", "--jobs", "0"], "--jobs"),
        (["conform", "--max-keys", "0"], "--max-keys"),
        (["conform", "--formats", "e3m2,e5m2"], "--formats"),
        (["conform", "--head-dims", "96"], "--head-dims"),
        (["conform", "--head-dims", "128,x"], "--head-dims"),
        (["compile", "--smem-per-sm", "-5"], "--smem-per-sm"),
        (["compile", "--limit", "1.5"], "--limit"),
        (["compile", "--baseline", "/nonexistent/bl.json"], "--baseline"),
        (["compile", "--baseline", "/nonexistent/bl.json", "--update-baseline"], "--update-baseline"),
        (["bogus"], "invalid choice"),
    ],
)
def test_bad_flags_exit_2_with_one_line_before_any_work(argv, flag, capsys, tmp_path):
    """Every flag is checked before the GPU is looked for or anything compiles: exit 2, one stderr line
    naming the flag, no usage block, no traceback."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and flag in err and "Traceback" not in err


def test_a_corrupt_baseline_is_refused_before_compiling(capsys, tmp_path):
    bad = tmp_path / "bl.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit) as e:
        main(["compile", "--limit", "1", "--baseline", str(bad)])
    assert e.value.code == 2 and "--baseline" in capsys.readouterr().err
