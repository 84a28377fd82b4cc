"""Server modules import no client module; the layers below Flower reach no flwr (record keys: test_one_spelling)."""

import ast
import functools
from pathlib import Path

import flwr_fedeval

PACKAGE = Path(flwr_fedeval.__file__).parent


@functools.cache  # every layer's walk reaches the same modules
def _imports(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return frozenset(out)


def test_strategies_import_no_client_module():
    for path in sorted((PACKAGE / "strategies").glob("*.py")):
        clients = [m for m in _imports(path) if m.startswith("flwr_fedeval.clients")]
        assert not clients, f"{path.name} imports {clients}"


#: The layers below Flower: they import no flwr (nor TensorFlow), directly or through any module of the
#: package they import; only strategies, clients, app, testing, protocol and experiments may.
BELOW_FLOWER = ("rlwe", "fhe", "dp", "metrics", "shapley", "secagg")


def _module_path(module: str) -> Path | None:
    parts = module.split(".")[1:]
    for candidate in (PACKAGE.joinpath(*parts).with_suffix(".py"), PACKAGE.joinpath(*parts, "__init__.py")):
        if candidate.is_file():
            return candidate
    return None


def test_layers_below_flower_import_no_flower_even_through_another_module():
    for layer in BELOW_FLOWER:
        files = sorted((PACKAGE / layer).glob("*.py"))
        assert files, layer
        for start in files:
            seen, todo = set(), [start]
            while todo:
                path = todo.pop()
                if path in seen:
                    continue
                seen.add(path)
                for module in _imports(path):
                    top = module.split(".")[0]
                    assert top not in ("flwr", "tensorflow", "keras"), \
                        f"{start.relative_to(PACKAGE)} reaches {module} through {path.relative_to(PACKAGE)}"
                    if top == "flwr_fedeval":
                        # `from flwr_fedeval.rlwe import kahe` names a module too
                        for name in (module, *(f"{module}.{a}" for a in _imported_names(path, module))):
                            found = _module_path(name)
                            if found is not None:
                                todo.append(found)


@functools.cache
def _imported_names(path: Path, module: str) -> tuple[str, ...]:
    tree = ast.parse(path.read_text())
    return tuple(a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module == module
                 for a in node.names)
