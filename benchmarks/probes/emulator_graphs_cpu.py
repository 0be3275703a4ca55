"""Probe (issue 24): the CUDA-graph paths of the emulator checked on the CPU before a GPU run. The emulator's
stages are compiled by inductor for the CPU (the MMA chains eager, for time), and a stand-in for the CUDA graph
traces the captured body once under ``torch.compiler.set_stance("fail_on_recompile")`` without running it (a
capture records, it does not execute), then runs it at every replay. A guard that would miss at capture (the
compiled stage recompiling, which fails a real capture) raises here, and the result must be the CPU path's bits.
This is the check that would have caught the window graphs' view of the running max before the H100 run of
2026-12-06.

    python -m benchmarks.probes.emulator_graphs_cpu window   # the window graphs of the emulator's CUDA path
"""

from __future__ import annotations

import sys
import time
import warnings
from unittest import mock

import torch


class _TracedWindowGraph:
    """``emulator._WindowGraph`` on the CPU: the capture traces the body on copies of the state, a replay runs it."""

    def __init__(self, body, m, l, o):
        self.body, self.state = body, (m.clone(), l.clone(), o.clone())
        self.base = torch.zeros((), dtype=torch.long)
        with torch.compiler.set_stance("fail_on_recompile"):
            body(self.base, *[t.clone() for t in self.state])
        _EVENTS.append("capture")

    def replay(self, s0, m, l, o):
        if m is not self.state[0]:
            for x, y in zip(self.state, (m, l, o)):
                x.copy_(y)
        self.base.fill_(s0)
        with torch.compiler.set_stance("fail_on_recompile"):
            new = self.body(self.base, *self.state)
        for x, y in zip(self.state, new):
            x.copy_(y)
        _EVENTS.append("replay")
        return self.state

    def close(self):
        pass


_EVENTS: list = []
# name: target. 3 unsplit sequences of 6 tiles each: the pinned random e4m3 cache with e4m3 or bf16 Q (the
# latter also under Thor's models), e2m1 / NVFP4 caches of random K and V with e4m3 Q; then the e4m3 cache with
# 12 tiles each ("long": two windows of 6) and with 12, 6 and 2 tiles ("ragged": chunks that end inside a window)
CASES = {
    "random_e4m3": "h200", "random_bf16": "h200", "random_bf16 ": "thor", "e2m1": "h200", "nvfp4": "h200",
    "long_e4m3": "h200", "ragged_e4m3": "h200",
}  # fmt: skip


def _inputs(name: str):
    """``(q, cache, kwargs)`` of case ``name`` on the CPU, ``kwargs`` with ``chunk_tiles`` and the Q descale."""
    from mjolnir_numerics.cache import PagedKVCache
    from mjolnir_numerics.scales import quantize_q
    from tests.numerics.test_emulator import _random_pinned_inputs

    name = name.strip()
    if name.startswith("random_"):
        q, cache, kw = _random_pinned_inputs(e4m3_q=name == "random_e4m3")
    elif name in ("long_e4m3", "ragged_e4m3"):
        import dataclasses

        from benchmarks.bench_emulator import random_e4m3_cache

        q, _, kw = _random_pinned_inputs(e4m3_q=True)
        lens = (1536, 1536, 1536) if name == "long_e4m3" else (1500, 700, 130)
        cache = random_e4m3_cache(3, max(lens), 2, 128, 16, "cpu")
        cache = dataclasses.replace(cache, seq_lens=torch.tensor(lens, dtype=torch.int32))
        return q, cache, {**kw, "chunk_tiles": 12}
    else:
        gen = torch.Generator().manual_seed(2)
        k, v = (torch.randn(3, 768, 2, 128, generator=gen) * 2 for _ in range(2))
        cache = PagedKVCache.from_float(k, v, name, page_size=16, device="cpu")
        q = (torch.randn(3, 12, 128, generator=gen) * 3).to(torch.bfloat16)
        q, q_descale = quantize_q(q, 3, 1, 2)
        kw = {"q_descale": q_descale}
    return q, cache, {**kw, "chunk_tiles": 6}


def main(argv=None) -> int:
    import mjolnir_numerics.emulator as emulator
    from benchmarks.probes.emulator_compiled_cpu import cuda_code_path_patches
    from mjolnir_numerics import emulate_decode
    from tests.numerics.test_emulator import _digest

    args = sys.argv[1:] if argv is None else argv
    kind = args[0] if args else ""
    if kind != "window":
        print("emulator_graphs_cpu: give 'window'", file=sys.stderr)
        return 2

    inputs = {name: _inputs(name) for name in CASES}  # one problem per case, called again with the same tensors

    def run(name):
        q, cache, kw = inputs[name]
        return _digest(*emulate_decode(q, cache, **kw, target=CASES[name]))

    wants = {name: run(name) for name in CASES}  # the CPU path's bits
    patches = [
        *cuda_code_path_patches(1),
        mock.patch.object(emulator, "_window_graphs_available", lambda device: True),
        mock.patch.object(emulator, "_WindowGraph", _TracedWindowGraph),
    ]
    failed = 0
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="emulate_decode: capturing")  # a failed capture is a failure
        for p in patches:
            p.start()
        try:
            # each case twice: the second call replays the graphs the first kept, and captures its first window
            for name, call in ((name, call) for name in CASES for call in (1, 2)):
                t0 = time.perf_counter()
                _EVENTS.clear()
                same = run(name) == wants[name]
                failed += not same or (not _EVENTS and not name.startswith("ragged"))  # ragged: may not capture
                line = (
                    f"{kind} graphs, {name.strip()}/{CASES[name]}, call {call}: "
                    f"{'the CPU path bits' if same else 'BITS DIFFER'}, "
                )
                events = f"window graphs: {_EVENTS.count('capture')} captured, {_EVENTS.count('replay')} replays"
                print(line + f"{events if _EVENTS else 'NO CAPTURE'}  {time.perf_counter() - t0:.1f} s", flush=True)
        finally:
            for p in patches:
                p.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
