"""The phase benchmark's reading of ncu's per-instruction source export, without a GPU: stretches between
block barriers are named by what they hold, and their samples become shares of the whole."""

import pytest

from benchmarks.probes import phase_samples as ps

HEADER = '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"'


def _export(rows):
    lines = ['"Kernel Name","HopperDecodeKernel"', HEADER]
    lines += [f'"0x{16 * i:x}","{src}","{n}","0"' for i, (src, n) in enumerate(rows)]
    return "\n".join(lines) + "\n"


LOOP = [
    ("LDG.E R2, desc[UR4][R2.64]", 1), ("STS [R1], RZ", 1), ("BAR.SYNC.DEFER_BLOCKING 0x0", 0),  # prologue
    ("LDS.64 R4, [R3]", 10), ("LOP3.LUT R5, R4, 0x1c1c1c1c, RZ, 0xc0, !PT", 20), ("PRMT R6, R5, 0x5140, R7", 5),
    ("STS.128 [R8], R4", 5), ("BAR.SYNC.DEFER_BLOCKING 0x0", 0),  # convert: 40
    ("LDSM.16.M88.4 R12, [R7]", 5), ("HMMA.16816.F32 R20, R12, R16, R20", 15), ("FMNMX.NAN R1, R1, R2, !PT", 5),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", 5),  # S = QK: 30
    ("MUFU.EX2 R3, R3", 6), ("STS [R9], R3", 4), ("BAR.SYNC.DEFER_BLOCKING 0x0", 0),  # softmax: 10
    ("LDSM.16.MT88.4 R16, [R3+0xc000]", 8), ("@P0 HMMA.16816.F32 R24, R12, R16, R24", 10),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", 0),  # P.V: 18
    ("FADD R1, R1, R2", 0),  # epilogue
]  # fmt: skip


def test_phases_are_named_and_shared():
    shares = ps.phase_shares(_export(LOOP))
    assert shares == pytest.approx(
        {"convert": 40.0, "conv+QK": 0.0, "S = QK": 30.0, "softmax": 10.0, "P.V": 18.0, "other": 2.0}
    )


def test_a_stretch_that_converts_and_multiplies_is_its_own_phase():
    """K in registers (HopperConfig.k_registers): V's tile is converted (16-byte stores) in the stretch of the
    QK MMAs."""
    stretch = [("LOP3.LUT R5, R4, 0x1c1c1c1c, RZ, 0xc0, !PT", 20), ("STS.128 [R8], R4", 5),
               ("HMMA.16816.F32 R20, R12, R16, R20", 15), ("BAR.SYNC.DEFER_BLOCKING 0x0", 0)]  # fmt: skip
    rows = LOOP[:3] + stretch + LOOP[12:]
    shares = ps.phase_shares(_export(rows))
    assert shares["conv+QK"] == pytest.approx(100 * 40 / 70) and shares["convert"] == 0 == shares["S = QK"]


STALL_HEADER = HEADER + ',"stall_wait","stall_barrier","stall_mio","stall_wait (Not Issued)"'


def test_stall_reasons_are_summed_per_phase():
    """Each phase's stall columns add up over its instructions; reasons under the threshold are dropped and
    the "(Not Issued)" copies are not counted twice."""
    lines = ['"Kernel Name","HopperDecodeKernel"', STALL_HEADER]
    rows = [("STS [R1], RZ", 2, 1, 1, 0), ("BAR.SYNC.DEFER_BLOCKING 0x0", 0, 0, 0, 0),  # prologue
            ("LDSM.16.M88.4 R12, [R7]", 50, 40, 0, 1), ("HMMA.16816.F32 R20, R12, R16, R20", 30, 20, 0, 0),
            ("BAR.SYNC.DEFER_BLOCKING 0x0", 0, 20, 0, 0)]  # fmt: skip
    for i, (src, wait, bar, mio, _) in enumerate(rows):
        n = wait + bar + mio
        lines.append(f'"0x{16 * i:x}","{src}","{n}","0","{wait}","{bar}","{mio}","{wait}"')
    table = ps.phase_table("\n".join(lines) + "\n")
    assert table["S = QK"] == {ps.SAMPLES: 160, "stall_wait": 80, "stall_barrier": 80, "stall_mio": 0}
    reasons, shares = ps.stall_shares(table, min_share=1.0)
    assert reasons == ["wait", "barrier"]  # mio: 1 of 164 samples, under 1 %
    assert shares["S = QK"] == pytest.approx({"wait": 100 * 80 / 164, "barrier": 100 * 80 / 164})


def test_the_prologue_is_other_even_when_it_stores_and_permutes():
    rows = [("PRMT R1, R2, 0x3120, R2", 3), ("STS [R1], RZ", 1), ("BAR.SYNC.DEFER_BLOCKING 0x0", 0)] + LOOP[3:]
    assert ps.phase_shares(_export(rows))["other"] == pytest.approx(100 * 4 / 102)  # 4 of 102 samples


def test_an_export_without_samples_is_refused():
    with pytest.raises(ValueError, match="no samples"):
        ps.phase_shares(_export([(src, 0) for src, _ in LOOP]))
    with pytest.raises(ValueError, match="no 'Warp Stall Sampling"):
        ps.phase_shares('"Address","Source"\n"0x0","NOP"\n')


def test_bad_arguments_are_named(capsys):
    with pytest.raises(SystemExit):
        ps.main(["--formats", "int4"])
    assert "--formats" in capsys.readouterr().err
