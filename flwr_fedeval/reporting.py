"""Publishing measured results: Markdown tables, small figures and where they came from.

The experiments (``experiments/``) and benchmarks (``benchmarks/``) write
their own CSV/JSON to git-ignored folders; with ``--docs`` they also publish
one section of the committed ``docs/results.md`` through :func:`publish`:
a Markdown table (:func:`markdown_table`), PNG figures under
``docs/figures/``, and a provenance line (command, date, machine, commit) so
a reader can tell what produced the numbers and how to produce them again.

A published section sits between two HTML comments,
``<!-- begin generated: NAME -->`` and ``<!-- end generated: NAME -->``,
and is replaced as a whole on the next publish of ``NAME``; everything
outside the markers (hand-written text, sections quoted from earlier
measurements) is left as it is. A new ``NAME`` is appended at the end.

:func:`auc_summary` is the one line a person reads on the server for an AUC phase's
result (``str(result)`` of :class:`~flwr_fedeval.strategies.auc_phase.AUCPhaseResult`):
the AUC with its resolution bound, a warning with the fix when the bound exceeds 0.01,
or, for an FHE AUC the clients kept, why and the command that changes it.

Imports neither flwr nor TensorFlow; matplotlib is only needed by the
caller that draws a figure.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["SHARE_AUC_HOWTO", "auc_summary", "markdown_table", "machine_description", "provenance", "publish"]

#: How a federation lets its nodes report the FHE AUC (node policy ``fedeval-share-auc``,
#: :mod:`flwr_fedeval.clients.policy`): the command that writes the policy, or the policy file's key.
SHARE_AUC_HOWTO = (
    "each node's policy decides: `python -m flwr_fedeval.keys create --out DIR --nodes N "
    "--policy fedeval-share-auc=true` writes it for new keys; for existing ones set "
    "`fedeval-share-auc = true` in each node's <name>.policy.toml (or node config "
    "fedeval-share-auc=true)"
)

_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


def _cell(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[Any], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub-flavoured Markdown table.

    Parameters
    ----------
    header : sequence
        Column titles.
    rows : iterable of sequences
        One sequence per row, as long as ``header``; cells are formatted with
        ``str`` (``None`` → empty); ``|`` in a cell is escaped.
    align : str, optional
        One character per column: ``l``, ``r`` or ``c``; default left.

    Returns
    -------
    str
        The table, one line per row, without a trailing newline.

    Raises
    ------
    ValueError
        If a row or ``align`` does not have one entry per column, or ``align``
        holds a character other than ``l``, ``r``, ``c``.
    """
    header = list(header)
    width = len(header)
    align = align or "l" * width
    if len(align) != width or set(align) - set("lrc"):
        raise ValueError(f"align must be {width} characters from 'l', 'r', 'c', got {align!r}")
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
             "|" + "|".join(rule[a] for a in align) + "|"]
    for i, row in enumerate(rows):
        row = list(row)
        if len(row) != width:
            raise ValueError(f"row {i} has {len(row)} cells, the header {width}")
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return "\n".join(lines)


def machine_description() -> str:
    """CPU model, core count, OS and Python version of this machine, in one line."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = f", load average {os.getloadavg()[0]:.1f}"
    return (f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}, "
            f"Python {platform.python_version()}{load}")


def _git_commit(where: Path, ignore: Path | None = None) -> str | None:
    """Short HEAD hash of the work tree at ``where``; ``+uncommitted changes`` if a tracked file
    outside ``ignore`` (the docs folder, which publishing itself changes) differs from it."""
    exclude = []
    if ignore is not None:
        try:
            exclude = [f":(exclude){Path(ignore).resolve().relative_to(Path(where).resolve())}"]
        except ValueError:
            exclude = []
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no", "--",
                                ".", *exclude], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+uncommitted changes" if dirty else "") if head else None


def provenance(command: str | None = None, *, repo: str | os.PathLike[str] | None = None,
               ignore: str | os.PathLike[str] | None = None) -> dict[str, str | None]:
    """What produced a result: command line, UTC date, machine and git commit.

    Parameters
    ----------
    command : str, optional
        Default: this process's command line, ``python <script> <args>``.
    repo : path, optional
        Working tree whose commit is recorded; default the current directory.
    ignore : path, optional
        A folder inside ``repo`` whose changes do not count as uncommitted
        (:func:`publish` passes the docs folder it writes to).

    Returns
    -------
    dict
        ``command``, ``date`` (UTC, ``YYYY-MM-DD HH:MM``), ``machine``
        (:func:`machine_description`), ``commit`` (short hash, with
        ``+uncommitted changes`` when tracked files differ; ``None`` outside git).
    """
    if command is None:
        script = Path(sys.argv[0])
        try:
            script = script.resolve().relative_to(Path(repo or Path.cwd()).resolve())
        except ValueError:
            pass
        command = shlex.join(["python", str(script), *sys.argv[1:]])
    return {
        "command": command,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(),
        "commit": _git_commit(Path(repo or Path.cwd()), Path(ignore) if ignore is not None else None),
    }


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- begin generated: {name} -->", f"<!-- end generated: {name} -->"


def publish(
    name: str,
    title: str,
    body: str,
    *,
    docs_dir: str | os.PathLike[str],
    figures: Mapping[str, Any] | None = None,
    command: str | None = None,
    dpi: int = 100,
) -> Path:
    """Write (or replace) section ``name`` of ``docs_dir/results.md``, with its figures.

    Parameters
    ----------
    name : str
        Section id: lower-case letters, digits, ``-``, ``_``. Also the prefix
        of its figure files.
    title : str
        Heading of the section (a level-2 heading).
    body : str
        Markdown under the provenance line: tables (:func:`markdown_table`)
        and text.
    docs_dir : path
        The ``docs/`` folder; created if missing, and ``results.md`` in it.
    figures : mapping of str to figure or path, optional
        ``suffix -> matplotlib Figure`` (saved as PNG at ``dpi``) or
        ``suffix -> path of an existing PNG`` (copied), written to
        ``docs_dir/figures/<name>_<suffix>.png`` (``<name>.png`` for the
        suffix ``""``) and shown below the body.
    command : str, optional
        The command that regenerates the section; default: this process's
        command line (:func:`provenance`).
    dpi : int, default=100
        Resolution of saved figures (keep committed PNGs small).

    Returns
    -------
    pathlib.Path
        The ``results.md`` written.

    Raises
    ------
    ValueError
        If ``name`` or a figure suffix is not a valid id, or ``results.md``
        holds the begin marker of ``name`` without its end marker (or twice).
    FileNotFoundError
        If a figure given as a path does not exist.
    """
    if not _NAME.match(name):
        raise ValueError(f"section name must match {_NAME.pattern}, got {name!r}")
    docs = Path(docs_dir)
    fig_dir = docs / "figures"
    repo = docs.resolve().parent
    info = provenance(command, repo=repo, ignore=docs)
    images = []
    for suffix, fig in (figures or {}).items():
        if suffix and not _NAME.match(suffix):
            raise ValueError(f"figure suffix must match {_NAME.pattern}, got {suffix!r}")
        fig_dir.mkdir(parents=True, exist_ok=True)
        target = fig_dir / (f"{name}_{suffix}.png" if suffix else f"{name}.png")
        if isinstance(fig, (str, os.PathLike)):
            if not Path(fig).is_file():
                raise FileNotFoundError(f"figure {fig} does not exist")
            shutil.copyfile(fig, target)
        else:
            fig.savefig(target, dpi=dpi)
        images.append(f"![{target.stem}](figures/{target.name})")
    begin, end = _markers(name)
    lines = [begin, f"## {title}", "",
             f"*Measured {info['date']} on {info['machine']}; commit {info['commit'] or 'n/a'}.*  ",
             f"*Regenerate:* `{info['command']}`", "", body.strip(), ""]
    if images:
        lines += [*images, ""]
    lines.append(end)
    section = "\n".join(lines)

    docs.mkdir(parents=True, exist_ok=True)
    path = docs / "results.md"
    text = path.read_text() if path.exists() else "# Measured results\n"
    n_begin, n_end = text.count(begin), text.count(end)
    if n_begin != n_end or n_begin > 1:
        raise ValueError(f"{path}: section {name!r} has {n_begin} begin and {n_end} end markers")
    if n_begin:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
    return path


def auc_summary(result: Any) -> str:
    """One readable line for an AUC phase's result (an ``AUCPhaseResult``; read by attribute).

    * an AUC: ``"FHE AUC 0.912345 ± 0.0021 (resolution bound, N = 100 decision points)"``, followed by
      the fix (:func:`flwr_fedeval.metrics.auc.resolution_advice`, naming
      ``decision-point-spacing='logit'``) when the bound exceeds
      :data:`~flwr_fedeval.metrics.auc.RESOLUTION_WARN_THRESHOLD`;
    * an FHE AUC the clients did not report: ``"FHE AUC not shared by policy: ..."`` with the nodes
      that withheld it and :data:`SHARE_AUC_HOWTO`, or ``"known to the clients only"`` when the phase
      did not ask (``share_auc_with_server=False``); never ``nan``.
    """
    import math

    from flwr_fedeval.metrics.auc import RESOLUTION_WARN_THRESHOLD, resolution_advice

    details = dict(getattr(result, "details", {}) or {})
    method = str(getattr(result, "method", ""))
    label = "FHE AUC" if method == "fhe" else f"AUC ({getattr(result, 'label', method)})"
    auc = float(getattr(result, "auc", math.nan))
    if not math.isfinite(auc):
        if details.get("auc_known_to") == "clients":
            decrypted = len(details.get("decrypted_by", []))
            if details.get("share_requested") is False:
                return (f"{label} known to the clients only ({decrypted} decrypted it; the phase did not ask "
                        f"for it: share_auc_with_server=False)")
            withheld = details.get("withheld_by", [])
            return (f"{label} not shared by policy: the {decrypted} clients that decrypted it keep it "
                    f"({len(withheld)} replied 'not shared': node policy fedeval-share-auc is false, the "
                    f"default, or run config fedeval-share-auc=false); to report it, {SHARE_AUC_HOWTO}")
        return f"{label} unknown ({details.get('defined', 'no value')})"
    text = f"{label} {auc:.6f}"
    bound = float(getattr(result, "resolution_bound", math.nan))
    if math.isfinite(bound):
        points = getattr(getattr(result, "thresholds", None), "size", None)
        at = f", N = {points} decision points" if points else ""
        text += f" ± {bound:.4f} (resolution bound{at})"
        if bound > RESOLUTION_WARN_THRESHOLD:
            text += f"; WARNING: {resolution_advice(bound)}"
    epsilon = details.get("epsilon")
    if isinstance(epsilon, (int, float)):
        text += f" (ε = {epsilon:g} per client)"
    return text
