"""Secure aggregation for any FedAvg-family strategy of ``flwr.serverapp.strategy``.

A strategy wrapper, as Flower's DP wrappers are::

    strategy = SecureAggregation(FedAdam(fraction_evaluate=0.0, eta=0.1), max_abs_value=2.0**10)
    strategy = DifferentialPrivacyClientSideFixedClipping(strategy, noise_multiplier=1.0,
                                                          clipping_norm=1.0, num_sampled_clients=3)

The inner strategy samples the clients and writes the train config (FedProx's ``proximal-mu``,
the DP wrapper's clipping norm, ...) as it would without secure aggregation; an
:class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg` engine runs the xMK-CKKS protocol with
those clients (DESIGN.md §3: key set, encrypted masked upload, signed contributor set,
threshold decryption), so the server learns only the weighted mean
``w + Σ n_i·Δw_i / Σ n_i`` over the contributors and ``Σ n_i`` (Walskaar et al. 2023, Eqs. 5-6).
The inner strategy's ``aggregate_train`` is then handed that mean as the one reply of weight
``Σ n_i``: FedAvg's weighted mean of it is the mean itself, so FedAdam, FedYogi, FedAdagrad and
FedAvgM apply their server optimizer to exactly what plain FedAvg would have computed (within
the decoding bound of XMKFedAvg: about M·B_smudge/Δ per value).

Strategies whose aggregation needs each client's update (FedMedian, FedTrimmedAvg, Krum,
MultiKrum, Bulyan, QFedAvg, the XGBoost strategies) cannot be wrapped: secure aggregation
reveals only the sum; the constructor refuses them with a ``TypeError``. So are Flower's
server-side DP wrappers (``DifferentialPrivacyServerSideFixedClipping``,
``DifferentialPrivacyServerSideAdaptiveClipping``), inside the wrapper (constructor) or around it
(:meth:`SecureAggregation.summary`, the first thing ``start`` calls, before any message): they
clip each client's update on the server, which secure aggregation hides. Their client-side
counterparts compose (clipping in ``fixedclipping_mod`` inside ``xmkckks_mod``).

A wrapped strategy with its own ``start()`` (Flower's advanced-pytorch ``CustomFedAvg``: results
and checkpoints written inside its round loop) keeps it: :meth:`SecureAggregation.start` runs that
``start()`` on a view of the strategy whose train and evaluate steps are this wrapper's
(:func:`composed_view`), so its loop, files and logs stay as they are and every update is
aggregated under xMK-CKKS.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from logging import INFO
from typing import Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    Bulyan,
    DifferentialPrivacyClientSideAdaptiveClipping,
    DifferentialPrivacyClientSideFixedClipping,
    DifferentialPrivacyServerSideAdaptiveClipping,
    DifferentialPrivacyServerSideFixedClipping,
    FedAvg,
    FedMedian,
    FedTrimmedAvg,
    FedXgbBagging,
    FedXgbCyclic,
    MultiKrum,
    QFedAvg,
    Strategy,
)

from flwr_fedeval.protocol import xmk
from flwr_fedeval.secagg import ProtocolParameters, protocol_keywords
from flwr_fedeval.strategies.base import StepTimer
from flwr_fedeval.strategies.collect import FoldingGrid
from flwr_fedeval.strategies.xmk_fedavg import RoundAborted, XMKFedAvg

__all__ = ["SecureAggregation", "composed_view"]

#: Strategies of ``flwr.serverapp.strategy`` whose aggregate needs every client's update, not the sum.
PER_CLIENT_AGGREGATORS: tuple[type, ...] = (Bulyan, FedMedian, FedTrimmedAvg, FedXgbBagging, FedXgbCyclic,
                                            MultiKrum, QFedAvg)
#: Flower's DP wrappers that clip each client's update on the server: they cannot see one under secure aggregation.
SERVER_SIDE_DP: tuple[type, ...] = (DifferentialPrivacyServerSideFixedClipping,
                                    DifferentialPrivacyServerSideAdaptiveClipping)
#: Flower's DP wrappers whose clipping runs on the clients (a mod): they go around SecureAggregation.
CLIENT_SIDE_DP: tuple[type, ...] = (DifferentialPrivacyClientSideFixedClipping,
                                    DifferentialPrivacyClientSideAdaptiveClipping)
#: The steps of Flower's round loop a composed view (:func:`composed_view`) routes to the wrapper.
ROUND_STEPS = ("configure_train", "aggregate_train", "configure_evaluate", "aggregate_evaluate", "summary")


def check_wrappable(strategy: Any) -> None:
    """Refuse a strategy :class:`SecureAggregation` cannot wrap, naming what composes instead.

    Raises
    ------
    TypeError
        ``strategy`` is one of Flower's DP wrappers (server-side: refused; client-side: it goes
        around SecureAggregation), not a FedAvg-family strategy, or its aggregate needs each
        client's update (:data:`PER_CLIENT_AGGREGATORS`).
    """
    name = type(strategy).__name__
    if isinstance(strategy, SERVER_SIDE_DP):
        raise TypeError(_server_side_dp_message(name))
    if isinstance(strategy, CLIENT_SIDE_DP):
        raise TypeError(f"{name} goes around SecureAggregation, not inside it: "
                        f"{name}(SecureAggregation(FedAvg(...)), ...) with fixedclipping_mod (or "
                        f"adaptiveclipping_mod) inside xmkckks_mod on the clients")
    if not isinstance(strategy, FedAvg) or isinstance(strategy, XMKFedAvg):
        raise TypeError(f"SecureAggregation wraps a FedAvg-family strategy of flwr.serverapp.strategy "
                        f"(FedAvg, FedProx, FedAdam, ...), got {name}")
    if isinstance(strategy, PER_CLIENT_AGGREGATORS):
        raise TypeError(f"{name} aggregates each client's update; secure aggregation reveals only their weighted sum")


def _server_side_dp_message(name: str) -> str:
    return (f"{name} clips each client's update on the server, which secure aggregation hides from it; use "
            f"client-side clipping instead: DifferentialPrivacyClientSideFixedClipping(SecureAggregation(...), ...) "
            f"on the server and @app.train(mods=[xmkckks_mod, fixedclipping_mod]) on the clients")


def refuse_server_side_dp_caller() -> None:
    """Raise ``TypeError`` if the caller of the calling method is a server-side DP wrapper.

    Flower's DP wrappers never call into the wrapped strategy when they are built; the first call
    is ``summary()`` at the start of ``Strategy.start``, then ``configure_train`` of round 1, each
    made by a method of the wrapper: its frame's ``self`` is the wrapper.
    """
    try:
        caller = sys._getframe(2).f_locals.get("self")
    except ValueError:  # a shallower stack: no caller to check
        return
    if isinstance(caller, SERVER_SIDE_DP):
        raise TypeError(_server_side_dp_message(type(caller).__name__))


def overrides_start(strategy: Any) -> bool:
    """Whether ``strategy``'s class has its own ``start()`` (not Flower's ``Strategy.start``)."""
    return type(strategy).start is not Strategy.start


def composed_view(wrapper: SecureAggregation, strategy: FedAvg) -> FedAvg:
    """``strategy`` as its own ``start()`` sees it, with the round steps (:data:`ROUND_STEPS`) of ``wrapper``.

    The view is an instance of a subclass of ``type(strategy)`` sharing its ``__dict__``: attributes the
    strategy's ``start()`` sets or reads (a save path, the best accuracy so far) are the strategy's, its
    helper methods are its own, ``super().start(...)`` inside it reaches Flower's loop, and
    ``configure_train`` / ``aggregate_train`` / ``configure_evaluate`` / ``aggregate_evaluate`` /
    ``summary`` are the wrapper's, which call the strategy's own (its sampling, config schedule and server
    update) around the xMK-CKKS protocol.
    """
    def step(name: str) -> Any:
        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(wrapper, name)(*args, **kwargs)

        call.__name__ = name
        return call

    cls = type(strategy)
    view_cls = type(cls.__name__, (cls,), {name: step(name) for name in ROUND_STEPS})
    view = cast(FedAvg, object.__new__(view_cls))
    object.__setattr__(view, "__dict__", strategy.__dict__)
    return view


class SecureAggregation(Strategy):
    """Wrap a FedAvg-family strategy so that its train updates are aggregated under xMK-CKKS.

    Parameters
    ----------
    strategy : flwr.serverapp.strategy.FedAvg
        FedAvg or a strategy that aggregates through FedAvg's weighted mean (FedProx, FedAdam,
        FedYogi, FedAdagrad, FedAvgM, ...). It samples the clients, configures training and
        evaluation and applies its server update to the securely aggregated mean. Its
        ``weighted_by_key`` must be ``"num-examples"`` and its ``arrayrecord_key`` ``"arrays"``
        (what :func:`~flwr_fedeval.clients.xmkckks.xmkckks_mod` reads and encrypts).
    parameter_set, max_abs_value, scale_bits, rekey, step_timeout, max_attempts, mask_degree, threshold, \
limbs, decryption_attempts, bulk, fractional_bits
        The protocol's settings (:class:`~flwr_fedeval.secagg.ProtocolParameters`), as
        :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg`
        (``max_abs_value`` B bounds every ``|n_i·Δw|``; clients clip to it and the server warns with the
        total of clipped values; ``bulk="kahe"``, the default, sends the update under KAHE and only its
        key under xMK-CKKS, ``bulk="ckks"`` every weight under xMK-CKKS).

    Attributes
    ----------
    strategy : FedAvg
        The wrapped strategy.
    engine : XMKFedAvg
        Runs the protocol (its ``timer``, ``key_sets``, ``left_out``, ``lost_after_upload`` and
        ``aborted_attempts`` are also this wrapper's).

    Raises
    ------
    TypeError
        ``strategy`` is not a FedAvg-family strategy, its aggregate needs each client's update
        (:data:`PER_CLIENT_AGGREGATORS`), or it is one of Flower's DP wrappers (:func:`check_wrappable`);
        also from :meth:`start` when a server-side DP wrapper wraps this one (:meth:`summary`).
    ValueError
        ``strategy.weighted_by_key`` is not ``"num-examples"`` or ``strategy.arrayrecord_key`` is
        not ``"arrays"``; or a protocol parameter is invalid (as :class:`XMKFedAvg`).
    """

    @protocol_keywords
    def __init__(self, strategy: FedAvg, **protocol: Any) -> None:
        super().__init__()
        check_wrappable(strategy)
        if strategy.arrayrecord_key != "arrays":
            raise ValueError(f"the strategy's arrayrecord_key must be 'arrays' (what xmkckks_mod encrypts), "
                             f"got {strategy.arrayrecord_key!r}")
        self.strategy = strategy
        self._first_node = 0  # a node of the round's sample: the handed-over mean is addressed as its reply
        self.engine = XMKFedAvg(
            fraction_train=strategy.fraction_train, fraction_evaluate=0.0,
            min_train_nodes=strategy.min_train_nodes, min_available_nodes=strategy.min_available_nodes,
            weighted_by_key=strategy.weighted_by_key, arrayrecord_key=strategy.arrayrecord_key,
            configrecord_key=strategy.configrecord_key, **protocol,
        )

    def __repr__(self) -> str:
        return f"SecureAggregation({self.strategy!r})"

    @property
    def protocol(self) -> ProtocolParameters:
        """The protocol's settings, the engine's (:class:`~flwr_fedeval.secagg.ProtocolParameters`)."""
        return self.engine.protocol

    # the engine's records, read by Apps and tests as a strategy's
    @property
    def timer(self) -> StepTimer:
        """The engine's :class:`~flwr_fedeval.strategies.base.StepTimer` (protocol step timings)."""
        return self.engine.timer

    @property
    def key_sets(self) -> list[dict[str, Any]]:
        """Every key set generated (public values only), as :attr:`XMKFedAvg.key_sets`."""
        return self.engine.key_sets

    @property
    def aborted_attempts(self) -> list[tuple[int, RoundAborted]]:
        """Every aborted key setup and failed round, as :attr:`XMKFedAvg.aborted_attempts`."""
        return self.engine.aborted_attempts

    @property
    def left_out(self) -> list[tuple[int, dict[int, str]]]:
        """Members left out of a round's contributor set, as :attr:`XMKFedAvg.left_out`."""
        return self.engine.left_out

    @property
    def contributor_sets(self) -> list[dict[str, Any]]:
        """Every round's signed contributor set by roster identity, as :attr:`XMKFedAvg.contributor_sets`."""
        return self.engine.contributor_sets

    @property
    def lost_after_upload(self) -> list[tuple[int, dict[int, str]]]:
        """Contributors lost after their upload, as :attr:`XMKFedAvg.lost_after_upload`."""
        return self.engine.lost_after_upload

    def start(self, grid: Grid, *args: Any, **kwargs: Any) -> Any:
        """Flower's ``Strategy.start`` (same parameters) over a grid that folds each encrypted update into
        the round's running sum as it arrives (as :meth:`XMKFedAvg.start`). A wrapped strategy with its own
        ``start()`` runs it, on :func:`composed_view` (its loop, this wrapper's round steps)."""
        folding = FoldingGrid(grid, self.engine.fold_train_reply)
        if overrides_start(self.strategy):
            return type(self.strategy).start(composed_view(self, self.strategy), folding, *args, **kwargs)
        return Strategy.start(self, folding, *args, **kwargs)

    def summary(self) -> None:
        """Log the wrapper, the protocol's parameters and the inner strategy's summary.

        Raises
        ------
        TypeError
            Called by one of Flower's server-side DP wrappers (its ``start`` calls this first, before
            any message): they clip each client's update, which secure aggregation hides.
        """
        refuse_server_side_dp_caller()
        log(INFO, "\t├──> Secure aggregation (xMK-CKKS) of %s", type(self.strategy).__name__)
        self.engine.summary()
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's train messages (its sample, its config), then the key set (step 1) with
        those clients and the step-2 messages: the same model and config plus the key set.

        Raises
        ------
        ValueError
            The inner strategy sent different models or configs to different clients (one key set
            sums updates of one global model).
        TypeError
            Called by one of Flower's server-side DP wrappers (:meth:`summary`).
        """
        refuse_server_side_dp_caller()
        inner = list(self.strategy.configure_train(server_round, arrays, config, grid))
        if not inner:
            return []
        akey, ckey = self.strategy.arrayrecord_key, self.strategy.configrecord_key
        first = inner[0].content
        model, train_config = xmk.model_hash(first.array_records[akey]), first.config_records[ckey]
        for msg in inner[1:]:
            if (xmk.model_hash(msg.content.array_records[akey]) != model
                    or dict(msg.content.config_records[ckey]) != dict(train_config)):
                raise ValueError(f"{type(self.strategy).__name__} sent different models or configs to its "
                                 f"clients; secure aggregation sums updates of one global model")
        nodes = [int(m.metadata.dst_node_id) for m in inner]
        self._first_node = nodes[0]
        messages = self.engine.configure_train_for(server_round, first.array_records[akey], train_config, grid,
                                                   nodes)
        extra = {int(m.metadata.dst_node_id): m.content for m in inner}
        for msg in messages:  # any other record the inner strategy sent travels too
            for key, record in extra.get(int(msg.metadata.dst_node_id), RecordDict()).items():
                if key not in msg.content:
                    msg.content[key] = record
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Steps 2-4 (:meth:`XMKFedAvg.aggregate_train`), then the inner strategy's ``aggregate_train``
        on the decrypted mean, handed over as one reply of weight ``Σ n_i``.

        Returns ``(None, None)`` when the round failed (global model unchanged, no retry). The metrics
        are the inner strategy's, with ``num-examples`` (Σ n_i) and ``num-clients`` (|C|).
        """
        mean, metrics = self.engine.aggregate_train(server_round, replies)
        if mean is None or metrics is None:
            return None, None
        content = RecordDict({self.strategy.arrayrecord_key: mean, "metrics": MetricRecord(dict(metrics))})
        as_reply = Message(content=content, dst_node_id=self._first_node, message_type=xmk.TRAIN.message_type)
        arrays, inner_metrics = self.strategy.aggregate_train(server_round, [as_reply])
        out = MetricRecord(dict(inner_metrics or {}))
        out["num-examples"], out["num-clients"] = metrics["num-examples"], metrics["num-clients"]
        return arrays, out

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's (evaluation replies are metrics, not updates: not encrypted)."""
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The inner strategy's."""
        return self.strategy.aggregate_evaluate(server_round, replies)
