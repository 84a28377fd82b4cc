"""Flower glue of :mod:`flwr_fedeval.ledger`: which node ledger a ClientApp writes to.

Where the ledger lives (the first that applies):

1. node config ``fedeval-ledger``: the path of this node's ledger (deployment:
   ``flower-supernode --node-config "fedeval-ledger='/var/lib/fedeval/node-3.ledger.sqlite'"``);
2. beside the node's identity key, ``<name>.ledger.sqlite`` next to ``<name>.key`` (node config
   ``fedeval-identity-key``; simulation: ``<fedeval-identity-dir>/node-<partition-id>.ledger.sqlite``).
   ``python -m flwr_fedeval.keys create`` writes it with the key.

The file must exist: a node whose ledger is missing (never created, or deleted) refuses every
step that needs one with a configuration refusal (:class:`~flwr_fedeval.protocol.NotConfigured`,
code ``NOT_CONFIGURED``) naming ``fedeval-ledger``. It never starts a new ledger by itself: that
would give a deviating server a fresh budget, fresh randomized responses and a clean list of
trained models.

A ledger is opened per handler invocation (:func:`node_ledger`): the deployment engine starts
a process per message, and two runs may use the node at once.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from pathlib import Path

from flwr.app import Context

from flwr_fedeval import config_keys
from flwr_fedeval.ledger import AlreadyGiven, BudgetExhausted, LedgerError, LedgerFull, NodeLedger
from flwr_fedeval.protocol import NotConfigured, Refused, ReplyCode

__all__ = [
    "LEDGER_CONFIG",
    "LEDGER_SUFFIX",
    "TEST_SET",
    "LedgerNotConfigured",
    "ledger_path",
    "ledger_refusals",
    "node_ledger",
    "record_training",
]

#: Node config: the path of this node's ledger.
LEDGER_CONFIG = config_keys.LEDGER
#: Suffix of the ledger beside a node's identity key (``node-3.key`` → ``node-3.ledger.sqlite``).
LEDGER_SUFFIX = ".ledger.sqlite"
#: The dataset the DP handlers charge ε to: the node's test data, whatever split a run asks for (a
#: server that changed the split would otherwise get a fresh budget over overlapping samples).
TEST_SET = "test-set"

_KEY_CONFIG = "fedeval-identity-key"
_HELP_KEYS = (f"node config {LEDGER_CONFIG}", f"run config {config_keys.IDENTITY_DIR}")


class LedgerNotConfigured(NotConfigured):
    """This node has no usable ledger: a configuration refusal naming ``fedeval-ledger``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason, keys=_HELP_KEYS)


def ledger_path(context: Context) -> Path | None:
    """This node's ledger path (see the module docstring; it may not exist), or ``None``."""
    node, run = dict(context.node_config), dict(context.run_config)
    if node.get(LEDGER_CONFIG):
        return Path(str(node[LEDGER_CONFIG])).expanduser()
    if node.get(_KEY_CONFIG):
        key = Path(str(node[_KEY_CONFIG])).expanduser()
        return key.with_name(key.name.split(".")[0] + LEDGER_SUFFIX)
    directory = str(run.get(config_keys.IDENTITY_DIR, "") or "")
    if directory and "partition-id" in node:
        return Path(directory).expanduser() / f"node-{int(node['partition-id'])}{LEDGER_SUFFIX}"
    return None


def node_ledger(context: Context) -> NodeLedger:
    """This node's ledger, opened (a connection per call of its methods).

    Raises
    ------
    LedgerNotConfigured
        No ledger configured, the file is missing, or it is not a ledger of this schema
        (a :class:`~flwr_fedeval.protocol.NotConfigured`: the server stops the run).
    """
    path = ledger_path(context)
    if path is None:
        raise LedgerNotConfigured(
            f"this node has no privacy ledger: set node config '{LEDGER_CONFIG}' (path to the node's ledger), or "
            f"'{_KEY_CONFIG}' (the ledger beside it), or, in simulation, run config '{config_keys.IDENTITY_DIR}'; "
            "create one with: python -m flwr_fedeval.keys create (or keys ledger --create PATH)"
        )
    try:
        return NodeLedger(path)
    except LedgerError as exc:
        raise LedgerNotConfigured(f"this node's privacy ledger is not usable: {exc}") from None


@contextlib.contextmanager
def ledger_refusals(what: str) -> Iterator[None]:
    """Turn the ledger's refusals into the protocol's: :class:`~flwr_fedeval.ledger.AlreadyGiven` →
    ``Refused`` (code ``ALREADY_CONTRIBUTED``); :class:`~flwr_fedeval.ledger.BudgetExhausted` →
    :class:`~flwr_fedeval.protocol.dp_auc.BudgetError` (``BUDGET_EXHAUSTED``); a full or failing ledger
    → ``Refused``."""
    from flwr_fedeval.protocol import dp_auc

    try:
        yield
    except AlreadyGiven as exc:
        raise Refused(f"{what}: {exc}", code=ReplyCode.ALREADY_CONTRIBUTED) from None
    except BudgetExhausted as exc:
        raise dp_auc.BudgetError(f"{what}: {exc}") from None
    except LedgerFull as exc:
        raise Refused(f"{what}: {exc}") from None
    except LedgerError as exc:
        raise Refused(f"{what}: node ledger: {exc}") from None


def record_training(context: Context, model_hash: bytes) -> None:
    """Record, before the update leaves the node, that it trains on the global model ``model_hash``.

    Raises
    ------
    flwr_fedeval.protocol.Refused
        Code ``ALREADY_CONTRIBUTED``: this node gave an update for this model before, in any run;
        code ``REFUSED``: the ledger is at its bound.
    LedgerNotConfigured
        The node has no ledger.
    """
    ledger = node_ledger(context)
    with ledger_refusals("no retries"):
        ledger.record_training(model_hash, phase="train")


def digest(*parts: bytes | str) -> bytes:
    """SHA-256 over length-prefixed ``parts`` (str as UTF-8): a ledger key."""
    h = hashlib.sha256(b"flwr-fedeval/ledger/v1")
    for p in parts:
        b = p.encode() if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(8, "big") + b)
    return h.digest()
