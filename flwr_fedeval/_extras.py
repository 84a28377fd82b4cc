"""Optional dependencies (pip extras) and the error that names the missing one.

The core install (``pip install flwr-fedeval``) holds the strategies, the
client handlers, the protocol layers and the TenSEAL engine. Everything else
is an extra (``pyproject.toml``)::

    [keras]    tensorflow-cpu + Keras 3: the Keras adapter's models, the App's models
    [openfhe]  the OpenFHE CKKS engine (its PyPI wheel loads on CPython 3.10)
    [app]      the demo App (`flwr run .`), experiments, plots: [keras] + flwr[simulation],
               flwr-datasets (partitioning), matplotlib, tqdm, pandas, pillow
    [all]      = [app];  [dev] = [app] + the test tools

:func:`require` imports a module of an extra and turns an ``ImportError`` into
:class:`MissingExtraError`, whose message names the extra to install.
No flwr and no TensorFlow imports here.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtraError", "require"]

#: Module (top-level import name) -> the extra that installs it.
EXTRAS = {
    "keras": "keras",
    "tensorflow": "keras",
    "openfhe": "openfhe",
    "matplotlib": "app",
    "tqdm": "app",
    "pandas": "app",
    "PIL": "app",
    "datasets": "app",
    "flwr_datasets": "app",
}


class MissingExtraError(ImportError):
    """A module of an optional extra is not importable; the message names the extra."""


def _python() -> str:
    return f"{sys.implementation.name} {sys.version_info[0]}.{sys.version_info[1]}"


def require(module: str, *, extra: str | None = None, purpose: str = "") -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming its extra.

    Parameters
    ----------
    module : str
        Dotted module name (e.g. ``"matplotlib.pyplot"``); its top-level
        package selects the extra in :data:`EXTRAS` unless ``extra`` is given.
    extra : str, optional
        The pip extra that installs it.
    purpose : str, optional
        What needs it, for the message (e.g. ``"the OpenFHE CKKS engine"``).

    Returns
    -------
    module

    Raises
    ------
    MissingExtraError
        If the import fails (missing package, or a native library that does
        not load on this Python); the original error is chained and quoted.
    """
    top = module.split(".", 1)[0]
    extra = extra or EXTRAS.get(top)
    if extra is None:
        raise ValueError(f"no extra is known for module {module!r}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        what = purpose or "this part of flwr-fedeval"
        hint = f"pip install 'flwr-fedeval[{extra}]'"
        if extra == "openfhe":
            hint += (" on CPython 3.10 (the openfhe wheel 1.6.1 loads on CPython 3.10 here; "
                     f"this is {_python()}; one command: `make run-openfhe`)")
        raise MissingExtraError(
            f"{what} needs {top!r}, which is not importable ({type(exc).__name__}: {exc}); "
            f"install the [{extra}] extra: {hint}"
        ) from exc
