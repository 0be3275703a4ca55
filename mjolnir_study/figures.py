"""One helper that saves every figure of the study and the notebooks: ``reports/figures/NAME.png``.

The directory is ``$MJOLNIR_FIGURES_DIR`` when set (tests and CI point it at a temporary folder so the
committed report is not overwritten by small runs), else ``reports/figures`` of the repository this
package sits in (or of the working directory when the package is installed elsewhere).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["default_figures_dir", "save_figure"]

_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")
DPI = 110  # figures are read on screen in the markdown report; 110 dpi keeps PNGs ~50-100 kB


def default_figures_dir() -> Path:
    """``$MJOLNIR_FIGURES_DIR``, else ``<repo>/reports/figures`` (``./reports/figures`` outside a checkout)."""
    env = os.environ.get("MJOLNIR_FIGURES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[1]
    if (repo / "pyproject.toml").exists():
        return repo / "reports" / "figures"
    return Path.cwd() / "reports" / "figures"


def save_figure(fig, name: str, directory: str | os.PathLike | None = None) -> Path:
    """Save a matplotlib figure as ``directory/NAME.png`` (default :func:`default_figures_dir`).

    Args:
        fig: a ``matplotlib.figure.Figure``.
        name: file stem: letters, digits, ``_`` and ``-`` only.
        directory: target folder (created if missing).

    Returns:
        The path written.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"name: {name!r} must be a non-empty file stem of letters, digits, '_' or '-'")
    out = Path(directory) if directory is not None else default_figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.png"
    fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata={"Software": None})
    return path
