"""flwr_fedeval.reporting: Markdown tables and sections of docs/results.md."""

from pathlib import Path

import pytest

from flwr_fedeval.reporting import markdown_table, provenance, publish


def test_markdown_table_aligns_and_escapes_pipes():
    table = markdown_table(["a", "|x|"], [[1, "p|q"], [None, 2.5]], align="lr")
    assert table.splitlines() == [
        "| a | \\|x\\| |",
        "|---|---:|",
        "| 1 | p\\|q |",
        "|  | 2.5 |",
    ]


@pytest.mark.parametrize("rows, align", [([[1, 2, 3]], None), ([[1, 2]], "lx"), ([[1, 2]], "l")])
def test_markdown_table_refuses_ragged_rows_and_bad_alignment(rows, align):
    with pytest.raises(ValueError):
        markdown_table(["a", "b"], rows, align=align)


def test_provenance_names_command_date_and_machine():
    info = provenance("python experiments/x.py --quick", repo=Path(__file__).parent)
    assert info["command"] == "python experiments/x.py --quick"
    assert info["date"].endswith("UTC") and info["date"][:2] == "20"
    assert "cores" in info["machine"] and "Python" in info["machine"]


def test_publish_replaces_only_its_own_section(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "results.md").write_text("# Results\n\nHand-written intro.\n")
    publish("alpha", "Alpha", "first body", docs_dir=docs, command="cmd-a")
    publish("beta", "Beta", "beta body", docs_dir=docs, command="cmd-b")
    publish("alpha", "Alpha", "second body", docs_dir=docs, command="cmd-a2")
    text = (docs / "results.md").read_text()
    assert text.startswith("# Results\n\nHand-written intro.\n")
    assert "first body" not in text and "second body" in text and "beta body" in text
    assert text.count("<!-- begin generated: alpha -->") == 1
    assert text.index("second body") < text.index("beta body")  # replaced in place, not appended
    assert "`cmd-a2`" in text and "`cmd-b`" in text and "*Measured " in text


def test_publish_writes_figures_and_links_them(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, 1], [0, 1])
    png = tmp_path / "given.png"
    fig.savefig(png)
    docs = tmp_path / "docs"
    publish("gamma", "Gamma", "body", docs_dir=docs, figures={"": fig, "copy": png}, command="c")
    plt.close(fig)
    assert (docs / "figures" / "gamma.png").read_bytes()[:4] == b"\x89PNG"
    assert (docs / "figures" / "gamma_copy.png").read_bytes() == png.read_bytes()
    text = (docs / "results.md").read_text()
    assert "](figures/gamma.png)" in text and "](figures/gamma_copy.png)" in text


def test_publish_refuses_bad_names_and_broken_markers(tmp_path):
    with pytest.raises(ValueError):
        publish("Bad Name", "t", "b", docs_dir=tmp_path, command="c")
    with pytest.raises(FileNotFoundError):
        publish("delta", "t", "b", docs_dir=tmp_path, figures={"x": tmp_path / "missing.png"}, command="c")
    (tmp_path / "results.md").write_text("<!-- begin generated: delta -->\nno end\n")
    with pytest.raises(ValueError, match="markers"):
        publish("delta", "t", "b", docs_dir=tmp_path, command="c")


def test_provenance_commit_ignores_changes_to_the_docs_folder(tmp_path):
    import subprocess

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("a\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    (tmp_path / "docs" / "results.md").write_text("b\n")  # what publishing itself changes
    info = provenance("c", repo=tmp_path, ignore=tmp_path / "docs")
    assert info["commit"] and "+" not in info["commit"]
    (tmp_path / "code.py").write_text("x = 2\n")  # a code change does count
    assert provenance("c", repo=tmp_path, ignore=tmp_path / "docs")["commit"].endswith("+uncommitted changes")
