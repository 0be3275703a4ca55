"""mjolnir_kernel.sass: loops and instruction mix of the kernels' machine code, on any machine.

The parser is checked on hand-written cuobjdump text; the real disassembly (compile with the CuTe DSL,
cuobjdump) runs where the DSL and cuobjdump / nvdisasm are installed (the ``kernel`` extra) and skips
with the reason otherwise. The instruction budgets pin what made the Hopper kernel's sub-byte formats
faster (a table-lookup NVFP4 conversion): a change that brings back a costlier conversion fails here,
before any GPU time is spent."""

from dataclasses import replace

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


# Instruction budgets of the Hopper tile loop at d = 128, as multiples of the e4m3 loop (measured 2026-11-29
# with nvidia-cutlass-dsl 4.8.1: NVFP4 663 / 374 = 1.77, e2m1 566 / 374 = 1.51; NVFP4's earlier
# f16-arithmetic conversion took 1069 / 379 = 2.8)
NVFP4_LOOP_BUDGET = 1.9
E2M1_LOOP_BUDGET = 1.6

_REASON = kc.cutlass_available() or sass.sass_tools()[1]
needs_tools = pytest.mark.skipif(_REASON is not None, reason=f"SASS checks need the DSL and cuobjdump: {_REASON}")


def _tile_loop(fmt: str, q_rows: int = 16) -> sass.Loop:
    cfg = HopperConfig(head_dim=128, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, q_rows=q_rows)
    loops = sass.kernel_loops(cfg, kc.HOPPER_ARCH)
    assert len(loops) == 1, [lp.summary() for lp in loops]  # the Hopper kernel has one innermost loop
    return loops[0]


@needs_tools
def test_hopper_tile_loop_and_its_instruction_budgets():
    """The e4m3 tile loop at d = 128 holds its 32 MMAs (16 for S, 16 for P.V per warp) and 8 cp.async;
    NVFP4's loop, which converts each tile through a per-block table, and e2m1's stay within their
    budgets (NVFP4_LOOP_BUDGET, E2M1_LOOP_BUDGET times the e4m3 loop)."""
    e4m3, nvfp4, e2m1 = (_tile_loop(f) for f in ("e4m3", "nvfp4", "e2m1"))
    mix = dict(e4m3.opcodes)
    assert mix["HMMA"] == 32 and mix["LDGSTS"] == 8
    assert dict(nvfp4.opcodes)["HMMA"] == 32
    assert nvfp4.instructions <= NVFP4_LOOP_BUDGET * e4m3.instructions, (nvfp4.summary(), e4m3.summary())
    assert e2m1.instructions <= E2M1_LOOP_BUDGET * e4m3.instructions, (e2m1.summary(), e4m3.summary())


# q_rows=8 (n_q <= 8: rows 8-15 of the MMA tile are padding) measured 292 / 362 = 0.81 of the 16-row loop
# (e4m3, d = 128, 2026-11-29): half the softmax, row-sum, P-conversion and rescale work
EIGHT_ROW_LOOP_BUDGET = 0.85


@needs_tools
def test_eight_row_tile_loop_skips_the_padding_rows():
    full, eight = _tile_loop("e4m3"), _tile_loop("e4m3", q_rows=8)
    assert eight.instructions <= EIGHT_ROW_LOOP_BUDGET * full.instructions, (eight.summary(), full.summary())
    f, e = dict(full.opcodes), dict(eight.opcodes)
    assert e["HMMA"] == f["HMMA"] == 32  # the MMAs still cover 16 rows (m16n8k16)
    assert e["F2FP"] == f["F2FP"] - 4  # P: 4 of 8 pairs converted (K and V: 64 either way)


@needs_tools
def test_wgmma_tile_loop_feeds_e4m3_bytes_straight_to_the_tensor_cores():
    """The experimental fp8 wgmma path (keys on M): per warp and tile 4 S and 4 P.V wgmma k-steps at d = 128
    and no widening: no HMMA, and F2FP only for P's four e4m3 pairs (the mma.sync loop has 72)."""
    cfg = HopperConfig(head_dim=128, page_size=64, kv_format="e4m3", q_dtype="e4m3", max_splits=16, mma="wgmma")
    loops = sass.kernel_loops(cfg, kc.HOPPER_ARCH)
    assert len(loops) == 1, [lp.summary() for lp in loops]
    mix = dict(loops[0].opcodes)
    assert mix.get("QGMMA") == 8 and "HMMA" not in mix and mix.get("F2FP") == 4, loops[0].summary()


@needs_tools
def test_cli_sass_prints_the_loops(capsys):
    rc = main(["bench", "--arch", "sm_90a", "--format", "e4m3", "--q-dtype", "e4m3", "--head-dim", "128", "--sass"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "innermost loops, largest first" in out and "HMMA 32" in out


# kv_convert="scaled" against "exact": tile-loop instructions on the ALU pipe (F2FP, PRMT, LOP3, SHF), the
# pipe the H200 profile shows busiest for the sub-byte formats (measured 2026-11-30, d = 128, 16 rows:
# e2m1 204 / 249 = 0.82, e3m2 332 / 457 = 0.73, e2m3 303 / 521 = 0.58)
SCALED_ALU_BUDGET = {"e2m1": 0.85, "e3m2": 0.78, "e2m3": 0.65}
ALU_OPCODES = ("F2FP", "PRMT", "LOP3", "SHF")


@needs_tools
@pytest.mark.parametrize("fmt", sorted(SCALED_ALU_BUDGET))
def test_scaled_kv_conversion_takes_fewer_alu_instructions(fmt):
    """The scaled conversion places each code's bits instead of looking them up (e2m1) or multiplying and
    rounding them through f16 (fp6): its tile loop converts no value to e4m3 (as many F2FP as the e4m3
    loop: the MMA's unpacks), and its ALU-pipe instructions stay within SCALED_ALU_BUDGET of "exact"."""

    def loop(conv):
        cfg = HopperConfig(head_dim=128, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16, kv_convert=conv,
                           k_operand="tile")  # fmt: skip
        return dict(sass.kernel_loops(cfg, kc.HOPPER_ARCH)[0].opcodes)

    exact, scaled, e4m3 = loop("exact"), loop("scaled"), dict(_tile_loop("e4m3").opcodes)
    assert scaled["F2FP"] == e4m3["F2FP"], (scaled, e4m3)
    alu = {name: sum(mix.get(op, 0) for op in ALU_OPCODES) for name, mix in (("exact", exact), ("scaled", scaled))}
    assert alu["scaled"] <= SCALED_ALU_BUDGET[fmt] * alu["exact"], alu


@needs_tools
@pytest.mark.parametrize("fmt", ("e2m1", "e3m2", "e2m3", "nvfp4"))
def test_k_registers_path_drops_the_k_tile(fmt):
    """``k_operand="registers"``: no K tile in shared memory, so the tile loop loses K's e4m3 stores, K's
    ldmatrix and a block barrier, and is shorter than the tile path's."""

    def loop(k_operand):
        cfg = HopperConfig(head_dim=128, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16,
                           k_operand=k_operand, schedule="serial")  # fmt: skip
        return sass.kernel_loops(cfg, kc.HOPPER_ARCH)[0]

    tile, regs = loop("tile"), loop("registers")
    t, r = dict(tile.opcodes), dict(regs.opcodes)
    assert r["BAR"] == t["BAR"] - 1, (t, r)
    assert r["LDSM"] == t["LDSM"] - 4, (t, r)  # d = 128: K's four ldmatrix.x4 per warp and tile
    assert r["STS"] == t["STS"] - 4, (t, r)  # K's four 16-byte e4m3 stores per thread and tile
    assert regs.instructions < tile.instructions, (tile.summary(), regs.summary())


@needs_tools
@pytest.mark.parametrize("fmt", ("e2m1", "e3m2"))
def test_overlap_schedule_keeps_the_work_and_drops_a_barrier(fmt):
    """``schedule="overlap"`` runs the same tile work (MMAs, conversions, shared-memory loads and stores) with
    two block barriers per tile instead of three: P.V of a tile shares the next tile's S barriers."""

    def loop(schedule):
        cfg = HopperConfig(head_dim=128, page_size=64, kv_format=fmt, q_dtype="e4m3", max_splits=16,
                           schedule=schedule)  # fmt: skip
        return sass.kernel_loops(cfg, kc.HOPPER_ARCH)[0]

    serial, overlap = loop("serial"), loop("overlap")
    s, o = dict(serial.opcodes), dict(overlap.opcodes)
    assert o["BAR"] == s["BAR"] - 1 == 2, (s, o)
    for op in ("HMMA", "F2FP", "LDSM", "STS"):
        assert o[op] == s[op], (op, s, o)


@needs_tools
def test_e2m1_v_tile_takes_no_byte_permutes():
    """Scaled e2m1 stores V's e4m3 tile with each 8 head dims as even then odd ones (O's columns are put
    back once after the loop), so the tile loop's only byte permutes are P.V's regrouping of ldmatrix.trans
    registers: one per register, 16 per tile at d = 128 (the interleaved tile took 16 more)."""
    cfg = HopperConfig(head_dim=128, page_size=64, kv_format="e2m1", q_dtype="e4m3", max_splits=16, q_rows=8)
    assert dict(sass.kernel_loops(cfg, kc.HOPPER_ARCH)[0].opcodes)["PRMT"] == 16


@needs_tools
def test_keys_on_m_halves_the_mmas():
    """mma_layout="keys": the 8 query rows fill the MMA's N, so each warp issues 16 MMAs per tile instead of 32
    (8 for S, 8 for P.V at d = 128) and loads P with half the ldmatrix."""
    cfg = HopperConfig(head_dim=128, page_size=64, kv_format="e2m1", q_dtype="e4m3", max_splits=16, q_rows=8)
    rows = dict(sass.kernel_loops(cfg, kc.HOPPER_ARCH)[0].opcodes)
    keys = dict(sass.kernel_loops(replace(cfg, mma_layout="keys"), kc.HOPPER_ARCH)[0].opcodes)
    assert rows["HMMA"] == 32 and keys["HMMA"] == 16, (rows, keys)
    assert keys["LDSM"] == rows["LDSM"] - 4, (rows, keys)
