"""The committed notebooks: regenerate their stored outputs (``mjolnir notebooks``), and tell when they
are stale.

Each notebook is a jupytext percent script ``notebooks/NAME.py`` (the source of truth, what CI executes at
the small size) paired with ``notebooks/NAME.ipynb``, which holds the outputs a reader sees. ``refresh``
executes the script at the ``full`` size and writes the ``.ipynb`` with its outputs and a stamp in the
notebook's metadata (``mjolnir``: the script's SHA-256, the size, torch's version, the UTC time). A notebook
is stale when its code cells are not the script's, a code cell has no execution count, or the stamp's digest
is not the script's (``stale_reasons``; ``tests/study/test_notebooks.py`` fails on any).
"""

from __future__ import annotations

import datetime
import hashlib
import os
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["NOTEBOOK_DIR", "SIZES", "notebook_scripts", "refresh", "source_digest", "stale_reasons"]

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
SIZES = ("small", "full")
CELL_TIMEOUT_S = 1800


def notebook_scripts(names: Optional[Sequence[str]] = None, folder: Path = NOTEBOOK_DIR) -> list[Path]:
    """The paired scripts, sorted; ``names`` (stems) picks some, and an unknown name raises ValueError."""
    scripts = sorted(p for p in Path(folder).glob("*.py") if p.with_suffix(".ipynb").exists())
    if names is None:
        return scripts
    by_name = {p.stem: p for p in scripts}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"names: {', '.join(unknown)} are not notebooks; choose from {', '.join(by_name)}")
    return [by_name[n] for n in names]


def source_digest(script: Path) -> str:
    """SHA-256 of the script's text."""
    return hashlib.sha256(Path(script).read_bytes()).hexdigest()


def _code_sources(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


def stale_reasons(script: Path) -> list[str]:
    """Why ``script``'s ``.ipynb`` does not show the script's current outputs (empty: it does)."""
    import jupytext
    import nbformat

    ipynb = Path(script).with_suffix(".ipynb")
    if not ipynb.exists():
        return [f"{ipynb.name} is missing"]
    stored = nbformat.read(ipynb, as_version=4)
    reasons = []
    if _code_sources(stored) != _code_sources(jupytext.read(script)):
        reasons.append(f"{ipynb.name}: its code cells are not {Path(script).name}'s")
    if any(c.cell_type == "code" and c.source.strip() and c.get("execution_count") is None for c in stored.cells):
        reasons.append(f"{ipynb.name}: a code cell was not executed")
    stamp = stored.metadata.get("mjolnir", {})
    if stamp.get("source_sha256") != source_digest(script):
        reasons.append(f"{ipynb.name}: not executed from the current {Path(script).name} (run `mjolnir notebooks`)")
    return reasons


def refresh(
    names: Optional[Sequence[str]] = None, size: str = "full", log=print, folder: Path = NOTEBOOK_DIR
) -> list[Path]:
    """Execute each paired script at ``size`` (``MJOLNIR_NOTEBOOK_SIZE``) from its folder and write its
    ``.ipynb`` with the outputs and the stamp. Returns the notebooks written."""
    import jupytext
    import nbclient
    import torch

    if size not in SIZES:
        raise ValueError(f"size: {size!r} is not one of {', '.join(SIZES)}")
    written = []
    old = os.environ.get("MJOLNIR_NOTEBOOK_SIZE")
    os.environ["MJOLNIR_NOTEBOOK_SIZE"] = size
    try:
        for script in notebook_scripts(names, folder):
            t0 = datetime.datetime.now(datetime.timezone.utc)
            nb = jupytext.read(script)
            client = nbclient.NotebookClient(
                nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(script.parent)}}
            )
            client.execute()
            nb.metadata["mjolnir"] = {
                "source_sha256": source_digest(script),
                "size": size,
                "torch": torch.__version__,
                "executed_utc": t0.strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
            ipynb = script.with_suffix(".ipynb")
            jupytext.write(nb, ipynb, fmt="ipynb")
            seconds = (datetime.datetime.now(datetime.timezone.utc) - t0).total_seconds()
            log(f"{ipynb.parent.name}/{ipynb.name}: {seconds:.0f} s")
            written.append(ipynb)
    finally:
        if old is None:
            os.environ.pop("MJOLNIR_NOTEBOOK_SIZE", None)
        else:
            os.environ["MJOLNIR_NOTEBOOK_SIZE"] = old
    return written
