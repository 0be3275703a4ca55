"""The host-operation probe of the emulator's CUDA code path (benchmarks/probes/emulator_host_ops.py)."""

from __future__ import annotations

from benchmarks.probes.emulator_host_ops import host_ops


def test_host_ops_attributes_eager_operations_to_their_stage():
    """The merge stage runs only where a sequence is split; the per-window stages scale with the windows; the
    compiled functions' own operations are not counted (the S chains' and tile updates' count as nothing)."""
    one, two = host_ops(tiles=2, window=2), host_ops(tiles=4, window=2)
    assert one["b32"]["reduction"] == 0 and one["b1_32_splits"]["reduction"] > 0
    assert two["b32"]["softmax_tile"] == 2 * one["b32"]["softmax_tile"] > 0
    assert two["b32"]["epilogue"] == one["b32"]["epilogue"] > 0
    assert "_tile_update" not in one["b32"] and "_int_chain" not in one["b32"]
