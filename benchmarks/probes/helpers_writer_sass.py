"""The cache writer's machine code per encoding, on any machine (no GPU): the sm_90a SASS of
:class:`mjolnir_kernel.helpers_kernel.CacheWriteKernel` for bfloat16 rows, each format's codes by the kernel's
own way and by the round-to-odd table, as instruction counts and the opcodes that tell them apart (LDG: global
loads, 16 of them the table's lookups where it is in global memory; LDS: shared-memory loads; F2FP: the fp8
conversions; CALL: the ``div.rn.f32`` routine).

Two static counts: the whole kernel (one 16-value chunk's straight-line code with its fast and its slow
division, the slow one's routine and the trap stubs), and its fast path, the instructions from the entry to
the first unpredicated EXIT, what a thread of an ordinary prefill issues (the writer's bfloat16 prefills are
bound by these: reports/helpers/2026-12-07-e2m1-table.md). Until 2026-12-07 the probe compiled the fast
division forced on, which also dropped the block's ``max |x|`` from the element formats' fast path (only the
check used it): 29-31 instructions fewer than a prefill runs (NVFP4, whose scale needs ``max |x|``: 5). The
time the table's lookups cost depends on the cache lines the codes touch, which only a GPU measures
(``benchmarks.probes.helpers_writer_parts``).

    python -m benchmarks.probes.helpers_writer_sass      # CUTE_DSL_ARCH=sm_90a on a machine without a GPU
"""

import collections

import cuda.bindings.driver as cuda
import cutlass.cute as cute

from mjolnir_kernel import helpers, sass
from mjolnir_kernel import helpers_kernel as hk
from mjolnir_numerics.formats import FORMATS

ROWS = (
    ("e4m3", False, {}, "cvt"),
    ("e3m2", False, {}, "fp8"),
    ("e3m2", False, {"FP6_BY_FP8": {}}, "table"),
    ("e2m3", False, {}, "fp8"),
    ("e2m3", False, {"FP6_BY_FP8": {}}, "table"),
    ("e2m1", False, {}, "table"),
    ("e2m1", False, {"E2M1_INDEX_SHIFT": 16}, "64K table"),
    ("e2m1", True, {}, "table"),
    ("e2m1", True, {"E2M1_INDEX_SHIFT": 16}, "64K table"),
)


def writer_sass(element: str, nvfp4: bool, patch: dict) -> str:
    """The SASS of the writer for bfloat16 rows of ``element`` (NVFP4 where ``nvfp4``) with module attributes of
    ``helpers_kernel`` replaced by ``patch`` while it is traced."""
    saved = {name: getattr(hk, name) for name in patch}
    for name, value in patch.items():
        setattr(hk, name, value)
    try:
        pool = ("u8", helpers._STORE_ALIGN[FORMATS[element].bits])
        ptrs = (("f32", 16), ("f32", 16), ("u8", 8), ("u8", 8), ("f32", 4), ("f32", 4), ("u8", 1), pool, pool,
                ("u8", 1), ("u8", 1))  # fmt: skip
        kernel = hk.CacheWriteKernel(element, nvfp4, True, False, True, 0.125)
        args = [helpers._pointer(kind, 1 << 20, align) for kind, align in ptrs]
        scalars = (*hk.writer_scalars(), cuda.CUstream(0))
        options = "--gpu-arch sm_90a --keep-cubin --dump-dir {}"
        return sass.disassemble_compiled(lambda d: cute.compile(kernel, *args, *scalars, options=options.format(d)))
    finally:
        for name, value in saved.items():
            setattr(hk, name, value)


def main():
    print("the cache writer, bfloat16 rows; sm_90a SASS of the whole kernel, and its fast path")
    for element, nvfp4, patch, name in ROWS:
        text = writer_sass(element, nvfp4, patch)
        lines = [m.group(2).strip() for line in text.splitlines() if (m := sass._LINE.match(line))]
        ops = [sass._opcode(line).split(".")[0] for line in lines]
        fast = next(i for i, line in enumerate(lines) if line.startswith("EXIT")) + 1
        h = collections.Counter(ops)
        print(f"{'nvfp4' if nvfp4 else element:6s} {name:10s} instructions {len(ops):4d}  fast path {fast:4d}  "
              f"LDG {h['LDG']:2d} LDS {h['LDS']:2d} STG {h['STG']} F2FP {h['F2FP']} MUFU {h['MUFU']} "
              f"CALL {h['CALL']}")  # fmt: skip


if __name__ == "__main__":
    main()
