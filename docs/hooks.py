"""MkDocs hook: every submodule of a package gets into its API reference page.

A reference page lists its package's modules in reading order (``::: flwr_fedeval.rlwe.params``
...) and ends with ``<!-- api-rest: flwr_fedeval.rlwe -->``; this hook replaces that marker
with a ``:::`` block for each public module of the package (``*.py`` not starting with ``_``)
that no reference page lists yet (a package may span two pages: its user API and its internals),
so a module added later is documented without editing the page. Loaded by ``mkdocs.yml``
(``hooks:``); not part of the package.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- api-rest: ([\w.]+) -->")


def _rest(match: re.Match[str], markdown: str) -> str:
    package = match.group(1)
    folder = ROOT.joinpath(*package.split("."))
    listed = set(re.findall(r"^::: ([\w.]+)", markdown, re.M))
    for page in (ROOT / "docs" / "reference").glob("*.md"):  # a package may span pages (user API, internals)
        listed |= set(re.findall(r"^::: ([\w.]+)", page.read_text(), re.M))
    modules = sorted(f"{package}.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_"))
    return "\n".join(f"::: {m}\n" for m in modules if m not in listed)


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    return MARKER.sub(lambda m: _rest(m, markdown), markdown)
