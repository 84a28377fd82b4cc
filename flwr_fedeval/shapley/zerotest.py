"""SecSV's comparison without the difference: P opens ``r·(Ŷ − Y)``, never ``Ŷ − Y``.

Algorithm 4 of Zheng, Cao, Yoshikawa (PVLDB 16(7) 2023) has P reconstruct ``Ỹ = Ŷ − Y``
from both servers' shares (steps 12–13) and test ``|Ỹ[k]| < 0.5`` (step 14). The value of
``Ỹ`` is more than the paper's leakage: on a binary task a misclassified sample has
``Ỹ = ±1``, whose sign is its label. Here P opens ``z = r·Ỹ`` instead, with ``r`` uniform on
``F_p^*`` and unknown to P: ``z = 0`` iff the prediction is correct, and otherwise ``z`` is
uniform on ``F_p^*`` whatever ``Ỹ`` is — P's view per sample is the correct/incorrect bit
(the random-multiplier zero test, e.g. Nishide & Ohta, PKC 2007, §3; in a prime field every
non-zero ``Ỹ`` is a unit, so unlike ``Z_2^k`` no 2-adic valuation of ``Ỹ`` leaks).

Labels are therefore shared over ``F_p`` (:data:`LABEL_PRIME` ``= 2^31 − 1``; class indices
``< p``, so ``Ỹ ≢ 0`` when ``Ŷ ≠ Y``); the features stay in ``Z_2^k``.

The product ``r·Y`` needs a multiplication between P's label share ``Y'`` and ``r``; the
helper client (who already knows ``Ŷ``: it decrypts the scores, Algorithm 4 step 11) is the
dealer of the correlated randomness, as in Beaver's trusted-dealer multiplication (Beaver,
CRYPTO 1991): a one-round product of a P-held and an A-held value.

=================  ==============================================================================
party              what
=================  ==============================================================================
helper (dealer)    :func:`deal`: ``r ∈ F_p^*``; ``q = r·Ŷ`` split ``q' + q''``; ``u, v`` uniform,
                   ``c' + c'' = u·v``. To P: ``(q', u, c')``; to A (sealed): ``(q'', r, v, c'')``
P                  :func:`mask_label_share`: ``e = Y' − u`` (to A; uniform, hides ``Y'``)
A                  :func:`aux_share`: ``f = r − v`` (uniform, hides ``r``) and
                   ``z'' = q'' − r·Y'' − (c'' + e·v)``
P                  :func:`open_zero_test`: ``z' = q' − (c' + u·f + e·f)``;
                   ``z = z' + z'' = r·(Ŷ − Y)``; correct iff ``z = 0``
=================  ==============================================================================

Correctness: ``(c' + u f + e f) + (c'' + e v) = u v + u f + e f + e v = (u + e)(v + f) = Y'·r``,
so ``z = r·Ŷ − r·Y'' − r·Y' = r·(Ŷ − Y)``.

Views (P and A do not collude; the helper colludes with neither): P sees ``q', u, c', f``
(uniform and independent) and ``z'' = z − z'`` (so ``z``: 0 or uniform on ``F_p^*``); A sees
``q'', r, v, c'', e`` (uniform, independent of ``Ŷ`` and ``Y``); the helper sees ``Ŷ`` (as in
the paper) and its own randomness, never ``Y``. A P that sends a wrong ``e`` opens
``z + δ·v`` with ``v`` uniform and unknown to it: nothing about ``Ỹ``.

(Module name: Flower's FAB builder leaves out ``*_test.py`` and ``test_*.py`` files, so not
``zero_test.py``.)

Arithmetic: uint64 arrays, values in ``[0, p)``; products of two values ``< 2^31`` fit in 62 bits.
Randomness from ``os.urandom`` (:func:`flwr_fedeval.shapley.sharing.random_field`).
No flwr and no TensorFlow imports.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from flwr_fedeval.shapley.sharing import LABEL_PRIME, random_field

__all__ = ["AuxDeal", "PDeal", "aux_share", "check_field", "deal", "mask_label_share", "open_zero_test"]

_U64 = NDArray[np.uint64]


class PDeal(NamedTuple):
    """The helper's message to P, each uint64 ``(n,)`` in ``F_p``: ``q'``, ``u``, ``c'``."""

    q: _U64
    u: _U64
    c: _U64


class AuxDeal(NamedTuple):
    """The helper's message to A (sealed), each uint64 ``(n,)`` in ``F_p``: ``q''``, ``r`` (non-zero),
    ``v``, ``c''``."""

    q: _U64
    r: _U64
    v: _U64
    c: _U64


def check_field(a: ArrayLike, name: str, n: int | None = None, p: int = LABEL_PRIME) -> _U64:
    """``a`` as uint64 ``(n,)`` with every value in ``[0, p)``.

    Raises
    ------
    ValueError
        Another shape, or a value ``≥ p`` (not a canonical element of ``F_p``).
    """
    arr: _U64 = np.asarray(a, dtype=np.uint64)
    if arr.ndim != 1 or (n is not None and arr.shape != (n,)):
        raise ValueError(f"{name} has shape {arr.shape}, expected ({'n' if n is None else n},)")
    if arr.size and int(arr.max()) >= p:
        raise ValueError(f"{name} holds values >= p = {p} (not elements of F_p)")
    return arr


def _mul(a: _U64, b: _U64, p: int) -> _U64:
    out: _U64 = (a * b) % np.uint64(p)
    return out


def _add(a: _U64, b: _U64, p: int) -> _U64:
    out: _U64 = (a + b) % np.uint64(p)
    return out


def _sub(a: _U64, b: _U64, p: int) -> _U64:
    out: _U64 = (a + np.uint64(p) - b) % np.uint64(p)
    return out


def deal(pred: ArrayLike, p: int = LABEL_PRIME) -> tuple[PDeal, AuxDeal]:
    """Helper client: the correlated randomness of one batch, and shares of ``r·Ŷ``.

    Parameters
    ----------
    pred : ndarray of shape (n,), integer
        Predicted labels ``Ŷ`` (class indices, ``< p``).
    p : int
        The label field's prime (:data:`LABEL_PRIME`; at most ``2^31``: products fit in uint64).

    Returns
    -------
    PDeal, AuxDeal
        P's part ``(q', u, c')`` and A's part ``(q'', r, v, c'')``; ``r`` uniform on ``F_p^*``.
    """
    if not 2 < p <= 2 ** 31:
        raise ValueError(f"p must be a prime in (2, 2^31], got {p}")
    y_hat = check_field(pred, "predicted labels", p=p)
    n = y_hat.shape
    r = _add(random_field(n, p - 1), np.ones(n, dtype=np.uint64), p)    # uniform on 1..p-1
    q = _mul(r, y_hat, p)
    q_aux, u, v, c_p = (random_field(n, p) for _ in range(4))
    c_aux = _sub(_mul(u, v, p), c_p, p)
    return PDeal(_sub(q, q_aux, p), u, c_p), AuxDeal(q_aux, r, v, c_aux)


def mask_label_share(y_share: ArrayLike, deal_p: PDeal, p: int = LABEL_PRIME) -> _U64:
    """P: ``e = Y' − u`` (sent to A; uniform since ``u`` is)."""
    y = check_field(y_share, "label share", deal_p.u.shape[0], p)
    return _sub(y, deal_p.u, p)


def aux_share(deal_a: AuxDeal, y_share: ArrayLike, e: ArrayLike, p: int = LABEL_PRIME) -> tuple[_U64, _U64]:
    """A: ``f = r − v`` and its share ``z'' = q'' − r·Y'' − (c'' + e·v)`` of ``r·(Ŷ − Y)``.

    Raises
    ------
    ValueError
        Shapes differ or a value is not in ``F_p`` (e.g. a malformed ``e`` from P).
    """
    n = deal_a.r.shape[0]
    y = check_field(y_share, "label share", n, p)
    e_ = check_field(e, "masked label share e", n, p)
    if np.any(deal_a.r == 0):
        raise ValueError("the multiplier r has a zero (the helper's deal is malformed)")
    s_aux = _add(deal_a.c, _mul(e_, deal_a.v, p), p)
    z_aux = _sub(_sub(deal_a.q, _mul(deal_a.r, y, p), p), s_aux, p)
    return _sub(deal_a.r, deal_a.v, p), z_aux


def open_zero_test(deal_p: PDeal, e: _U64, f: ArrayLike, z_aux: ArrayLike, p: int = LABEL_PRIME,
                   ) -> tuple[NDArray[np.bool_], _U64]:
    """P: ``z = z' + z''`` with ``z' = q' − (c' + u·f + e·f)``; ``z = 0`` marks a correct prediction.

    Returns
    -------
    correct : ndarray of shape (n,), bool
    z : ndarray of shape (n,), uint64
        The opened values (0, or uniform on ``F_p^*``): P's whole view of the comparison.
    """
    n = deal_p.u.shape[0]
    f_ = check_field(f, "f", n, p)
    z2 = check_field(z_aux, "aux share z''", n, p)
    s_p = _add(_add(deal_p.c, _mul(deal_p.u, f_, p), p), _mul(e, f_, p), p)
    z = _add(_sub(deal_p.q, s_p, p), z2, p)
    ok: NDArray[np.bool_] = z == 0
    return ok, z
