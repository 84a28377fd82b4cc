"""A griffe extension for the API reference: the reST bits of our numpy docstrings as Markdown.

The docstrings are numpy style (which mkdocstrings parses) with a few reStructuredText
constructs that Markdown does not have: Sphinx roles (``:class:`X```, ``:func:`~a.b```) and
simple tables (columns between ``====  ====`` rulers). Before the docstrings are parsed, roles
become code spans and simple tables become Markdown tables; nothing else changes. Loaded by
``mkdocs.yml`` (``extensions: [docs/griffe_rst.py]``); not part of the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:mod|class|func|meth|data|attr|exc|obj|const):`~?([^`]+)`")
_RULER = re.compile(r"^(\s*)(=+)((?:\s+=+)+)\s*$")


def _columns(ruler: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"=+", ruler)]


def _cells(line: str, cols: list[tuple[int, int]]) -> list[str]:
    cells = []
    for i, (start, _end) in enumerate(cols):
        stop = None if i == len(cols) - 1 else cols[i + 1][0]
        cells.append(line[start:stop].strip())
    return cells


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _segment(lines: list[str], start: int, cols: list[tuple[int, int]]) -> tuple[list[list[str]], int]:
    """The rows from ``start`` up to the next ruler, and that ruler's index (``len(lines)``: none)."""
    rows: list[list[str]] = []
    j = start
    while j < len(lines) and not _RULER.match(lines[j]):
        if lines[j].strip():
            cells = _cells(lines[j], cols)
            if rows and not cells[0]:  # continuation line: extends the previous row
                rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
            else:
                rows.append(cells)
        j += 1
    return rows, j


def _tables(text: str) -> str:
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        m = _RULER.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        indent, cols = m.group(1), _columns(lines[i])
        rows, j = _segment(lines, i + 1, cols)
        header: list[str] | None = None
        if j < len(lines) and _more_rulers(lines, j + 1):  # header rows, ruler, body rows, ruler
            header = [" ".join(c).strip() for c in zip(*rows)]
            rows, j = _segment(lines, j + 1, cols)
        if not rows or j >= len(lines):  # not a table this converter understands: leave it
            out.append(lines[i])
            i += 1
            continue
        out.append("")
        out.append(indent + _row(header or [""] * len(cols)))
        out.append(indent + "|" + "---|" * len(cols))
        out.extend(indent + _row(r) for r in rows)
        out.append("")
        i = j + 1
    return "\n".join(out)


def _more_rulers(lines: list[str], start: int) -> bool:
    """Whether a closing ruler follows before a blank line (then the one before was the header's)."""
    for line in lines[start:]:
        if not line.strip():
            return False
        if _RULER.match(line):
            return True
    return False


class RstToMarkdown(griffe.Extension):
    """Rewrite Sphinx roles and simple tables of every docstring before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is None or not docstring.value:
            return
        try:
            docstring.value = _tables(_ROLE.sub(r"`\1`", docstring.value))
        except Exception:  # a table this converter does not understand stays as written
            return
