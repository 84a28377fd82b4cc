"""Server modules import no client module; every record key is defined once, in messages.py."""

import ast
import re
from pathlib import Path

import flwr_fedeval.messages as messages

PACKAGE = Path(messages.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


def test_strategies_import_no_client_module():
    for path in sorted((PACKAGE / "strategies").glob("*.py")):
        clients = [m for m in _imports(path) if m.startswith("flwr_fedeval.clients")]
        assert not clients, f"{path.name} imports {clients}"


def test_record_keys_are_unique_and_not_spelled_out_in_phases_or_handlers():
    keys = {name: value for name, value in vars(messages).items() if name.endswith("_KEY")}
    assert len(set(keys.values())) == len(keys), "two record-key constants share one string"
    record_names = {v for v in keys.values() if v not in ("arrays", "config", "metrics")}
    files = [*(PACKAGE / "strategies").glob("*.py"), *(PACKAGE / "clients").glob("*_handlers.py")]
    pattern = re.compile(r"\b(?:content|ct|reply|c)\[\"([a-z-]+)\"\]|RecordDict\(\{\"([a-z-]+)\"")
    for path in files:
        for match in pattern.finditer(path.read_text()):
            name = match.group(1) or match.group(2)
            assert name not in record_names, f"{path.name}: record key {name!r} spelled as a bare string"
