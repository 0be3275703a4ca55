"""The machine code of a decode kernel, read on any machine (no GPU): its loops and their instruction mix.

A decode kernel that is bound by instructions rather than bytes (the Hopper kernel on sub-byte formats,
where each tile is converted before the MMAs) runs at the speed of its tile loop's instruction count,
so that count is a measure of a change that any machine can take, before any GPU time is spent; for
the Thor kernel, which no machine here can run, it is the only one. ``kernel_loops`` compiles a config
with the CuTe DSL (keeping the cubin), disassembles it with ``cuobjdump -sass`` and returns every loop
of the decode kernel (a backward branch and the straight-line code it closes), largest first, with its
instruction count and opcode histogram. A static count: code a loop branches around (masks on full
tiles, rescales when no max moved) is counted too.

``cuobjdump`` and the ``nvdisasm`` it calls come from the CUDA toolkit on PATH or from the
``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm`` wheels (the ``kernel`` extra installs them).

    python -m mjolnir_kernel sass --arch sm_90a --format nvfp4 --head-dim 128
"""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Optional

_LINE = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.+?)\s*;")
_BRANCH = re.compile(r"\bBRA(?:\.[A-Z0-9_.]+)?\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)")


@dataclass(frozen=True)
class Loop:
    """One loop of a kernel's SASS: the instructions from a backward branch's target to the branch."""

    function: str
    start: int  # byte offset of the first instruction
    end: int  # byte offset of the backward branch
    opcodes: tuple  # ((opcode, count), ...), most frequent first
    innermost: bool = True  # no other loop lies inside this one

    @property
    def instructions(self) -> int:
        return sum(n for _, n in self.opcodes)

    def summary(self, top: int = 12) -> str:
        mix = ", ".join(f"{op} {n}" for op, n in self.opcodes[:top])
        return f"loop {self.start:#x}..{self.end:#x}: {self.instructions} instructions ({mix})"


def _opcode(text: str) -> str:
    """``@!P0 IMAD.SHL.U32 R1, R2, 0x4, RZ`` -> ``IMAD``: the mnemonic without predicate or modifiers."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def parse_loops(sass: str, function_contains: str = "", innermost_only: bool = False) -> list[Loop]:
    """Every loop of the functions of ``sass`` (``cuobjdump -sass`` text) whose name contains
    ``function_contains``, largest first (only those with no loop inside with ``innermost_only``). A
    branch to itself (the idle loop after EXIT) is not a loop. Raises ValueError if no such function is
    in the text."""
    functions: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        m = _FUNCTION.match(line)
        if m:
            current = m.group(1)
            functions[current] = []
            continue
        m = _LINE.match(line)
        if m and current is not None:
            functions[current].append((int(m.group(1), 16), m.group(2)))
    chosen = {name: ins for name, ins in functions.items() if function_contains in name}
    if not chosen:
        raise ValueError(
            f"function_contains={function_contains!r}: no such function in the SASS (functions: {sorted(functions)})"
        )
    loops = []
    for name, ins in chosen.items():
        index = {addr: i for i, (addr, _) in enumerate(ins)}
        for i, (addr, text) in enumerate(ins):
            b = _BRANCH.search(text)
            if b is None:
                continue
            target = int(b.group(1), 16)
            if target < addr and target in index:
                body = ins[index[target] : i + 1]
                counts = collections.Counter(_opcode(t) for _, t in body)
                loops.append(Loop(name, target, addr, tuple(counts.most_common())))
    spans = [(lp.function, lp.start, lp.end) for lp in loops]
    loops = [
        Loop(lp.function, lp.start, lp.end, lp.opcodes, not any(
            f == lp.function and lp.start <= s0 and e0 <= lp.end and (s0, e0) != (lp.start, lp.end)
            for f, s0, e0 in spans
        ))
        for lp in loops
    ]  # fmt: skip
    if innermost_only:
        loops = [lp for lp in loops if lp.innermost]
    loops.sort(key=lambda lp: -lp.instructions)
    return loops


def sass_tools() -> tuple[Optional[str], Optional[str]]:
    """``(cuobjdump path, None)``, or ``(None, reason)`` when cuobjdump or nvdisasm cannot be found on
    PATH or in the nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm wheels."""
    dirs = []
    try:
        import nvidia

        for root in getattr(nvidia, "__path__", []):
            dirs += sorted(glob.glob(os.path.join(root, "cu*", "bin")))
    except ImportError:
        pass
    search = os.pathsep.join(dirs + [os.environ.get("PATH", "")])
    cuobjdump = shutil.which("cuobjdump", path=search)
    nvdisasm = shutil.which("nvdisasm", path=search)
    if cuobjdump is None or nvdisasm is None:
        missing = " and ".join(n for n, p in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if p is None)
        return None, f"{missing} not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or a CUDA toolkit)"
    return cuobjdump, None


def disassemble(config, arch: str) -> str:
    """``cuobjdump -sass`` of ``config``'s kernels compiled for ``arch`` (a fresh compile; cubin kept in a
    temporary directory). Raises RuntimeError when the tools are missing or cuobjdump fails."""
    from .compile import compile_decode

    return disassemble_compiled(lambda cubin_dir: compile_decode(config, arch, cubin_dir=cubin_dir))


def disassemble_compiled(compile_into) -> str:
    """``cuobjdump -sass`` of the one cubin that ``compile_into(cubin_dir)`` leaves in a temporary directory
    (any kernel compiled with the DSL's ``--keep-cubin --dump-dir``). Raises RuntimeError when the tools are
    missing, the compile leaves no single cubin, or cuobjdump fails."""
    cuobjdump, reason = sass_tools()
    if cuobjdump is None:
        raise RuntimeError(f"sass: {reason}")
    with tempfile.TemporaryDirectory(prefix="mjolnir-sass-") as tmp:
        compile_into(tmp)
        cubins = glob.glob(os.path.join(tmp, "*.cubin"))
        if len(cubins) != 1:
            raise RuntimeError(f"sass: expected one cubin from the compile, found {len(cubins)} in {tmp}")
        env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(cuobjdump), os.environ.get("PATH", "")]))
        done = subprocess.run([cuobjdump, "-sass", cubins[0]], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"sass: cuobjdump failed: {done.stderr.strip()[:500]}")
        return done.stdout


def kernel_loops(config, arch: str, innermost_only: bool = True) -> list[Loop]:
    """The loops of ``config``'s decode kernel compiled for ``arch``, largest first; by default only the
    innermost ones (for the Hopper kernel the first is the tile loop; the Thor kernel's warp roles each
    have their own)."""
    return parse_loops(disassemble(config, arch), "DecodeKernel", innermost_only)
