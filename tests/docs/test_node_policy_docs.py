"""The node-policy page lists every key of the one table (``POLICY_KEYS``) with its default and meaning."""

from __future__ import annotations

import re
from pathlib import Path

from flwr_fedeval.clients import policy

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "node-policy.md"


def test_the_page_holds_the_generated_table():
    text = PAGE.read_text(encoding="utf-8")
    got = re.search(r"<!-- policy-keys -->\n(.*?)\n<!-- /policy-keys -->", text, re.S)
    assert got, "docs/how-to/node-policy.md lost its <!-- policy-keys --> markers"
    assert got.group(1) == policy.markdown_table(), "regenerate the table: policy.markdown_table()"
    for key in policy.POLICY_KEYS:
        assert f"`{key.name}`" in got.group(1)


def test_the_written_policy_file_reads_back_as_the_defaults(tmp_path):
    path = policy.write_policy_file(tmp_path / "node-0.policy.toml")
    text = path.read_text(encoding="utf-8")
    for key in policy.POLICY_KEYS:
        assert key.name in text and key.meaning in text
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    values = tomllib.loads(text)
    assert set(values) == {k.name for k in policy.POLICY_KEYS if k.default is not None}
    assert policy.NodePolicy.from_values(values, str(path)) == policy.NodePolicy(source=str(path))
