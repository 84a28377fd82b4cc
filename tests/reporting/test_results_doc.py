"""docs/results.md: every figure it shows exists, every committed figure is shown, sections are well formed."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_figure_is_linked_and_exists():
    text = (DOCS / "results.md").read_text()
    linked = set(re.findall(r"!\[[^\]]*\]\(figures/([^)]+\.png)\)", text))
    on_disk = {p.name for p in (DOCS / "figures").glob("*.png")}
    assert linked and linked == on_disk


def test_generated_sections_are_balanced_and_say_how_to_regenerate():
    text = (DOCS / "results.md").read_text()
    begins = re.findall(r"^<!-- begin generated: ([a-z0-9_-]+) -->$", text, flags=re.M)
    ends = re.findall(r"^<!-- end generated: ([a-z0-9_-]+) -->$", text, flags=re.M)
    assert begins == ends and len(set(begins)) == len(begins)
    for name in begins:
        section = text.split(f"<!-- begin generated: {name} -->")[1].split(f"<!-- end generated: {name} -->")[0]
        assert "*Regenerate:* `python " in section and "--docs" in section, name
        assert re.search(r"20\d\d-\d\d-\d\d", section), name  # the date it was measured
