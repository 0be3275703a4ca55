"""The README's headline tables are the ones the committed results give (``benchmarks.readme_tables``): a
new study or benchmark run that changes them fails here until the README is regenerated."""

from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_readme_is_short():
    assert len(README.splitlines()) <= 250


def test_accuracy_table_is_the_studys():
    pytest.importorskip("pandas")
    from benchmarks.readme_tables import accuracy_table

    assert accuracy_table() in README, "README's accuracy table is stale: python -m benchmarks.readme_tables"


def test_speed_table_is_the_benchmarks():
    from benchmarks.readme_tables import speed_table

    assert speed_table() in README, "README's speed table is stale: python -m benchmarks.readme_tables"


def test_performance_page_table_is_the_benchmarks():
    from benchmarks.readme_tables import bandwidth_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "performance.md").read_text()
    assert bandwidth_table() in doc, "docs/performance.md's table is stale: python -m benchmarks.readme_tables"


def test_studies_page_table_is_the_studys():
    pytest.importorskip("pandas")
    from benchmarks.readme_tables import accuracy_table

    doc = (Path(__file__).resolve().parents[1] / "docs" / "studies.md").read_text()
    assert accuracy_table() in doc, "docs/studies.md's table is stale: python -m benchmarks.readme_tables"
