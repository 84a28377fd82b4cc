"""Every record key, message type and message field is spelled once: in its protocol module.

The server side (``strategies/``), the client side (``clients/``), the App and
``messages.py`` build and read message contents only through the payload classes of
``flwr_fedeval.protocol``; the only string keys they may use on a message's content
are Flower's own defaults (``arrays``, ``config``, ``metrics``: the records of
``FedAvg``'s train and evaluate messages, which our mods leave in place).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import flwr_fedeval

PACKAGE = Path(flwr_fedeval.__file__).parent
PROTOCOL = PACKAGE / "protocol"
FLOWER_DEFAULTS = {"arrays", "config", "metrics"}
MESSAGE_TYPE = re.compile(r"^(train|evaluate|query)\.[a-z_]+$")


def _modules(inside_protocol: bool) -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if (PROTOCOL in p.parents) == inside_protocol)


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring constants (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _key_constants(path: Path) -> dict[str, str]:
    """``{NAME: value}`` of the string constants assigned to ``*_KEY`` names in ``path``."""
    out = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.endswith("_KEY"):
                    out[target.id] = node.value.value
    return out


def _is_content(node: ast.AST) -> bool:
    """``<x>.content`` or a name ``content``: a message's RecordDict."""
    return (isinstance(node, ast.Attribute) and node.attr == "content") or (
        isinstance(node, ast.Name) and node.id == "content")


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def test_record_keys_are_defined_once_across_the_protocol_modules():
    owner: dict[str, str] = {}
    for path in _modules(inside_protocol=True):
        for value in _key_constants(path).values():
            if value in FLOWER_DEFAULTS:
                continue
            assert owner.setdefault(value, path.name) == path.name, \
                f"record key {value!r} defined in {owner[value]} and {path.name}"
    assert len(owner) >= 20, sorted(owner)  # the four protocols' records are there


def test_message_types_and_record_keys_are_not_spelled_outside_the_protocol_modules():
    record_keys = {v for p in _modules(True) for v in _key_constants(p).values()} - FLOWER_DEFAULTS
    for path in _modules(inside_protocol=False):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        rel = path.relative_to(PACKAGE)
        for name, value in _key_constants(path).items():
            assert value not in record_keys, f"{rel}: {name} = {value!r} spells a protocol record key"
        for node in ast.walk(tree):
            value = _literal(node)
            if value is not None and id(node) not in docs:
                assert not MESSAGE_TYPE.match(value), f"{rel}:{node.lineno}: message type {value!r} spelled out"


def test_message_contents_are_read_and_built_only_through_payloads():
    for path in _modules(inside_protocol=False):
        rel = path.relative_to(PACKAGE)
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Subscript) and _is_content(node.value):
                key = _literal(node.slice)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                    and _is_content(node.func.value) and node.args:
                key = _literal(node.args[0])
            elif isinstance(node, ast.Compare) and any(_is_content(c) for c in node.comparators):
                key = _literal(node.left)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "RecordDict" \
                    and node.args and isinstance(node.args[0], ast.Dict):
                for k in node.args[0].keys:
                    literal = _literal(k)
                    assert literal is None or literal in FLOWER_DEFAULTS, \
                        f"{rel}:{node.lineno}: RecordDict built with record key {literal!r}"
            assert key is None or key in FLOWER_DEFAULTS, f"{rel}:{node.lineno}: message content read at {key!r}"
