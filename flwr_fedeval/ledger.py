"""The node privacy ledger: what a node has given, kept for the life of its data, across runs.

A SuperNode gets a fresh ``context.state`` for every run, so whatever a node remembers there, a
server that starts a new run makes it forget: the ε it spent, the labels it flipped, the global
models it trained on or evaluated. :class:`NodeLedger` keeps these in one SQLite database per
node (the standard library's :mod:`sqlite3`, the engine Flower's SuperLink keeps its state in),
which the node's operator owns next to its identity key:

==================================  =======================================================================
concern                             method (each refuses by raising a :class:`LedgerError`)
==================================  =======================================================================
global models trained on            :meth:`NodeLedger.record_training` (:class:`AlreadyGiven`)
ε spent per dataset                 :meth:`NodeLedger.spend_epsilon`, :meth:`NodeLedger.spent`
                                    (:class:`BudgetExhausted`)
permanent randomized response       :meth:`NodeLedger.randomized_response` (RAPPOR's memoisation)
evaluations per model and phase     :meth:`NodeLedger.record_evaluation` (:class:`AlreadyGiven`)
SecSV: sealed deals answered        :meth:`NodeLedger.record_deal` (:class:`AlreadyGiven`)
SecSV: (round, coalition, sample)   :meth:`NodeLedger.record_batch` (:class:`AlreadyGiven`)
what a person reads                 :meth:`NodeLedger.summary`
==================================  =======================================================================

Guarantees
    **Write before reply.** Every method runs in one ``BEGIN IMMEDIATE`` transaction and commits
    before it returns, with ``journal_mode = WAL`` and ``synchronous = FULL`` (the WAL is fsynced at
    every commit): once a method has returned, the record survives a ``kill -9`` of the process or a
    power cut, so a node that dies between the write and its reply refuses the repeat.

    **No races.** ``BEGIN IMMEDIATE`` takes the database's write lock before the first read, so two
    processes of one node (the deployment engine starts a process per message; two runs at once)
    serialise: the check and the record are one step, and only one of them is granted.

    **Refuse, never forget.** Nothing is evicted. Each table has a bound (``cap`` rows, default
    10^7); at the bound the ledger refuses every new record (:class:`LedgerFull`), as IPsec's
    anti-replay window refuses rather than forgets (RFC 4303 §3.4.3): the operator must decide
    (a new key and ledger, i.e. a new node).

    **One source of truth for ε.** The ledger persists every spend; diffprivlib's
    :class:`~diffprivlib.BudgetAccountant` (pure ε, ``delta = 0``, ``slack = 0``: sequential
    composition) checks each new one against the budget, rebuilt from the stored spends inside the
    transaction (:func:`flwr_fedeval.dp.budget.charge`).

A connection is opened per call (a few hundred microseconds) and closed at its end: nothing is
held between calls, so the object is cheap to create per message and safe to use from several
processes. Besides, each process keeps one idle connection per ledger it opened (the last
:data:`KEEP_OPEN` ledgers): SQLite checkpoints the write-ahead log into the database and deletes
it when the *last* connection to a database closes, which would cost every call a second fsync
of the database file (~20 ms here instead of ~1 ms, ``benchmarks/bench_ledger.py``). The idle
connection holds no lock; durability comes from the WAL commit either way. The module imports
neither Flower nor TensorFlow.

References
----------
Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable Privacy-Preserving Ordinal
Response", CCS 2014 (permanent randomized response, §3). Kent, "IP Encapsulating Security
Payload (ESP)", RFC 4303 §3.4.3 (anti-replay: refuse at the window). Beaver, "Efficient
multiparty protocols using circuit randomization", CRYPTO 1991 (a dealt triple is used once).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import io
import math
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_CAP",
    "SCHEMA_VERSION",
    "AlreadyGiven",
    "BudgetExhausted",
    "LedgerError",
    "LedgerFull",
    "LedgerSummary",
    "NodeLedger",
]

#: The schema this code reads and writes (table ``schema_version``).
SCHEMA_VERSION = 1
#: Default bound on the rows of each table (:class:`LedgerFull` beyond it).
DEFAULT_CAP = 10**7
#: Seconds a call waits for another process's transaction before it fails (:class:`LedgerError`).
BUSY_TIMEOUT = 30.0
#: Ledgers per process kept open by an idle connection (see the module docstring).
KEEP_OPEN = 32
_KEEPERS: collections.OrderedDict[tuple[int, str], sqlite3.Connection] = collections.OrderedDict()
_INHERITED: list[sqlite3.Connection] = []


def _keep_open(path: Path) -> None:
    """Keep one idle connection to ``path`` in this process (least recently used closed first)."""
    key = (os.getpid(), str(path))
    if key in _KEEPERS:
        _KEEPERS.move_to_end(key)
        return
    for other in [k for k in _KEEPERS if k[0] != key[0]]:
        # inherited through fork: never used nor closed here (closing it in the child could
        # checkpoint and delete the parent's WAL: SQLite connections do not survive a fork)
        _INHERITED.append(_KEEPERS.pop(other))
    keeper = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
    # SQLite opens the file lazily: one read makes this connection hold the WAL and its index open,
    # so the other connections' closes neither checkpoint nor delete the WAL (each write is then one
    # fsync of the WAL instead of a new WAL header, the frames and a checkpoint: five)
    keeper.execute("SELECT version FROM schema_version").fetchone()
    _KEEPERS[key] = keeper
    while len(_KEEPERS) > KEEP_OPEN:
        _KEEPERS.popitem(last=False)[1].close()


_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE row_counts (name TEXT PRIMARY KEY, count INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE trained (
    model BLOB PRIMARY KEY, phase TEXT NOT NULL, recorded TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE epsilon (
    id INTEGER PRIMARY KEY, dataset TEXT NOT NULL, epsilon REAL NOT NULL, budget REAL NOT NULL,
    recorded TEXT NOT NULL);
CREATE INDEX epsilon_by_dataset ON epsilon (dataset);
CREATE TABLE responses (
    dataset TEXT NOT NULL, key BLOB NOT NULL, output BLOB NOT NULL, recorded TEXT NOT NULL,
    PRIMARY KEY (dataset, key)) WITHOUT ROWID;
CREATE TABLE evaluations (
    model BLOB NOT NULL, phase TEXT NOT NULL, count INTEGER NOT NULL, recorded TEXT NOT NULL,
    PRIMARY KEY (model, phase)) WITHOUT ROWID;
CREATE TABLE deals (deal BLOB PRIMARY KEY, recorded TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE batches (
    scope TEXT NOT NULL, round INTEGER NOT NULL, coalition TEXT NOT NULL, sample TEXT NOT NULL,
    PRIMARY KEY (scope, round, coalition, sample)) WITHOUT ROWID;
"""
_TABLES = ("trained", "epsilon", "responses", "evaluations", "deals", "batches")


class LedgerError(RuntimeError):
    """The ledger refuses, or cannot be used (missing, another schema, locked too long, corrupt)."""


class AlreadyGiven(LedgerError):
    """This node already gave it: the model was trained on, the evaluations of a model are used up,
    the deal was answered, or a (round, coalition, sample) was decrypted."""


class BudgetExhausted(LedgerError):
    """The ε of the request exceeds what is left of the dataset's budget (nothing is recorded)."""


class LedgerFull(LedgerError):
    """A table reached the ledger's bound: it refuses every new record (nothing is forgotten)."""


@dataclass(frozen=True)
class LedgerSummary:
    """What a ledger holds (:meth:`NodeLedger.summary`).

    Attributes
    ----------
    path : str
    schema : int
    trained : dict of str to int
        Models trained on, per phase.
    epsilon : dict of str to tuple of (float, float, int)
        Per dataset: (ε spent, ε left of the last budget checked, spends).
    responses : dict of str to int
        Permanent randomized responses stored, per dataset.
    evaluations : list of (str, str, int)
        (model SHA-256 hex, phase, evaluations answered), oldest first.
    deals, batch_samples : int
        SecSV: sealed deals answered; (round, coalition, sample) triples decrypted.
    cap : int
    """

    path: str
    schema: int
    trained: dict[str, int] = field(default_factory=dict)
    epsilon: dict[str, tuple[float, float, int]] = field(default_factory=dict)
    responses: dict[str, int] = field(default_factory=dict)
    evaluations: list[tuple[str, str, int]] = field(default_factory=list)
    deals: int = 0
    batch_samples: int = 0
    cap: int = DEFAULT_CAP

    def text(self, *, max_models: int = 20) -> str:
        """The summary as a person reads it (the ``python -m flwr_fedeval.keys ledger`` output)."""
        lines = [
            f"node privacy ledger {self.path} (schema {self.schema}; refuses new records at {self.cap:,} per table)"
        ]
        total = sum(self.trained.values())
        lines.append(
            f"global models trained on: {total}"
            + (f" ({', '.join(f'{p}: {n}' for p, n in sorted(self.trained.items()))})" if total else "")
        )
        lines.append("differential privacy (ε spent per dataset, pure ε composition):")
        if not self.epsilon:
            lines.append("  none spent")
        for name, (spent, left, count) in sorted(self.epsilon.items()):
            lines.append(
                f"  {name}: ε spent {spent:g} in {count} evaluation(s); ε left {left:g} (of the budget checked last)"
            )
        for name, n in sorted(self.responses.items()):
            lines.append(f"  {name}: {n} permanent randomized response(s) stored")
        lines.append(f"global models evaluated: {len({m for m, _, _ in self.evaluations})}")
        for model, phase, count in self.evaluations[-max_models:]:
            lines.append(f"  {model[:16]}  {phase}: {count}")
        if len(self.evaluations) > max_models:
            lines.append(f"  ... {len(self.evaluations) - max_models} earlier (model, phase) entries not shown")
        lines.append(
            f"SecSV: {self.deals} sealed deal(s) answered; {self.batch_samples} (round, coalition, sample) "
            "decryption(s) recorded"
        )
        return "\n".join(lines)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _array_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _array_of(data: bytes) -> np.ndarray:
    out: np.ndarray = np.load(io.BytesIO(bytes(data)), allow_pickle=False)
    return out


def _blob(value: bytes, name: str) -> bytes:
    if not isinstance(value, (bytes, bytearray, memoryview)) or len(value) == 0:
        raise ValueError(f"{name} must be non-empty bytes, got {type(value).__name__}")
    return bytes(value)


def _text(value: str, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


class NodeLedger:
    """One node's privacy ledger: an SQLite database at ``path`` (see the module docstring).

    Parameters
    ----------
    path : str or os.PathLike[str]
        The database file; it must exist (:meth:`create` makes one), so that a deleted ledger is
        noticed instead of silently starting afresh.
    cap : int, default :data:`DEFAULT_CAP`
        Rows per table at which every new record is refused (:class:`LedgerFull`); >= 1.

    Raises
    ------
    LedgerError
        The file does not exist, is not a ledger, or has another schema version.
    ValueError
        ``cap`` < 1.
    """

    def __init__(self, path: str | os.PathLike[str], *, cap: int = DEFAULT_CAP) -> None:
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"cap must be an integer >= 1, got {cap!r}")
        self.path = Path(path)
        self.cap = cap
        if not self.path.is_file():
            raise LedgerError(
                f"no node ledger at {self.path} (create one with: python -m flwr_fedeval.keys create, "
                "or NodeLedger.create)"
            )
        with self._connect() as db:
            try:
                row = db.execute("SELECT version FROM schema_version").fetchone()
            except sqlite3.DatabaseError as exc:
                raise LedgerError(f"{self.path} is not a node ledger ({exc})") from None
        if row is None or row[0] != SCHEMA_VERSION:
            raise LedgerError(f"{self.path}: ledger schema {row[0] if row else None}, this code reads {SCHEMA_VERSION}")
        _keep_open(self.path)

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, cap: int = DEFAULT_CAP) -> NodeLedger:
        """Create an empty ledger at ``path`` (mode 0600, WAL) and open it.

        Raises
        ------
        LedgerError
            ``path`` exists (a ledger is never overwritten: that would forget what the node gave).
        """
        path = Path(path)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            raise LedgerError(f"refusing to overwrite the node ledger {path}") from None
        os.close(fd)
        try:
            db = sqlite3.connect(path, isolation_level=None)
            try:
                db.execute("PRAGMA journal_mode = WAL")
                db.execute("PRAGMA synchronous = FULL")
                db.execute("BEGIN IMMEDIATE")
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
                db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
                db.executemany("INSERT INTO row_counts VALUES (?, 0)", [(t,) for t in _TABLES])
                db.execute("COMMIT")
            finally:
                db.close()
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return cls(path, cap=cap)

    # --- connection and transaction ---------------------------------------------------------
    def _connect(self) -> contextlib.closing[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None)
            db.execute("PRAGMA synchronous = FULL")
        except sqlite3.Error as exc:
            raise LedgerError(f"node ledger {self.path}: {exc}") from None
        return contextlib.closing(db)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` … ``COMMIT`` (rolled back if the body raises); durable on return."""
        with self._connect() as db:
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise LedgerError(f"node ledger {self.path}: {exc}") from None
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            try:
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                raise LedgerError(f"node ledger {self.path}: commit failed ({exc}); nothing was recorded") from None

    def _room(self, db: sqlite3.Connection, table: str, adding: int = 1) -> None:
        """Count ``adding`` new rows of ``table`` (the caller inserts them in this transaction), or
        refuse at the bound. The counts live in ``row_counts``: O(1), not a table scan."""
        (rows,) = db.execute("SELECT count FROM row_counts WHERE name = ?", (table,)).fetchone()
        if rows + adding > self.cap:
            raise LedgerFull(
                f"node ledger {self.path}: table {table!r} holds {rows:,} records, the bound is "
                f"{self.cap:,}; it refuses every new one (nothing is forgotten: start a new node "
                "key and ledger)"
            )
        db.execute("UPDATE row_counts SET count = count + ? WHERE name = ?", (adding, table))

    # --- global models trained on -----------------------------------------------------------
    def record_training(self, model_hash: bytes, *, phase: str = "train") -> None:
        """Record that this node gives an update for the global model ``model_hash``.

        Parameters
        ----------
        model_hash : bytes
            The model's digest (e.g. SHA-256 of its arrays, 32 bytes).
        phase : str, default "train"
            A label shown by :meth:`summary` (the same model under another phase is still refused).

        Raises
        ------
        AlreadyGiven
            This model was recorded before (by any run, any phase).
        LedgerFull
            The table is at the bound.
        """
        model, phase = _blob(model_hash, "model_hash"), _text(phase, "phase")
        with self._transaction() as db:
            if db.execute("SELECT phase, recorded FROM trained WHERE model = ?", (model,)).fetchone():
                raise AlreadyGiven(
                    f"this node already gave an update for global model {model.hex()[:16]}… "
                    "(node ledger: one update per global model, across runs)"
                )
            self._room(db, "trained")
            db.execute("INSERT INTO trained VALUES (?, ?, ?)", (model, phase, _now()))

    def trained(self, model_hash: bytes) -> bool:
        """Whether ``model_hash`` was recorded by :meth:`record_training` (a read; no lock)."""
        with self._connect() as db:
            return (
                db.execute("SELECT 1 FROM trained WHERE model = ?", (_blob(model_hash, "model_hash"),)).fetchone()
                is not None
            )

    # --- ε ------------------------------------------------------------------------------------
    @staticmethod
    def _accountant(spends: list[float], budget: float) -> Any:
        """diffprivlib's accountant over ``spends`` (raises BudgetExhausted if they exceed ``budget``)."""
        from diffprivlib import BudgetAccountant

        from flwr_fedeval.dp.budget import BudgetError

        # pure ε, slack 0: the accountant's total is the sum of the spends (sequential composition),
        # so one entry of their (exactly rounded) sum is the same accountant, at O(1) cost
        spent = [(math.fsum(spends), 0.0)] if spends else []
        try:
            return BudgetAccountant(epsilon=budget, delta=0.0, spent_budget=spent)
        except (BudgetError, ValueError) as exc:
            raise BudgetExhausted(f"ε spent {math.fsum(spends):g} exceeds the budget {budget:g}: {exc}") from None

    def _spend(
        self, db: sqlite3.Connection, dataset: str, epsilon: float, budget: float, *, record: bool = True
    ) -> float:
        from flwr_fedeval.dp.budget import BudgetError, charge, check_epsilon

        dataset = _text(dataset, "dataset")
        epsilon = check_epsilon(epsilon, "epsilon")
        budget = check_epsilon(budget, "budget")
        spends = [e for (e,) in db.execute("SELECT epsilon FROM epsilon WHERE dataset = ? ORDER BY id", (dataset,))]
        accountant = self._accountant(spends, budget)
        try:
            charge(accountant, epsilon)
        except BudgetError as exc:
            raise BudgetExhausted(
                f"dataset {dataset!r}: ε {epsilon:g} requested, {math.fsum(spends):g} of the "
                f"budget {budget:g} spent before (node ledger, across runs): {exc}"
            ) from None
        if not record:
            return float(accountant.remaining()[0])
        self._room(db, "epsilon")
        db.execute(
            "INSERT INTO epsilon (dataset, epsilon, budget, recorded) VALUES (?, ?, ?, ?)",
            (dataset, epsilon, budget, _now()),
        )
        return float(accountant.remaining()[0])

    def spend_epsilon(self, dataset: str, epsilon: float, budget: float) -> float:
        """Charge ``epsilon`` to ``dataset`` against a total of ``budget``; the ε left after it.

        Pure ε-differential privacy under sequential composition (diffprivlib ``BudgetAccountant``
        with ``delta = 0``, ``slack = 0``): the spends recorded for ``dataset`` plus ``epsilon`` must
        not exceed ``budget``. ``budget`` is the caller's current total (the node policy, tightened
        by the run); spends of earlier runs count against it.

        Parameters
        ----------
        dataset : str
            The data whose privacy the ε measures (non-empty).
        epsilon : float
            > 0; ``inf`` (no noise) only against an infinite budget.
        budget : float
            > 0 (``inf``: no bound).

        Returns
        -------
        float
            ε left of ``budget`` after this spend.

        Raises
        ------
        BudgetExhausted
            The spend would exceed ``budget`` (nothing is recorded).
        TypeError, ValueError
            ``epsilon`` or ``budget`` not a number > 0, or ``dataset`` empty.
        """
        with self._transaction() as db:
            return self._spend(db, dataset, epsilon, budget)

    def check_spend(self, dataset: str, epsilon: float, budget: float) -> float:
        """What :meth:`spend_epsilon` would leave, without recording anything (a read).

        Raises
        ------
        BudgetExhausted
            :meth:`spend_epsilon` would refuse it now.
        """
        with self._connect() as db:
            return self._spend(db, dataset, epsilon, budget, record=False)

    def spent(self, dataset: str) -> float:
        """Total ε recorded for ``dataset`` (0.0 if none; a read)."""
        with self._connect() as db:
            (total,) = db.execute(
                "SELECT TOTAL(epsilon) FROM epsilon WHERE dataset = ?", (_text(dataset, "dataset"),)
            ).fetchone()
        return float(total)

    def remaining(self, dataset: str, budget: float) -> float:
        """ε left of ``budget`` for ``dataset`` (diffprivlib's ``remaining()``; a read).

        Raises
        ------
        BudgetExhausted
            The recorded spends already exceed ``budget`` (a budget tightened below them).
        """
        with self._connect() as db:
            spends = [
                e
                for (e,) in db.execute(
                    "SELECT epsilon FROM epsilon WHERE dataset = ? ORDER BY id", (_text(dataset, "dataset"),)
                )
            ]
        return float(self._accountant(spends, budget).remaining()[0])

    # --- permanent randomized response ----------------------------------------------------------
    def randomized_response(
        self,
        dataset: str,
        key: bytes,
        draw: Callable[[], np.ndarray],
        *,
        epsilon: float | None = None,
        budget: float = math.inf,
    ) -> np.ndarray:
        """The stored randomized response for ``(dataset, key)``, or ``draw()``'s, stored first.

        RAPPOR's *permanent* randomized response (Erlingsson et al. 2014, §3): the response to a
        given value is drawn once and memoised, so a collector that asks again (a new run, a new
        request) gets the same response and cannot average the randomness away. With ``epsilon``,
        drawing charges it to ``dataset`` (:meth:`spend_epsilon`) in the same transaction; a stored
        response costs nothing (post-processing).

        Parameters
        ----------
        dataset : str
        key : bytes
            What the response is of: e.g. a digest of the labels, the ε and the decision points.
        draw : callable
            ``() -> ndarray`` (numeric, not object); called at most once, inside the transaction.
        epsilon, budget : float, optional
            The ε a fresh draw costs and the total it is checked against.

        Returns
        -------
        ndarray
            The stored or newly drawn response (same dtype and shape as ``draw`` gave).

        Raises
        ------
        BudgetExhausted
            A draw is needed and its ε exceeds the budget (nothing drawn or stored).
        TypeError
            ``draw`` returned something other than a numeric array.
        """
        dataset, key = _text(dataset, "dataset"), _blob(key, "key")
        with self._transaction() as db:
            row = db.execute("SELECT output FROM responses WHERE dataset = ? AND key = ?", (dataset, key)).fetchone()
            if row is not None:
                return _array_of(row[0])
            self._room(db, "responses")
            if epsilon is not None:
                self._spend(db, dataset, epsilon, budget)
            out = np.asarray(draw())
            if out.dtype.hasobject or out.dtype.kind not in "biuf":
                raise TypeError(f"draw() must return a numeric array, got dtype {out.dtype}")
            db.execute("INSERT INTO responses VALUES (?, ?, ?, ?)", (dataset, key, _array_bytes(out), _now()))
            return out

    def response(self, dataset: str, key: bytes) -> np.ndarray | None:
        """The stored randomized response for ``(dataset, key)``, or ``None`` (a read)."""
        with self._connect() as db:
            row = db.execute(
                "SELECT output FROM responses WHERE dataset = ? AND key = ?",
                (_text(dataset, "dataset"), _blob(key, "key")),
            ).fetchone()
        return None if row is None else _array_of(row[0])

    # --- evaluations per model -----------------------------------------------------------------
    def record_evaluation(self, model_hash: bytes, phase: str, limit: int) -> int:
        """Count one more evaluation of ``model_hash`` (under ``phase``); the number answered before.

        The limit is on the model's evaluations over **all** phases (a second evaluation of one
        model, over another subset or by another protocol, gives a difference).

        Raises
        ------
        AlreadyGiven
            ``limit`` evaluations of this model were answered (by any run; nothing recorded).
        ValueError
            ``limit`` < 1.
        """
        model, phase = _blob(model_hash, "model_hash"), _text(phase, "phase")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        with self._transaction() as db:
            (done,) = db.execute("SELECT TOTAL(count) FROM evaluations WHERE model = ?", (model,)).fetchone()
            done = int(done)
            if done >= limit:
                raise AlreadyGiven(
                    f"this node already answered {done} evaluation(s) of global model "
                    f"{model.hex()[:16]}… (node ledger, across runs; limit {limit})"
                )
            if (
                db.execute(
                    "UPDATE evaluations SET count = count + 1, recorded = ? WHERE model = ? AND phase = ?",
                    (_now(), model, phase),
                ).rowcount
                == 0
            ):
                self._room(db, "evaluations")
                db.execute("INSERT INTO evaluations VALUES (?, ?, 1, ?)", (model, phase, _now()))
            return done

    def evaluations(self, model_hash: bytes) -> int:
        """Evaluations of ``model_hash`` answered, over all phases (a read)."""
        with self._connect() as db:
            (done,) = db.execute(
                "SELECT TOTAL(count) FROM evaluations WHERE model = ?", (_blob(model_hash, "model_hash"),)
            ).fetchone()
        return int(done)

    # --- SecSV ------------------------------------------------------------------------------------
    def record_deal(self, deal_id: bytes) -> None:
        """Record that the auxiliary server answers the sealed deal ``deal_id`` (a digest of it).

        A dealt zero test (a Beaver triple and a multiplier r) is single-use: answering it twice
        with two label shares gives P the difference, r itself (Beaver 1991).

        Raises
        ------
        AlreadyGiven
            This deal was answered before.
        """
        deal = _blob(deal_id, "deal_id")
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM deals WHERE deal = ?", (deal,)).fetchone():
                raise AlreadyGiven(f"sealed deal {deal.hex()[:16]}… was answered before (each deal once)")
            self._room(db, "deals")
            db.execute("INSERT INTO deals VALUES (?, ?)", (deal, _now()))

    def record_batch(self, round_: int, coalition: Iterable[str], samples: Iterable[str], *, scope: str = "") -> None:
        """Record that the (round, coalition, sample) triples of one batch are decrypted, all or none.

        Parameters
        ----------
        round_ : int
            The training round (>= 0).
        coalition : iterable of str
            The coalition's members (stable names; order does not matter).
        samples : iterable of str
            The batch's samples (stable names, e.g. ``"<owner>/<index>"``), non-empty, distinct.
        scope : str, default ""
            What else identifies the models (e.g. the run), so that new models are not refused.

        Raises
        ------
        AlreadyGiven
            One of the triples was recorded before (nothing of this batch is recorded).
        ValueError
            Empty or repeated samples, a negative round.
        """
        if isinstance(round_, bool) or not isinstance(round_, (int, np.integer)) or round_ < 0:
            raise ValueError(f"round_ must be an integer >= 0, got {round_!r}")
        members = ",".join(sorted(_text(str(m), "coalition member") for m in coalition))
        samples = [_text(str(s), "sample") for s in samples]
        if not members or not samples or len(set(samples)) != len(samples):
            raise ValueError("a batch needs a coalition and distinct samples")
        rows = [(str(scope), int(round_), members, s) for s in samples]
        with self._transaction() as db:
            for row in rows:
                if db.execute(
                    "SELECT 1 FROM batches WHERE scope = ? AND round = ? AND coalition = ? AND sample = ?", row
                ).fetchone():
                    raise AlreadyGiven(
                        f"round {round_}, coalition [{members}], sample {row[3]} was decrypted "
                        "before (each once, by any helper)"
                    )
            self._room(db, "batches", len(rows))
            db.executemany("INSERT INTO batches VALUES (?, ?, ?, ?)", rows)

    # --- reading ------------------------------------------------------------------------------------
    def summary(self) -> LedgerSummary:
        """Everything the ledger holds, aggregated (:class:`LedgerSummary`; a read)."""
        with self._connect() as db:
            trained = dict(db.execute("SELECT phase, COUNT(*) FROM trained GROUP BY phase"))
            eps = {}
            for (dataset,) in db.execute("SELECT DISTINCT dataset FROM epsilon ORDER BY dataset").fetchall():
                spends = [
                    e for (e,) in db.execute("SELECT epsilon FROM epsilon WHERE dataset = ? ORDER BY id", (dataset,))
                ]
                (budget,) = db.execute(
                    "SELECT budget FROM epsilon WHERE dataset = ? ORDER BY id DESC LIMIT 1", (dataset,)
                ).fetchone()
                left = max(0.0, budget - math.fsum(spends))
                eps[dataset] = (math.fsum(spends), left, len(spends))
            responses = dict(db.execute("SELECT dataset, COUNT(*) FROM responses GROUP BY dataset"))
            evaluations = [
                (bytes(m).hex(), p, int(c))
                for m, p, c in db.execute("SELECT model, phase, count FROM evaluations ORDER BY recorded, model")
            ]
            (deals,) = db.execute("SELECT COUNT(*) FROM deals").fetchone()
            (batches,) = db.execute("SELECT COUNT(*) FROM batches").fetchone()
        return LedgerSummary(
            str(self.path), SCHEMA_VERSION, trained, eps, responses, evaluations, int(deals), int(batches), self.cap
        )

    def __repr__(self) -> str:
        return f"NodeLedger({str(self.path)!r}, cap={self.cap})"
