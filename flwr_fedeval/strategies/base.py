"""The phase contract every server-side evaluation phase implements, and readable failures for FedAvg.

* :class:`EvaluationPhase` — abstract base of the evaluation phases (plaintext,
  FHE and DP AUC, SecSV): ``run(grid, arrays) -> result``, configuration
  validated at construction, ``summary()`` in Flower's style (a small tree at
  INFO), one reply exchange (:func:`~flwr_fedeval.strategies.exchange.exchange_replies`)
  that checks replies before use, and the failure bookkeeping of
  :mod:`flwr_fedeval.strategies.failures`.
* :class:`ReadableFailuresMixin` — the same collapsed failure lines for
  Flower's FedAvg family (instead of one line, with a full remote traceback,
  per failing node), and its ``start`` over a
  :class:`~flwr_fedeval.strategies.collect.DetectingGrid`.

The failure records (:mod:`~flwr_fedeval.strategies.failures`) and the exchange
(:mod:`~flwr_fedeval.strategies.exchange`) are importable from here too.
"""

from __future__ import annotations

import abc
import inspect
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from logging import INFO
from typing import Any, Generic, TypeVar

from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from flwr.serverapp.strategy.strategy_utils import validate_message_reply_consistency

from flwr_fedeval.protocol import ARRAYS_KEY
from flwr_fedeval.strategies.collect import DetectingGrid, PhaseGrid, ReplyCollector
from flwr_fedeval.strategies.exchange import FailureRecordingGrid, StepTimer, exchange_replies, replies_by_node
from flwr_fedeval.strategies.failures import (
    ClientAppNotWired,
    Failure,
    FailureLog,
    Failures,
    NodeNotConfigured,
    code_name,
    collapse_failures,
    log_failures,
    one_line_reason,
    raise_if_not_configured,
    raise_if_not_wired,
    wiring_fix,
)

__all__ = [
    "ClientAppNotWired",
    "EvaluationPhase",
    "Failure",
    "FailureLog",
    "FailureRecordingGrid",
    "Failures",
    "NodeNotConfigured",
    "ReadableFailuresMixin",
    "ReadableFedAvg",
    "StepTimer",
    "code_name",
    "collapse_failures",
    "exchange_replies",
    "log_failures",
    "one_line_reason",
    "raise_if_not_configured",
    "raise_if_not_wired",
    "replies_by_node",
    "wiring_fix",
]


#: The result type of a phase's :meth:`EvaluationPhase.run`.
ResultT = TypeVar("ResultT")
_Parsed = TypeVar("_Parsed")
_PhaseT = TypeVar("_PhaseT", bound="EvaluationPhase[Any]")


def _check_phase_config(min_nodes: Any, timeout: Any, min_nodes_floor: int) -> None:
    if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or min_nodes < min_nodes_floor:
        raise ValueError(f"min_nodes must be an integer >= {min_nodes_floor}, got {min_nodes!r}")
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")


class EvaluationPhase(abc.ABC, Generic[ResultT]):
    """Abstract base of the server-side evaluation phases: the one phase contract.

    Every phase is run after training as ``phase.run(grid, arrays)`` and returns
    its result (``ResultT``: :class:`~flwr_fedeval.strategies.auc_phase.AUCPhaseResult`
    for the AUC phases, :class:`~flwr_fedeval.strategies.shapley_phase.ShapleyPhaseResult`
    for SecSV). Subclasses validate their own configuration in ``__init__`` (after
    calling this one), implement one method per protocol step and :meth:`run`, and
    list what :meth:`summary` shows in :meth:`_summary_items`. The base itself cannot
    be instantiated (``TypeError``); its configuration is checked first, so a bad
    ``min_nodes`` or ``timeout`` is named even then.

    Parameters
    ----------
    min_nodes : int, default=2
        Fewer contributing clients than this at any step raises ``RuntimeError``.
    arrayrecord_key : str, default="arrays"
        Record key of the global model in the requests.
    timeout : float, default=3600
        Seconds to wait for the replies of each exchange.
    min_nodes_floor : int, default=1
        The smallest ``min_nodes`` the phase accepts.

    Raises
    ------
    ValueError
        ``min_nodes`` is not an integer >= ``min_nodes_floor`` or ``timeout`` is not > 0.

    Attributes
    ----------
    timer : StepTimer
        ``timer.timings``: (step, seconds) of every step run so far.
    failures : Failures
        Failures of the last run (node → step, code, reason).
    results : dict of int to ResultT
        The results of the runs through :meth:`evaluate_fn`, by server round.
    """

    #: The ``auc-method`` (or phase name) this class implements.
    method = ""
    #: Prefix of the log lines.
    label = "AUC phase"

    def __new__(cls: type[_PhaseT], *args: Any, **kwargs: Any) -> _PhaseT:
        if inspect.isabstract(cls):   # name a bad configuration before refusing the abstract class
            _check_phase_config(kwargs.get("min_nodes", 2), kwargs.get("timeout", 3600),
                                kwargs.get("min_nodes_floor", 1))
        return super().__new__(cls)

    def __init__(self, *, min_nodes: int = 2, arrayrecord_key: str = ARRAYS_KEY, timeout: float = 3600,
                 min_nodes_floor: int = 1) -> None:
        _check_phase_config(min_nodes, timeout, min_nodes_floor)
        self.min_nodes = min_nodes
        self.arrayrecord_key = arrayrecord_key
        self.timeout = float(timeout)
        self.timer = StepTimer(self._log_label())
        self.failures = Failures()
        #: Results of the runs through :meth:`evaluate_fn`, by server round.
        self.results: dict[int, ResultT] = {}

    @abc.abstractmethod
    def run(self, grid: Grid, arrays: ArrayRecord) -> ResultT:
        """Run the phase's protocol steps over ``grid`` and return its result.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            The run's grid (the data clients, and any auxiliary node the phase needs).
        arrays : ArrayRecord
            The global model after training (the AUC phases send it; SecSV values the
            local models the clients recorded and accepts it for this contract).

        Raises
        ------
        RuntimeError
            Fewer than ``min_nodes`` clients are left after a step (:meth:`require`);
            each phase documents its own errors (``ShapleyPhaseError`` derives from it).
        """

    def evaluate_fn(self, grid: Grid, *, rounds: Iterable[int]) -> Callable[[int, ArrayRecord], MetricRecord | None]:
        """This phase as Flower's server-side ``evaluate_fn`` (``Strategy.start(..., evaluate_fn=...)``).

        At each server round in ``rounds`` it runs the phase on that round's global model and returns
        the result's ``to_metric_record()`` (e.g. ``auc``, ``auc-resolution-bound``), which Flower keeps
        in ``Result.evaluate_metrics_serverapp[round]``; the full result is kept in ``results[round]``.
        Other rounds return ``None`` (nothing recorded). Each run is one evaluation of that model by
        every client (their ``fedeval-*`` policy counts it): name only the rounds you need, typically
        ``rounds=[num_rounds]``.

        Parameters
        ----------
        grid : flwr.serverapp.Grid
            The run's grid (the one passed to ``start``).
        rounds : iterable of int
            Server rounds to evaluate (0 is the initial model).

        Raises
        ------
        ValueError
            ``rounds`` is empty or holds a negative round.
        """
        wanted = {int(r) for r in rounds}
        if not wanted or min(wanted) < 0:
            raise ValueError(f"rounds must name at least one server round >= 0, got {sorted(wanted)}")
        self.results = {}

        def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
            if server_round not in wanted:
                return None
            result = self.run(grid, arrays)
            self.results[server_round] = result
            record: MetricRecord = result.to_metric_record()  # type: ignore[attr-defined]
            return record

        return evaluate

    # --- description --------------------------------------------------------------
    def _log_label(self) -> str:
        return f"{self.label} ({self.method})" if self.method else self.label

    def _summary_items(self) -> list[tuple[str, str]]:
        """``[(name, value)]`` shown by :meth:`summary`; subclasses add theirs first."""
        return [("Minimum nodes", str(self.min_nodes)), ("Timeout per step", f"{self.timeout:g} s"),
                ("ArrayRecord key", repr(self.arrayrecord_key))]

    def describe(self) -> str:
        """One line: the phase and its configuration."""
        return f"{self._log_label()}: " + ", ".join(f"{k.lower()} {v}" for k, v in self._summary_items())

    def summary(self) -> None:
        """Log the configuration as a small tree (as ``flwr.serverapp.strategy.FedAvg.summary``)."""
        items = self._summary_items()
        log(INFO, "\t└──> %s (%s):", type(self).__name__, self.method or "phase")
        for i, (k, v) in enumerate(items):
            log(INFO, "\t\t%s── %s: %s", "└" if i == len(items) - 1 else "├", k, v)

    # --- per run --------------------------------------------------------------------
    def _start_run(self) -> Failures:
        self.failures = Failures()
        return self.failures

    def step(self, name: str) -> AbstractContextManager[None]:
        """Context manager timing (and logging) one protocol step."""
        return self.timer.step(name)

    def exchange(self, grid: PhaseGrid, contents: Mapping[int, RecordDict], message_type: str,
                 parse: Callable[[int, RecordDict], _Parsed], *, step: str, what: str,
                 failures: Failures | None = None) -> dict[int, _Parsed]:
        """:func:`exchange_replies` with this phase's timeout, label and failure record."""
        return exchange_replies(grid, contents, message_type, parse,
                                self.failures if failures is None else failures, step=step, what=what,
                                timeout=self.timeout, label=self._log_label())

    def require(self, nodes: Iterable[int], step: str) -> None:
        """Raise ``RuntimeError`` if fewer than ``min_nodes`` nodes are left after ``step``."""
        nodes = list(nodes)
        if len(nodes) < self.min_nodes:
            lines = "; ".join(self.failures.lines()) or "none failed"
            raise RuntimeError(
                f"{self._log_label()} {step}: {len(nodes)} clients left, at least {self.min_nodes} "
                f"needed; left out: {lines}"
            )


class ReadableFailuresMixin:
    """For Flower's FedAvg family: log failed replies collapsed by reason.

    Flower logs one line per failing node with the full remote reason (a
    traceback in simulation); this logs one WARNING line per distinct reason
    with the node count and IDs, and the full reason once at DEBUG.
    """

    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start`` over a :class:`~flwr_fedeval.strategies.collect.DetectingGrid`
        (unless ``grid`` already collects so, e.g. a :class:`FailureRecordingGrid`): the train and
        evaluate steps give up a node that left the node list at once instead of at ``timeout``."""
        from flwr.serverapp.strategy import Strategy

        if not isinstance(grid, ReplyCollector):
            grid = DetectingGrid(grid)
        return Strategy.start(self, grid, *args, **kwargs)  # type: ignore[arg-type]

    def _check_and_log_replies(self, replies: Iterable[Message], is_train: bool,
                               validate: bool = True) -> tuple[list[Message], list[Message]]:
        """As Flower's ``FedAvg._check_and_log_replies``, with failures collapsed by reason; a
        ``NOT_CONFIGURED`` reply raises :class:`NodeNotConfigured`, and every node failing for its
        ClientApp's code :class:`ClientAppNotWired` (the run stops)."""
        replies = list(replies)
        valid = [r for r in replies if not r.has_error()]
        errors = [r for r in replies if r.has_error()]
        step = "aggregate_train" if is_train else "aggregate_evaluate"
        log(INFO, "%s: Received %s results and %s failures", step, len(valid), len(errors))
        if errors:
            failed = {r.metadata.src_node_id: Failure(step, int(r.error.code), str(r.error.reason)) for r in errors}
            log_failures(type(self).__name__, step, failed)
            raise_if_not_configured(f"{type(self).__name__} {step}", failed)
            message_type = "train" if is_train else "evaluate"
            fixes = {r.metadata.src_node_id: wiring_fix(message_type, r.error.code, str(r.error.reason))
                     for r in errors}
            raise_if_not_wired(f"{type(self).__name__} {step}", failed, fixes, len(valid))
        if validate and valid:
            validate_message_reply_consistency(
                replies=[r.content for r in valid],
                weighted_by_key=self.weighted_by_key,  # type: ignore[attr-defined]
                check_arrayrecord=is_train,
            )
        return valid, errors


class ReadableFedAvg(ReadableFailuresMixin, FedAvg):
    """Flower's ``FedAvg`` with failed replies logged collapsed by reason (:class:`ReadableFailuresMixin`)."""

