"""Messages of the plaintext AUC phase: decision points in, TP/FP/TN/FN out.

Two steps (Baykara et al. 2025, Eqs. 2-3, the reference protocol the FHE and DP
phases replace):

* ``query.auc_join``: :class:`JoinRequest` (a fresh session) in, :class:`JoinReply` (the node's
  roster name and its signature over the session) out;
* ``evaluate.threshold_counts``: :class:`ThresholdCountsRequest` (+ Flower's model record and
  the :class:`SignedParticipants` list) in, :class:`ThresholdCounts` out.

Who takes part is the participants' word, not the server's: every member signs its
joining of the session (:data:`JOIN_ROLE` over the session, the
:func:`flwr_fedeval.identity.key_statement` transcript), the server relays the ordered list of
names with every member's signature, and each client checks every signature against the roster,
finds itself in the list and at least its floor of members. The DP phases use the same join
payloads under their own message type (:mod:`flwr_fedeval.protocol.dp_auc`).

The decision points (record ``evaluation``) and the counts (record ``counts``)
are shared with the DP phases (:mod:`flwr_fedeval.protocol.dp_auc`: DPAUC_Lap
sends the same request plus ε, DPAUC_RR replies the same counts) and the FHE
phase's request (:func:`decision_points_entry`, :func:`decision_points_from`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import ClassVar, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster, sign_key, verify_key
from flwr_fedeval.metrics.counts import ConfusionCounts
from flwr_fedeval.protocol._base import (
    MalformedMessage,
    Payload,
    Step,
    array_field,
    array_record,
    config_bytes,
    config_field,
    config_list,
    config_of,
    config_record,
)

__all__ = [
    "COUNTS_KEY",
    "COUNT_FIELDS",
    "EVALUATE_THRESHOLD_COUNTS",
    "EVALUATION_KEY",
    "JOIN",
    "JoinReply",
    "JoinRequest",
    "PointCounts",
    "SignedParticipants",
    "STEPS",
    "THRESHOLD_COUNTS",
    "ThresholdCounts",
    "ThresholdCountsRequest",
    "decision_points_entry",
    "decision_points_from",
]

#: Message type of the plaintext AUC phase's one step.
EVALUATE_THRESHOLD_COUNTS = "evaluate.threshold_counts"
#: Request record (ArrayRecord): ``thresholds``, the public decision points.
EVALUATION_KEY = "evaluation"
#: Reply record (ArrayRecord): ``tp``, ``fp``, ``tn``, ``fn``.
COUNTS_KEY = "counts"
_THRESHOLDS = "thresholds"
#: The field names of the four counts, in :class:`~flwr_fedeval.metrics.counts.ConfusionCounts` order.
COUNT_FIELDS = ("tp", "fp", "tn", "fn")
#: Message type of the plaintext phase's join step.
QUERY_AUC_JOIN = "query.auc_join"
#: Join request record (ConfigRecord): ``session``. Join reply record: ``signer``, ``signature``.
JOIN_KEY = "evaluation-join"
JOINED_KEY = "evaluation-joined"
#: The signed participant list next to an evaluation request (ConfigRecord ``session``, ``names``,
#: ``signatures``).
PARTICIPANTS_KEY = "evaluation-participants"
#: ``protocol`` and ``role`` of the join statements (:func:`flwr_fedeval.identity.key_statement`).
SIGNED_PROTOCOL, JOIN_ROLE = "auc-evaluation", "participant"
_MAX_SIGNATURE_BYTES = 256

C = TypeVar("C", bound="PointCounts")


# ------------------------------------------------------------------ decision points
def decision_points_entry(thresholds: np.ndarray) -> dict[str, ArrayRecord]:
    """``{"evaluation": ArrayRecord({"thresholds": ...})}``, to merge into a request's content.

    ``thresholds`` : float64 array of shape (N,), the strictly descending public decision points θ.
    """
    return {EVALUATION_KEY: ArrayRecord({_THRESHOLDS: Array(np.ascontiguousarray(thresholds, dtype=np.float64))})}


def decision_points_from(content: RecordDict) -> np.ndarray:
    """The decision points θ of a request: float64 of shape (N,), N ≥ 1, finite, strictly descending.

    Raises
    ------
    MalformedMessage
        If the record or field is missing, not a 1-D float64 array, empty, not finite,
        or not strictly descending.
    """
    field = f"{EVALUATION_KEY}.{_THRESHOLDS}"
    theta = array_field(array_record(content, EVALUATION_KEY), EVALUATION_KEY, _THRESHOLDS,
                        dtype=np.float64, shape=(None,), finite=True)
    if theta.size == 0:
        raise MalformedMessage(field, "no decision points")
    if (np.diff(theta) >= 0).any():
        raise MalformedMessage(field, "decision points must be strictly descending")
    return theta


# ------------------------------------------------------------------ payloads
@dataclasses.dataclass(frozen=True)
class ThresholdCountsRequest(Payload):
    """Request of ``evaluate.threshold_counts``: the public decision points.

    Attributes
    ----------
    thresholds : ndarray of float64, shape (N,)
        Decision points θ_0 > … > θ_{N-1}, finite (:func:`~flwr_fedeval.metrics.counts.decision_points`).
        Inside [0, 1] they are probabilities; otherwise the scores' own units (logits).

    participants : SignedParticipants or None
        ``evaluation-participants``: the members' signed list of the join step (``None``: no join
        step ran; a node with a roster identity refuses such a request).

    The server adds the global model under its ``arrayrecord_key`` (Flower's record, not parsed here).
    """

    LABEL = "threshold counts request"
    thresholds: np.ndarray
    participants: SignedParticipants | None = None

    def _to_record(self) -> RecordDict:
        return RecordDict({**decision_points_entry(self.thresholds),
                           **(self.participants.entry() if self.participants is not None else {})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> ThresholdCountsRequest:
        return cls(decision_points_from(content), SignedParticipants.from_content(content))


# ------------------------------------------------------------------ who takes part
def _join_statement_key(session: str) -> bytes:
    return b"join:" + session.encode()


@dataclasses.dataclass(frozen=True)
class JoinRequest(Payload):
    """Join step request: ``evaluation-join.session`` (fresh per evaluation, chosen by the server)."""

    LABEL = "evaluation join request"
    session: str

    def _to_record(self) -> RecordDict:
        return RecordDict({JOIN_KEY: ConfigRecord({"session": self.session})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> JoinRequest:
        session = config_field(config_record(content, JOIN_KEY), JOIN_KEY, "session", str)
        if not 16 <= len(session) <= 128:
            raise MalformedMessage(f"{JOIN_KEY}.session", "must be 16 to 128 characters")
        return cls(session)


@dataclasses.dataclass(frozen=True)
class JoinReply(Payload):
    """Join step reply: ``evaluation-joined.signer`` (roster name) and ``signature`` over the session
    (:func:`sign_join`); both absent (``None``) from a node configured without a roster identity,
    which therefore checks no list either."""

    LABEL = "evaluation join reply"
    signer: str | None = None
    signature: bytes | None = None

    @property
    def signed(self) -> bool:
        """Whether the node signed (it has a roster identity)."""
        return self.signer is not None

    def _to_record(self) -> RecordDict:
        return RecordDict({JOINED_KEY: config_of({"signer": self.signer, "signature": self.signature})})

    @classmethod
    def _from_record(cls, content: RecordDict) -> JoinReply:
        rec = config_record(content, JOINED_KEY)
        if "signer" not in rec and "signature" not in rec:
            return cls()
        return cls(config_field(rec, JOINED_KEY, "signer", str),
                   config_bytes(rec, JOINED_KEY, "signature", max_length=_MAX_SIGNATURE_BYTES))


def sign_join(identity: NodeIdentity, session: str) -> JoinReply:
    """``identity``'s signature of its joining ``session`` (role :data:`JOIN_ROLE`)."""
    return JoinReply(identity.name, sign_key(identity, protocol=SIGNED_PROTOCOL, session=session, round=0,
                                             role=JOIN_ROLE, key=_join_statement_key(session)))


@dataclasses.dataclass(frozen=True)
class SignedParticipants:
    """The ordered participant list of one evaluation, every member's join signature next to its name.

    Attributes
    ----------
    session : str
        The session every member signed.
    names : tuple of str
        Roster names, sorted and distinct: party ``i`` is ``names[i]``.
    signatures : tuple of bytes
        ``signatures[i]``: ``names[i]``'s join signature over ``session``.
    """

    session: str
    names: tuple[str, ...]
    signatures: tuple[bytes, ...]

    @classmethod
    def of(cls, session: str, replies: list[JoinReply]) -> SignedParticipants:
        """The list of ``replies`` in name order."""
        ordered = sorted((r for r in replies if r.signed), key=lambda r: str(r.signer))
        return cls(session, tuple(str(r.signer) for r in ordered), tuple(bytes(r.signature or b"") for r in ordered))

    def digest(self) -> bytes:
        """SHA-256 of the session and the ordered names (what a member binds its randomness to)."""
        h = hashlib.sha256(b"flwr-fedeval/auc-evaluation/participants/v1" + struct.pack(">I", len(self.names)))
        for part in (self.session, *self.names):
            data = part.encode()
            h.update(struct.pack(">I", len(data)) + data)
        return h.digest()

    def verify(self, roster: Roster, *, own: str | None = None, floor: int = 2) -> int | None:
        """Check the list; ``own``'s party index (``None`` without ``own``).

        ▲ names sorted and distinct, one signature each; ▲ every member's join signature over
        ``session`` verifies against the roster; ▲ ``own`` listed; ▲ at least ``floor`` members.

        Raises
        ------
        flwr_fedeval.identity.IdentityError
            Naming the failed check.
        """
        if list(self.names) != sorted(set(self.names)) or len(self.signatures) != len(self.names):
            raise IdentityError("participant list: names not sorted and distinct, or not one signature per name")
        for name, signature in zip(self.names, self.signatures):
            try:
                verify_key(roster, name, signature, protocol=SIGNED_PROTOCOL, session=self.session, round=0,
                           role=JOIN_ROLE, key=_join_statement_key(self.session))
            except IdentityError as exc:
                raise IdentityError(f"participant list refused: {exc}") from None
        if len(self.names) < floor:
            raise IdentityError(f"participant list of session {self.session} has {len(self.names)} members, "
                                f"this node requires at least {floor}")
        if own is None:
            return None
        if own not in self.names:
            raise IdentityError(f"participant list of session {self.session} does not list this node ({own!r})")
        return self.names.index(own)

    def entry(self) -> dict[str, ConfigRecord]:
        """``{PARTICIPANTS_KEY: ConfigRecord}``, to merge into a request's content."""
        return {PARTICIPANTS_KEY: ConfigRecord({"session": self.session, "names": list(self.names),
                                                "signatures": list(self.signatures)})}

    @classmethod
    def from_content(cls, content: RecordDict) -> SignedParticipants | None:
        """The list a request carries, or ``None``.

        Raises
        ------
        MalformedMessage
            A field missing or of another type.
        """
        if PARTICIPANTS_KEY not in content:
            return None
        rec = config_record(content, PARTICIPANTS_KEY)
        names = config_list(rec, PARTICIPANTS_KEY, "names", str)
        signatures = config_list(rec, PARTICIPANTS_KEY, "signatures", bytes, length=len(names))
        if not names:
            raise MalformedMessage(f"{PARTICIPANTS_KEY}.names", "empty")
        return cls(config_field(rec, PARTICIPANTS_KEY, "session", str), tuple(names),
                   tuple(bytes(s) for s in signatures))


@dataclasses.dataclass(frozen=True)
class PointCounts(Payload):
    """Base of the replies that carry four arrays ``tp``, ``fp``, ``tn``, ``fn`` of one value per
    decision point, in record ``KEY`` with dtype ``DTYPE`` (:class:`ThresholdCounts`,
    :class:`~flwr_fedeval.protocol.dp_auc.NoisyCounts`).

    :meth:`from_record` also takes ``num_points=N`` (the decision points the server sent) and
    then requires shape (N,).

    Raises (``from_record``)
    ------
    MalformedMessage
        A field missing, not of ``DTYPE``, not of one shape (N,), or NaN/infinite.
    """

    KEY: ClassVar[str] = ""
    DTYPE: ClassVar[type] = np.float64
    tp: np.ndarray
    fp: np.ndarray
    tn: np.ndarray
    fn: np.ndarray

    def _to_record(self) -> RecordDict:
        return RecordDict({self.KEY: ArrayRecord({k: Array(np.ascontiguousarray(getattr(self, k), dtype=self.DTYPE))
                                                  for k in COUNT_FIELDS})})

    @classmethod
    def _arrays(cls, content: RecordDict) -> dict[str, np.ndarray]:
        rec = array_record(content, cls.KEY)
        out: dict[str, np.ndarray] = {}
        for name in COUNT_FIELDS:
            first = out.get(COUNT_FIELDS[0])
            out[name] = array_field(rec, cls.KEY, name, dtype=cls.DTYPE, finite=True,
                                    shape=(None,) if first is None else first.shape)
        return out

    @classmethod
    def _from_record(cls: type[C], content: RecordDict) -> C:
        return cls(**cls._arrays(content))

    @classmethod
    def from_record(cls: type[C], content: RecordDict, *, node: int | None = None,
                    num_points: int | None = None) -> C:
        """:meth:`Payload.from_record`, and every field of shape ``(num_points,)`` when given."""
        reply = super().from_record(content, node=node)
        for name in COUNT_FIELDS:
            shape = getattr(reply, name).shape
            if num_points is not None and shape != (num_points,):
                raise MalformedMessage(f"{cls.KEY}.{name}", f"shape {shape}, expected ({num_points},)", node=node)
        return reply

    def values(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(tp, fp, tn, fn)``."""
        return self.tp, self.fp, self.tn, self.fn


@dataclasses.dataclass(frozen=True)
class ThresholdCounts(PointCounts):
    """Reply of ``evaluate.threshold_counts`` (and of DPAUC_RR): one client's TP/FP/TN/FN.

    Attributes
    ----------
    tp, fp, tn, fn : ndarray of int64, shape (N,)
        Counts at each decision point (descending θ, so TP and FP are non-decreasing;
        TP+FN = P and FP+TN = N_neg at every point), Baykara et al. 2025, Eq. 2.

    Raises (``from_record``)
    ------
    MalformedMessage
        As :class:`PointCounts`; also a negative count, TP/FP decreasing, or TP+FN / FP+TN
        not constant over the decision points.
    """

    LABEL = "threshold counts"
    KEY = COUNTS_KEY
    DTYPE = np.int64

    @classmethod
    def of(cls, counts: ConfusionCounts) -> ThresholdCounts:
        """The reply carrying ``counts``."""
        return cls(*(np.ascontiguousarray(a, dtype=np.int64) for a in counts))

    def counts(self) -> ConfusionCounts:
        """The counts as :class:`~flwr_fedeval.metrics.counts.ConfusionCounts` (int64)."""
        return ConfusionCounts(*self.values())

    @classmethod
    def _from_record(cls, content: RecordDict) -> ThresholdCounts:
        a = cls._arrays(content)
        for name, v in a.items():
            if (v < 0).any():
                raise MalformedMessage(f"{COUNTS_KEY}.{name}", "negative counts")
        for name in ("tp", "fp"):
            if (np.diff(a[name]) < 0).any():
                raise MalformedMessage(f"{COUNTS_KEY}.{name}", "must be non-decreasing over descending decision points")
        for x, y in (("tp", "fn"), ("fp", "tn")):
            if np.unique(a[x] + a[y]).size > 1:
                raise MalformedMessage(f"{COUNTS_KEY}.{y}",
                                       f"{x.upper()}+{y.upper()} must be the same at every decision point")
        return cls(**a)


THRESHOLD_COUNTS = Step("threshold counts", EVALUATE_THRESHOLD_COUNTS, "client", ThresholdCountsRequest,
                        ThresholdCounts)
#: The join step (every member signs its joining of the session).
JOIN = Step("join (signed participation)", QUERY_AUC_JOIN, "client", JoinRequest, JoinReply)
#: The plaintext AUC phase's step table.
STEPS = (JOIN, THRESHOLD_COUNTS)
