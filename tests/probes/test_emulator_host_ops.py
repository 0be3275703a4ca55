"""The host-operation probe of the emulator's CUDA code path (benchmarks/probes/emulator_host_ops.py)."""

from __future__ import annotations

from benchmarks.probes.emulator_host_ops import host_ops

# What CUDA compiles: none of their operations is eager (until 2026-12-06 the ex2 models, the epilogue and the
# split merge were: 1,867 eager operations for the merge of 32 splits, 317 for the epilogue)
_COMPILED = ("_window_softmax", "softmax_tile", "row_sum_correction", "round_p", "running_column_max", "mask_tile",
             "_final", "epilogue", "reduce_row_sum", "reduction", "_tile_update", "_int_chain")  # fmt: skip


def test_host_ops_attributes_eager_operations_to_their_stage():
    """The per-window work (the tile sources) scales with the windows, the per-call work does not; the compiled
    stages' own operations are not counted, also where the sequences are split (the merge)."""
    one, two = host_ops(tiles=2, window=2), host_ops(tiles=4, window=2)
    assert two["b32"]["__init__"] == 2 * one["b32"]["__init__"] > 0  # the K and V tile sources, per window
    assert two["b32"]["_check_cache"] == one["b32"]["_check_cache"] > 0
    for case in ("b32", "b1_32_splits"):
        assert not set(_COMPILED) & set(one[case]), case
    assert sum(one["b1_32_splits"].values()) < 400  # the eager merge alone was 1,867
