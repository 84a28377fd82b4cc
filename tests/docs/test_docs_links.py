"""The README is the entry point and the docs live in the repository (issue 23, item 6).

The site itself (every page, link and API docstring) is checked by ``mkdocs build --strict``
in scripts/lint.sh; these tests pin what that build does not see: the README (outside the
site), and the code's citations of DESIGN.md sections.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "DESIGN.md"


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    suffixes = {".py", ".md", ".toml", ".sh", ".yml", ".yaml", ".txt", ".cfg", ""}
    return [ROOT / f for f in out.splitlines() if Path(f).suffix in suffixes and (ROOT / f).is_file()]


def test_readme_is_at_most_10_kb():
    assert README.stat().st_size <= 10 * 1024, README.stat().st_size


def test_every_relative_link_of_the_readme_exists():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if not re.match(r"[a-z]+://", link)]
    assert relative, "the README links no docs page"
    missing = [link for link in relative if not (ROOT / link).exists()]
    assert not missing, missing


def test_nothing_points_to_the_design_outside_the_repository():
    needle = "shared/" + "DESIGN"  # spelled in two parts so this file does not match itself
    hits = [str(p.relative_to(ROOT)) for p in _tracked_text_files() if needle in p.read_text(errors="replace")]
    assert not hits, hits


def test_every_cited_design_section_exists():
    sections = set(re.findall(r"^## (\d+)\. ", DESIGN.read_text(), re.M))
    cited = {}
    for path in _tracked_text_files():
        for match in re.finditer(r"DESIGN\.md(?:\]\([^)]*\))? ((?:§\d+(?:, )?)+)", path.read_text(errors="replace")):
            for number in re.findall(r"§(\d+)", match.group(1)):
                cited.setdefault(number, str(path.relative_to(ROOT)))
    assert cited, "no code cites DESIGN.md"
    missing = {n: where for n, where in cited.items() if n not in sections}
    assert not missing, missing
