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
    rc = main(["compile", "--arch", "sm_110a", "--slice", "ci", "--limit", "1", "--baseline", str(baseline)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "regs" in out and "spill st/ld" in out and "1/1 compiled" in out
    assert not baseline.exists()  # only --update-baseline writes
