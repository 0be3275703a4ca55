"""MkDocs hook: links from the reports to the repository's docs/ folder, made to work inside the site.

``reports/`` is part of the site through the ``docs/reports`` link, one folder deeper than in the
repository, so a generated report's relative link ``../docs/data.md`` (right from ``reports/report.md``
in a checkout) would point at ``docs/docs/data.md`` in the site. This hook drops that ``docs/`` step for
pages under ``reports/``; the files themselves are not changed.
"""

import re

_TO_DOCS = re.compile(r"\]\(((?:\.\./)+)docs/")


def on_page_markdown(markdown, page, **kwargs):
    if page.file.src_uri.startswith("reports/"):
        return _TO_DOCS.sub(r"](\1", markdown)
    return markdown
