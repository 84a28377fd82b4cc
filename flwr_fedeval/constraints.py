"""Parameter constraints, declared once per class and read by everything that checks or lists them.

A library class declares what each constructor parameter accepts in a ``_parameter_constraints``
dict, as scikit-learn's estimators do (``{"n_splits": [Interval(Integral, 2, None, closed="left")],
"protocol": [Choices(("semi-honest", "malicious"))], "metrics_threshold": [None, Interval(Real, 0, 1,
closed="both")]}``), and the relations between parameters in a classmethod ``parameter_relations``.
Its constructor validates through them (:func:`check_params`), and the demo App derives its
enumerations (:func:`choices`), its defaults (:func:`default_of`) and its checks
(:func:`parameter_problems`) from the same declarations, so that neither restates a formula, a
bound or a list of choices.

The per-parameter check and its messages are scikit-learn's (``sklearn.utils._param_validation``,
stable from scikit-learn 1.2 to 1.8, the range this package allows). :class:`Interval` and
:class:`Choices` record a declaration and become scikit-learn's ``Interval`` / ``StrOptions`` when a
value is checked, so that declaring constraints (importing a strategy module) and reading defaults
and choices do not load scikit-learn: a ClientApp process that never checks a parameter does not
pay for it. :class:`Choices` keeps the declared order for messages and App lists.
Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

__all__ = [
    "Choices",
    "Problem",
    "Interval",
    "check_params",
    "choices",
    "constraints_of",
    "default_of",
    "describe",
    "parameter_problems",
]

Constraints = Mapping[str, list[Any]]


class Problem(NamedTuple):
    """One violated constraint: the parameters it concerns and the message (``str(problem)``)."""

    params: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return self.message


class Interval:
    """scikit-learn's ``Interval(type, left, right, closed=...)``, built when a value is checked.

    ``str(interval)`` is scikit-learn's wording (``"an int in the range [2, inf)"``).
    """

    def __init__(self, type: Any, left: float | None, right: float | None, *, closed: str) -> None:
        self.type, self.left, self.right, self.closed = type, left, right, closed

    def sklearn(self) -> Any:
        """The scikit-learn constraint (imports scikit-learn)."""
        from sklearn.utils._param_validation import Interval as SkInterval

        return SkInterval(self.type, self.left, self.right, closed=self.closed)

    def __str__(self) -> str:
        return str(self.sklearn())


class Choices:
    """scikit-learn's ``StrOptions`` that remembers the declared order (``ordered``), built when a value is
    checked."""

    def __init__(self, options: tuple[str, ...] | list[str], *, deprecated: set[str] | None = None) -> None:
        self.ordered = tuple(options)
        self.options = set(options)
        self.deprecated = deprecated

    def sklearn(self) -> Any:
        """The scikit-learn constraint (imports scikit-learn)."""
        from sklearn.utils._param_validation import StrOptions

        return StrOptions(self.options, deprecated=self.deprecated)

    def __str__(self) -> str:
        return f"a str among {self.ordered}"


def _sklearn(constraint: Any) -> Any:
    """``constraint`` as scikit-learn's ``validate_parameter_constraints`` takes it."""
    return constraint.sklearn() if isinstance(constraint, (Interval, Choices)) else constraint


def __getattr__(name: str) -> Any:
    # scikit-learn's error class, re-exported without importing scikit-learn with this module
    if name == "InvalidParameterError":
        from sklearn.utils._param_validation import InvalidParameterError

        return InvalidParameterError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def constraints_of(target: Any) -> dict[str, list[Any]]:
    """The ``_parameter_constraints`` of a class (or of ``target``'s class); ``{}`` if it declares none."""
    cls = target if isinstance(target, type) else type(target)
    return dict(getattr(cls, "_parameter_constraints", {}))


def _caller(target: Any) -> str:
    return getattr(target, "__qualname__", None) or type(target).__qualname__


def parameter_problems(target: Any, params: Mapping[str, Any], *, relations: bool = True) -> list[Problem]:
    """Every violated constraint of ``params`` (``{parameter: value}``), one :class:`Problem` each.

    Only parameters ``target`` declares are checked (one scikit-learn message per parameter:
    ``"The 'n_splits' parameter of FHEAUCPhase must be an int in the range [2, inf). Got 1 instead."``);
    then, if all of them hold, ``target.parameter_relations(**params)`` when the class declares
    relations between parameters (a classmethod of that name returning :class:`Problem` s; the
    parameters not given take their defaults) and ``relations`` is true.
    """
    declared = constraints_of(target)
    out: list[Problem] = []
    checked = [name for name in params if name in declared]
    if checked:
        from sklearn.utils._param_validation import InvalidParameterError, validate_parameter_constraints
    for name in checked:
        try:
            validate_parameter_constraints({name: [_sklearn(c) for c in declared[name]]}, {name: params[name]},
                                           caller_name=_caller(target))
        except InvalidParameterError as exc:
            out.append(Problem((name,), str(exc)))
    related: Callable[..., list[Problem]] | None = getattr(target, "parameter_relations", None)
    if relations and not out and related is not None:
        out += list(related(**params))
    return out


def check_params(target: Any, params: Mapping[str, Any]) -> None:
    """Raise if :func:`parameter_problems` finds any.

    Raises
    ------
    InvalidParameterError
        A ``ValueError`` (and ``TypeError``), one line per problem.
    """
    problems = parameter_problems(target, params)
    if problems:
        from sklearn.utils._param_validation import InvalidParameterError

        raise InvalidParameterError("\n".join(map(str, problems)))


def choices(target: Any, name: str) -> tuple[str, ...] | None:
    """The strings parameter ``name`` of ``target`` accepts, in declared order; ``None`` unless a set of
    strings is all it accepts (e.g. ``beta``: ``"adaptive"`` or a number)."""
    declared = constraints_of(target).get(name, [])
    if not declared or not all(isinstance(c, Choices) for c in declared):
        return None
    out: list[str] = []
    for constraint in declared:
        out += constraint.ordered
    return tuple(out)


def describe(target: Any, name: str) -> str:
    """What parameter ``name`` of ``target`` accepts, as scikit-learn words it (``"an int in the range [2, inf)"``)."""
    parts = [("None" if c is None else str(c)) for c in constraints_of(target).get(name, [])]
    return " or ".join(parts) if parts else "any value"


def default_of(target: Any, name: str) -> Any:
    """The default of parameter ``name`` in ``target``'s signature (for a class, the first ``__init__``
    along its MRO that has the parameter: a subclass with ``**kwargs`` keeps its base's defaults).

    Raises
    ------
    KeyError
        ``target`` has no such parameter, or it has no default.
    """
    signatures = [inspect.signature(vars(k)["__init__"]) for k in target.__mro__ if "__init__" in vars(k)] \
        if isinstance(target, type) else [inspect.signature(target)]
    for signature in signatures:
        parameter = signature.parameters.get(name)
        if parameter is not None and parameter.default is not inspect.Parameter.empty:
            return parameter.default
    raise KeyError(f"{_caller(target)}({name}) has no default")
