"""Every run-config (and node-config) key the library reads carries the ``fedeval-`` prefix (issue 23 item 5).

A static check over the package, outside ``flwr_fedeval/app/`` (the demo App, whose short keys map
onto the library's through ``LIBRARY_RUN_CONFIG``): every read of a run config (``x.run_config``,
``dict(x.run_config)``, a parameter named ``run_config`` and any name bound to one of those) with
``[key]``, ``.get(key)``, ``.pop(key)`` or ``key in ...`` must use a key that resolves (a string
literal, or a constant of the module or of a module it imports) to a ``fedeval-`` string. A key the
check cannot resolve fails it too: spell the key as a constant. The same for node config, where
Flower's own ``partition-id`` and ``num-partitions`` are allowed.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import flwr_fedeval
from flwr_fedeval import config_keys

PACKAGE = Path(flwr_fedeval.__file__).parent
APP = PACKAGE / "app"


#: Flower's own node-config keys (simulation), which the library may read as they are.
FLOWER_NODE_KEYS = {"partition-id", "num-partitions"}


def _is_run_config(node: ast.AST, names: set[str], attr: str = "run_config") -> bool:
    if isinstance(node, ast.Attribute) and node.attr == attr:
        return True
    if isinstance(node, ast.Name) and node.id in names:
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and node.args:
        return _is_run_config(node.args[0], names, attr)
    return False


def _run_config_names(tree: ast.AST, attr: str = "run_config") -> set[str]:
    """Names bound to a run config (``attr``) anywhere in the module (parameters named ``attr``, assignments)."""
    names = {attr}
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            pairs = []
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs += list(zip(target.elts, node.value.elts))
                else:
                    pairs.append((target, node.value))
            for target, value in pairs:
                if isinstance(target, ast.Name) and target.id not in names and _is_run_config(value, names, attr):
                    names.add(target.id)
                    changed = True
    return names


def run_config_reads(source: str, attr: str = "run_config") -> list[tuple[int, ast.AST]]:
    """``[(line, key expression)]`` of every read of a run config (``attr="node_config"``: a node
    config) in ``source``."""
    tree = ast.parse(source)
    names = _run_config_names(tree, attr)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_run_config(node.value, names, attr):
            out.append((node.lineno, node.slice))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("get", "pop", "setdefault") and _is_run_config(node.func.value, names, attr)
              and node.args):
            out.append((node.lineno, node.args[0]))
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and _is_run_config(node.comparators[0], names, attr)):
            out.append((node.lineno, node.left))
    return out


def _resolve(expr: ast.AST, module) -> str | None:
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return expr.value
    if isinstance(expr, ast.Name):
        value = getattr(module, expr.id, None)
        return value if isinstance(value, str) else None
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        owner = getattr(module, expr.value.id, None)
        value = getattr(owner, expr.attr, None)
        return value if isinstance(value, str) else None
    return None


def _library_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if APP not in p.parents)


def test_the_check_sees_a_generic_key():
    """The check is not vacuous: a ``run_config["foo"]`` in any of the read forms is found."""
    src = (
        "def f(context, run_config):\n"
        "    a = context.run_config['foo']\n"
        "    run = dict(context.run_config)\n"
        "    b = run.get('bar', 2)\n"
        "    c = 'baz' in run_config\n"
        "    node, cfg = dict(context.node_config), dict(context.run_config)\n"
        "    return cfg.get('qux')\n"
    )
    keys = [_resolve(expr, None) for _, expr in run_config_reads(src)]
    assert sorted(keys) == ["bar", "baz", "foo", "qux"]


@pytest.mark.parametrize("attr,allowed,least", [("run_config", set(), 8),
                                                 ("node_config", FLOWER_NODE_KEYS, 10)])
def test_every_config_key_the_library_reads_has_the_prefix(attr, allowed, least):
    checked, bad = 0, []
    for path in _library_modules():
        source = path.read_text(encoding="utf-8")
        reads = run_config_reads(source, attr)
        if not reads:
            continue
        rel = path.relative_to(PACKAGE.parent)
        module = importlib.import_module(".".join(rel.with_suffix("").parts))
        for line, expr in reads:
            key = _resolve(expr, module)
            checked += 1
            if key is None or not (key.startswith(config_keys.PREFIX) or key in allowed):
                bad.append(f"{rel}:{line}: {attr} key {key if key is not None else ast.unparse(expr)!r}")
    assert not bad, f"{attr} keys without the 'fedeval-' prefix (or not a constant):\n" + "\n".join(bad)
    assert checked >= least  # identity, policy, the xMK ledger, roles and the ServerApp's roster read them


@pytest.mark.parametrize("key", config_keys.RUN_CONFIG_KEYS)
def test_the_documented_keys_are_the_library_keys(key):
    assert key.startswith(config_keys.PREFIX)
    assert f"``{key}``" in (config_keys.__doc__ or "")
    docs = (PACKAGE.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert f"`{key}`" in docs


def test_the_demo_app_maps_its_short_keys_onto_the_library_keys():
    from flwr_fedeval.app.task import LIBRARY_RUN_CONFIG, JobConfig, library_run_config

    docs = (PACKAGE.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    app_keys = set(JobConfig().as_dict())
    for app_key, lib_key in LIBRARY_RUN_CONFIG.items():
        assert app_key in app_keys and lib_key in config_keys.RUN_CONFIG_KEYS
        assert f"| `{lib_key}` | `{app_key}` |" in docs
    mapped = library_run_config({"identity-dir": "/ids", "min-nodes": 3, "seed": 1})
    assert mapped == {"identity-dir": "/ids", "min-nodes": 3, "seed": 1,
                      config_keys.IDENTITY_DIR: "/ids", config_keys.MIN_CLIENTS: 3}
    assert JobConfig.from_run_config(mapped).min_nodes == 3  # the library names of its keys are no problem
    with pytest.raises(ValueError, match="through this App's key 'min-nodes'"):
        JobConfig.from_run_config({"min-nodes": 3, config_keys.MIN_CLIENTS: 4})
