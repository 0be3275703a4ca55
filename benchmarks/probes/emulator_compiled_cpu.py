"""Probe (issue 24): the emulator's CUDA code path with its graphs compiled by inductor on the CPU, against the
pinned digests of the CPU path.

On CUDA the emulator runs its stages as ``torch.compile`` graphs (the MMA chains, the tile updates, steps 4-8
per window, the epilogue, the split merge). This runs that code path on the CPU with the same graphs compiled
for the CPU (the MMA chains themselves eager, for time): it shows that the stages trace into whole graphs and
that inductor's rewrites keep the bits, as far as the CPU's compiler shows it (the GPU run of
``tests/numerics/test_emulator.py::test_cpu_and_cuda_are_bit_identical`` is the proof for Triton). The first
case compiles for several minutes on this project's 2-core machine.

    python -m benchmarks.probes.emulator_compiled_cpu [KEY ...]    # keys of PINNED_HW_DIGESTS, e.g. forced_splits/h200
"""

from __future__ import annotations

import sys
import time
from unittest import mock


def cuda_code_path_patches(window: int) -> list:
    """The ``mock.patch`` objects (not started) that send the emulator down its CUDA code path on the CPU:
    windows of ``window`` tiles, the fused chains taken (and run eagerly, for time), the stages' sync-free
    forms. The other graph probes share them."""
    import mjolnir_numerics.arithmetic as arithmetic
    import mjolnir_numerics.emulator as emulator
    import mjolnir_numerics.emulator_stages as stages

    return [
        mock.patch.object(emulator, "_window", lambda *a: window),
        mock.patch.object(emulator, "fused_chain_available", lambda device: True),
        mock.patch.object(arithmetic, "fused_chain_available", lambda device: True),
        mock.patch.object(arithmetic, "_fused", lambda fn, tune=False: fn),  # the chains eager
        mock.patch.object(stages, "_sync_free", lambda x: True),
    ]


def main(argv=None) -> int:
    from mjolnir_numerics import emulate_decode
    from mjolnir_numerics.cases import get_case
    from tests.numerics.test_emulator import PINNED_HW_DIGESTS, _digest, _random_pinned_inputs

    keys = (sys.argv[1:] if argv is None else argv) or ["forced_splits/h200", "random_bf16/h200", "random_e4m3/h200"]
    patches = cuda_code_path_patches(3)
    for p in patches:
        p.start()
    failed = 0
    try:
        for key in keys:
            name, target = key.split("/")
            t0 = time.perf_counter()
            if name.startswith("random_"):
                q, cache, kw = _random_pinned_inputs(e4m3_q=name == "random_e4m3")
            else:
                x = get_case(name).build()
                q, cache, kw = x.q, x.cache, x.emulator_kwargs()
            same = _digest(*emulate_decode(q, cache, **kw, target=target)) == PINNED_HW_DIGESTS[key]
            failed += not same
            print(f"{key:28s} {'pinned bits' if same else 'BITS DIFFER'}  {time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        for p in patches:
            p.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
