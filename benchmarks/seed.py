"""Load pure-PyTorch definitions from the seed (``../shared/seed/t5_decode.py``) to measure against.

The seed imports cutlass at top level, so it cannot be imported on a machine without it: the requested
top-level definitions (functions, classes, constants) are pulled out of its syntax tree and executed in
a namespace holding ``torch`` and ``math``. The seed is a baseline only; nothing in the packages uses it.
"""

from __future__ import annotations

import ast
import math
import os
import types
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SEED_PATH = Path(os.environ.get("MJOLNIR_SEED", REPO_ROOT.parent / "shared" / "seed" / "t5_decode.py"))
"""The seed file: ``../shared/seed/t5_decode.py`` beside the repository (override with ``MJOLNIR_SEED``)."""


def _defined_names(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def load_seed(*names: str, path: Path = SEED_PATH, extra_globals: dict | None = None) -> types.SimpleNamespace:
    """Execute only the seed's top-level definitions ``names`` and return them.

    Args:
        names: top-level function, class or constant names (e.g. ``"minifloat_quantize"``).
        path: the seed file.
        extra_globals: more names the definitions need at run time (e.g. ``{"log2_e": ...}``).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        LookupError: a name is not defined at the seed's top level.
    """
    tree = ast.parse(Path(path).read_text(), filename=str(path))
    picked = [node for node in tree.body if _defined_names(node) & set(names)]
    missing = set(names) - set().union(*(_defined_names(n) for n in picked))
    if missing:
        raise LookupError(f"seed {path}: definitions {sorted(missing)} not found")
    namespace: dict = {"torch": torch, "math": math, **(extra_globals or {})}
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102 (the seed's own code)
    return types.SimpleNamespace(**{n: namespace[n] for n in names})
