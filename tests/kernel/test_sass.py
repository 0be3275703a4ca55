"""mjolnir_kernel.sass: loops and instruction mix of the kernels' machine code, on any machine.

The parser is checked on hand-written cuobjdump text; the real disassembly (compile with the CuTe DSL,
cuobjdump) runs where the DSL and cuobjdump / nvdisasm are installed (the ``kernel`` extra) and skips
with the reason otherwise. The instruction budgets pin what made the Hopper kernel's sub-byte formats
faster (a table-lookup NVFP4 conversion): a change that brings back a costlier conversion fails here,
before any GPU time is spent."""

import pytest

from mjolnir_kernel import compile as kc
from mjolnir_kernel import sass
from mjolnir_kernel.__main__ import main
from mjolnir_kernel.hopper.config import HopperConfig

SASS = """
        code for sm_90a
                Function : kernel_cutlass_kernel_SplitReduction_object
        .headerflags    @"EF_CUDA_SM90"
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   BRA 0x0 ;
                Function : kernel_cutlass_kernel_HopperDecodeKernel_object
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDS R2, [R1] ;
        /*0020*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0030*/               @!P0 IMAD.SHL.U32 R5, R6, 0x4, RZ ;
        /*0040*/                   FADD R7, R7, 1 ;
        /*0050*/               @P1 BRA 0x30 ;
        /*0060*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*0070*/               @P0 BRA 0x10 ;
        /*0080*/                   EXIT ;
        /*0090*/                   BRA 0x90 ;
"""


def test_parse_loops_finds_nested_loops_and_counts_opcodes():
    loops = sass.parse_loops(SASS, "DecodeKernel")
    assert [(lp.start, lp.end) for lp in loops] == [(0x10, 0x70), (0x30, 0x50)]  # largest first
    outer, inner = loops
    assert outer.instructions == 7 and dict(outer.opcodes) == {"HMMA": 2, "LDS": 1, "IMAD": 1, "FADD": 1, "BRA": 2}
    assert dict(inner.opcodes) == {"IMAD": 1, "FADD": 1, "BRA": 1}  # predicate and modifiers dropped
    assert inner.innermost and not outer.innermost
    assert sass.parse_loops(SASS, "DecodeKernel", innermost_only=True) == [inner]
    assert "loop 0x10..0x70: 7 instructions (HMMA 2, BRA 2" in outer.summary()
    # the branch to itself after EXIT is not a loop; the reduction's BRA 0x0 at 0x10 is one
    assert [(lp.start, lp.end) for lp in sass.parse_loops(SASS, "SplitReduction")] == [(0x0, 0x10)]


def test_parse_loops_names_a_missing_function():
    with pytest.raises(ValueError, match="function_contains='ThorDecodeKernel'.*HopperDecodeKernel"):
        sass.parse_loops(SASS, "ThorDecodeKernel")


def test_missing_tools_are_named(monkeypatch):
    monkeypatch.setattr(sass.shutil, "which", lambda name, path=None: None)
    path, reason = sass.sass_tools()
    assert path is None and "cuobjdump and nvdisasm not found" in reason
    with pytest.raises(RuntimeError, match="sass: cuobjdump and nvdisasm not found"):
        sass.disassemble(HopperConfig(), kc.HOPPER_ARCH)


# Instruction budgets of the Hopper tile loops at d = 128, as multiples of the e4m3 loop (nvidia-cutlass-dsl
# 4.8.1): e2m1's loop (566 / 374 = 1.51 on 2026-11-29, 467 / 374 = 1.25 on 2026-12-07) and the converter warps'
# loop per thread (2026-12-07: NVFP4 663 / 374 = 1.77, e3m2 746 / 374 = 1.99, e2m3 682 / 374 = 1.82). The MMA
# warps' loop of the converter formats runs the e4m3 path without the loads: at most the e4m3 loop.
E2M1_LOOP_BUDGET = 1.6
CONVERTER_LOOP_BUDGET = {"nvfp4": 1.9, "e3m2": 2.1, "e2m3": 2.0}
CONVERTER_FORMATS = tuple(CONVERTER_LOOP_BUDGET)

_REASON = kc.cutlass_available() or sass.sass_tools()[1]
needs_tools = pytest.mark.skipif(_REASON is not None, reason=f"SASS checks need the DSL and cuobjdump: {_REASON}")


def _loops(fmt: str, q_tile: int = 16) -> tuple:
    """(the MMA warps' tile loop, the converter warps' tile loop or None) of the kernel at d = 128."""
    cfg = HopperConfig(head_dim=128, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, q_tile=q_tile)
    loops = sass.kernel_loops(cfg, kc.HOPPER_ARCH)
    summary = [lp.summary() for lp in loops]
    # one innermost loop, and with converter warps a second one of theirs, with no MMA
    assert len(loops) == 1 + cfg.converters, summary
    mma = [lp for lp in loops if dict(lp.opcodes).get("HMMA")]
    assert len(mma) == 1, summary
    other = [lp for lp in loops if lp is not mma[0]]
    return mma[0], (other[0] if other else None)


def _tile_loop(fmt: str, q_tile: int = 16) -> sass.Loop:
    return _loops(fmt, q_tile)[0]


@needs_tools
def test_hopper_tile_loop_and_its_instruction_budgets():
    """The e4m3 tile loop at d = 128 holds its 32 MMAs (16 for S, 16 for P.V per warp) and 8 cp.async;
    e2m1's loop stays within E2M1_LOOP_BUDGET times it."""
    e4m3, e2m1 = _tile_loop("e4m3"), _tile_loop("e2m1")
    mix = dict(e4m3.opcodes)
    assert mix["HMMA"] == 32 and mix["LDGSTS"] == 8
    assert e2m1.instructions <= E2M1_LOOP_BUDGET * e4m3.instructions, (e2m1.summary(), e4m3.summary())


@needs_tools
@pytest.mark.parametrize("fmt", CONVERTER_FORMATS)
def test_converter_warps_loads_and_converts_and_the_mma_warps_multiply(fmt):
    """fp6 and NVFP4 at d = 128 (``HopperConfig.converters``): the MMA warps' loop holds the 32 MMAs and no
    load, within the e4m3 loop's instructions; the converter warps' loop holds every cp.async and no MMA,
    within CONVERTER_LOOP_BUDGET times the e4m3 loop."""
    e4m3 = _tile_loop("e4m3")
    mma, conv = _loops(fmt)
    assert dict(mma.opcodes)["HMMA"] == 32 and dict(mma.opcodes).get("LDGSTS", 0) == 0, mma.summary()
    assert mma.instructions <= e4m3.instructions, (mma.summary(), e4m3.summary())
    assert dict(conv.opcodes).get("HMMA", 0) == 0 and dict(conv.opcodes)["LDGSTS"] > 0, conv.summary()
    # the converters' barrier before refilling the ring, the wait for a free pair, the arrival on a full one
    assert dict(conv.opcodes)["BAR"] == 3, conv.summary()
    assert conv.instructions <= CONVERTER_LOOP_BUDGET[fmt] * e4m3.instructions, (conv.summary(), e4m3.summary())


# q_tile=8 (n_q <= 8: rows 8-15 of the MMA tile are padding) measured 292 / 362 = 0.81 of the 16-row loop
# (e4m3, d = 128, 2026-11-29): half the softmax, row-sum, P-conversion and rescale work
EIGHT_ROW_LOOP_BUDGET = 0.85


@needs_tools
def test_eight_row_tile_loop_skips_the_padding_rows():
    full, eight = _tile_loop("e4m3"), _tile_loop("e4m3", q_tile=8)
    assert eight.instructions <= EIGHT_ROW_LOOP_BUDGET * full.instructions, (eight.summary(), full.summary())
    f, e = dict(full.opcodes), dict(eight.opcodes)
    assert e["HMMA"] == f["HMMA"] == 32  # the MMAs still cover 16 rows (m16n8k16)
    assert e["F2FP"] == f["F2FP"] - 4  # P: 4 of 8 pairs converted (K and V: 64 either way)


@needs_tools
def test_cli_sass_prints_the_loops(capsys):
    rc = main(["bench", "--arch", "sm_90a", "--format", "e4m3", "--q-dtype", "e4m3", "--head-dim", "128", "--sass"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "innermost loops, largest first" in out and "HMMA 32" in out


@needs_tools
@pytest.mark.parametrize("fmt", ("e2m1", "e3m2", "e2m3"))
def test_scaled_kv_conversion_rounds_nothing(fmt):
    """The scaled conversion places each code's bits (HopperConfig.scaled_kv): the tile loops convert no
    value to e4m3, so they have as many F2FP as the e4m3 loop (the MMA's unpacks of K, V and P)."""
    f2fp = sum(dict(lp.opcodes).get("F2FP", 0) for lp in _loops(fmt) if lp is not None)
    assert f2fp == dict(_tile_loop("e4m3").opcodes)["F2FP"]


# Barriers per tile of the MMA warps' loop (d = 128): the ring's, the row max's and the softmax's (P complete)
# for e4m3; with converter warps (fp6, NVFP4) the wait for a converted tile pair, the row max's, the
# softmax's and the arrival that frees the pair; two with the overlapped schedule (e2m1: P.V of a tile shares
# the next tile's barriers, and the row-max barrier completes V's tile)
TILE_BARRIERS = {"e4m3": 3, "nvfp4": 4, "e3m2": 4, "e2m3": 4, "e2m1": 2}


@needs_tools
@pytest.mark.parametrize("fmt", sorted(TILE_BARRIERS))
def test_tile_walk_barriers(fmt):
    assert dict(_tile_loop(fmt).opcodes)["BAR"] == TILE_BARRIERS[fmt], _tile_loop(fmt).summary()


@needs_tools
def test_e2m1_v_tile_takes_no_byte_permutes():
    """Scaled e2m1 stores V's e4m3 tile with each 8 head dims as even then odd ones (O's columns are put
    back once after the loop), so the tile loop's only byte permutes are P.V's regrouping of ldmatrix.trans
    registers: one per register, 16 per tile at d = 128 (the interleaved tile took 16 more)."""
    assert dict(_tile_loop("e2m1", q_tile=8).opcodes)["PRMT"] == 16
