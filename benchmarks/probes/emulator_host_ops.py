"""Probe (issue 24): the torch operations ``emulate_decode`` runs on the host outside its compiled graphs on
CUDA, counted per stage, on any machine.

On CUDA the emulator is bound by its host (reports/emulator/2026-12-06-host-bound.md): every eager torch
operation is a kernel launch costing the host microseconds, whatever its size. This probe runs the CUDA code
path on the CPU (several tiles per window, the MMA chains as the fused formula, the branch-free stages: what
``test_cuda_code_paths_give_the_pinned_bits_on_the_cpu`` runs), counts every operation dispatched outside the
functions CUDA compiles (``arithmetic._fused`` / ``emulator._fused``; views and allocations not counted), and
attributes each to the stage ``_emulate`` called (the tile sources' search for pages shared by sequences is
counted too, though only the CPU runs it). The counts do not depend on the sizes, only on the numbers of
tiles, windows and splits, so small shapes give the big rows' counts:

* ``b32``: 32 sequences, one chunk each (the plan of b32 x 4K and b32 x 32K: no split), 24/4 heads, d = 256;
* ``b1_32_splits``: one sequence in 32 chunks (the plan of b1 x 128K), merged by the reduction stage;
* ``b32_nvfp4``: ``b32``'s plan with an NVFP4 cache, 32/8 heads, d = 128. Its tile sources decode pages in
  chunks (of CUDA's size here), so its counts grow with the pages per window once they pass a chunk (16M
  values); and its ``quantize`` runs the CPU's loop, where CUDA launches one kernel: its count is an upper
  bound on CUDA's.

It also times, on this machine's host, what ``fused.compiled_many`` spends around each call to raise torch's
recompile limits: ``torch._dynamo.config.patch`` (what it used until 2026-12-06) against setting and restoring
the two limits directly (what it does now).

    python -m benchmarks.probes.emulator_host_ops [--tiles 4] [--window 2]
"""

from __future__ import annotations

import argparse
import collections
import sys
import traceback
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operations that launch nothing on CUDA (views, metadata, allocations).
_FREE = (
    "aten.view.default", "aten.slice.Tensor", "aten.select.int", "aten.as_strided.default", "aten.unsqueeze.default",
    "aten.expand.default", "aten._unsafe_view.default", "aten.t.default", "aten.transpose.int", "aten.alias.default",
    "aten.detach.default", "aten.empty.memory_format", "aten.empty_strided.default", "aten.permute.default",
    "aten.squeeze.dim", "aten.unflatten.int", "aten.split_with_sizes.default", "aten.split.Tensor",
)  # fmt: skip


class _StageCounter(TorchDispatchMode):
    """Counts the operations dispatched while no compiled function runs, by the stage ``_emulate`` called."""

    def __init__(self, inside):
        super().__init__()
        self.inside = inside
        self.by_stage = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside[0] and str(func) not in _FREE:
            names = [f.name for f in traceback.extract_stack(limit=40) if "mjolnir_numerics" in f.filename]
            stage = "?"
            if "_emulate" in names:
                i = names.index("_emulate")
                if names[i + 1 : i + 2] == ["window_pass"]:  # _emulate's per-window steps, as one nested function
                    i += 1
                stage = names[i + 1] if i + 1 < len(names) else "_emulate (its own lines)"
            self.by_stage[stage] += 1
        return func(*args, **(kwargs or {}))


def count(q, cache, inside, **kw) -> collections.Counter:
    from mjolnir_numerics.emulator import emulate_decode

    emulate_decode(q, cache, **kw)  # warm caches (tables, constants)
    counter = _StageCounter(inside)
    with counter:
        emulate_decode(q, cache, **kw)
    return counter.by_stage


def host_ops(tiles: int = 4, window: int = 2) -> dict[str, collections.Counter]:
    """The two cases of the module doc: ``{case: Counter(stage -> eager operations)}``."""
    import mjolnir_numerics.arithmetic as arithmetic
    import mjolnir_numerics.cache as cache_module
    import mjolnir_numerics.emulator as emulator
    import mjolnir_numerics.emulator_stages as stages
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.scales import quantize_q

    inside = [False]

    def fused(fn, tune=False):  # the compiled functions, evaluated eagerly and not counted
        def call(*a):
            inside[0] = True
            try:
                return fn(*a)
            finally:
                inside[0] = False

        return call

    gen = torch.Generator().manual_seed(0)

    def case(b, n_tiles, hq, hk, d, fmt="e4m3"):
        L = 128 * n_tiles
        k, v = torch.randn(b, L, hk, d, generator=gen), torch.randn(b, L, hk, d, generator=gen)
        top = 448 * (6 if fmt == "nvfp4" else 1)
        kd, vd = k.abs().amax((0, 1, 3)) / top, v.abs().amax((0, 1, 3)) / top
        cache = PagedKVCache.from_float(k, v, fmt, page_size=64, granularity="per_head", k_descale=kd, v_descale=vd)
        q, q_descale = quantize_q(torch.randn(b, hq, d, generator=gen).to(torch.bfloat16), b, 1, hk)
        return q, cache, q_descale

    patches = [
        mock.patch.object(emulator, "_window", lambda *a: window),
        mock.patch.object(emulator, "fused_chain_available", lambda device: True),
        mock.patch.object(arithmetic, "fused_chain_available", lambda device: True),
        mock.patch.object(arithmetic, "_fused", fused),
        mock.patch.object(emulator, "_fused", fused),
        mock.patch.object(stages, "_sync_free", lambda x: True),
        mock.patch.object(cache_module, "_PAGE_VALUES_CHUNK", cache_module._PAGE_VALUES_CHUNK_CUDA),  # as on CUDA
    ]
    for p in patches:
        p.start()
    try:
        q, cache, qd = case(32, tiles, 24, 4, 256)
        rows = {"b32": count(q, cache, inside, q_descale=qd, target="h200", chunk_tiles=0)}
        q, cache, qd = case(1, 32, 24, 4, 256)
        rows["b1_32_splits"] = count(q, cache, inside, q_descale=qd, target="h200", chunk_tiles=1)
        q, cache, qd = case(32, tiles, 32, 8, 128, "nvfp4")
        rows["b32_nvfp4"] = count(q, cache, inside, q_descale=qd, target="h200", chunk_tiles=0)
    finally:
        for p in patches:
            p.stop()
    return rows


def limit_patch_cost(calls: int = 10_000) -> tuple[float, float]:
    """Microseconds per call: ``torch._dynamo.config.patch`` of the two recompile limits entered and left,
    and the two limits set and restored directly."""
    import time

    cfg = torch._dynamo.config
    t0 = time.perf_counter()
    for _ in range(calls):
        with cfg.patch(recompile_limit=512, accumulated_recompile_limit=8192):
            pass
    t1 = time.perf_counter()
    for _ in range(calls):
        saved = cfg.recompile_limit, cfg.accumulated_recompile_limit
        cfg.recompile_limit, cfg.accumulated_recompile_limit = 512, 8192
        cfg.recompile_limit, cfg.accumulated_recompile_limit = saved
    t2 = time.perf_counter()
    return 1e6 * (t1 - t0) / calls, 1e6 * (t2 - t1) / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiles", type=int, default=4, help="128-key tiles per sequence of the b32 case")
    ap.add_argument("--window", type=int, default=2, help="tiles per window (CUDA sizes it by memory)")
    args = ap.parse_args(argv)
    rows = host_ops(args.tiles, args.window)
    windows = -(-args.tiles // args.window)
    print(f"# eager torch operations outside the compiled graphs, per emulate_decode call (CUDA code path on "
          f"{torch.__version__}'s CPU)")  # fmt: skip
    print(f"# b32, b32_nvfp4: 32 chunks x {args.tiles} tiles, {windows} windows; b1_32_splits: 32 chunks x 1 tile, "
          "one window")  # fmt: skip
    stages_seen = sorted(set().union(*rows.values()), key=lambda s: -max(r[s] for r in rows.values()))
    print(f"{'stage':28s}" + "".join(f"{name:>14s}" for name in rows))
    for s in stages_seen:
        print(f"{s:28s}" + "".join(f"{r[s]:14d}" for r in rows.values()))
    print(f"{'total':28s}" + "".join(f"{sum(r.values()):14d}" for r in rows.values()))
    patch_us, direct_us = limit_patch_cost()
    print(f"# recompile limits around each compiled call: config.patch {patch_us:.1f} us, set and restore "
          f"{direct_us:.1f} us")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
