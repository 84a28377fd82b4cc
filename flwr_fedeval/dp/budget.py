"""Privacy-budget bookkeeping and per-client randomness for the DP AUC baselines.

diffprivlib mechanisms do **not** charge a :class:`~diffprivlib.BudgetAccountant`
by themselves (only diffprivlib's models/tools do). Every client step in
:mod:`flwr_fedeval.dp` therefore calls :func:`charge` *before* it draws any
noise, so that a run that would exceed the configured total budget raises
:class:`~diffprivlib.utils.BudgetError` before a noisy value exists, let alone
leaves the client.

Each client holds its own accountant (local DP: the budget protects the labels
of *that* client's test split). Composition is pure sequential composition
(``slack = 0``), as in both papers.
"""

from __future__ import annotations

import math
import secrets
from numbers import Real

import numpy as np
from diffprivlib import BudgetAccountant
from diffprivlib.utils import BudgetError

__all__ = [
    "BudgetError",
    "charge",
    "check_epsilon",
    "client_random_state",
]

def check_epsilon(epsilon: float, name: str = "epsilon", *, allow_inf: bool = True) -> float:
    """Validate a privacy budget: a real number ``> 0`` (``inf`` = no noise).

    Raises
    ------
    TypeError
        If ``epsilon`` is not a real number (``bool`` is rejected).
    ValueError
        If ``epsilon`` is NaN, ``<= 0``, or infinite while ``allow_inf`` is False.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real):
        raise TypeError(f"{name} must be a real number, got {type(epsilon).__name__}")
    epsilon = float(epsilon)
    if math.isnan(epsilon) or epsilon <= 0.0:
        raise ValueError(f"{name} must be > 0 (math.inf disables the noise), got {epsilon!r}")
    if math.isinf(epsilon) and not allow_inf:
        raise ValueError(f"{name} must be finite, got {epsilon!r}")
    return epsilon


#: What a client may pass as ``random_state`` (see :func:`client_random_state`).
RandomStateLike = int | np.integer | np.random.RandomState | None


def client_random_state(random_state: RandomStateLike = None) -> np.random.RandomState:
    """The one random-number source of one client.

    Parameters
    ----------
    random_state : int, numpy.random.RandomState or None
        ``int``: a new ``RandomState`` seeded with it (reproducible experiments,
        one seed per client). A ``RandomState``: used as is (the caller keeps one
        per client and passes it to every step). ``None``: a ``RandomState`` over
        MT19937 seeded with 128 bits from :mod:`secrets`.

    Notes
    -----
    MT19937 is not a cryptographically secure generator; with ``None`` the seed
    is unpredictable, but a deployment that needs a CSPRNG stream should use
    the scalar diffprivlib path (``sampler="diffprivlib"`` with
    ``random_state=None`` there draws from :class:`secrets.SystemRandom`).
    """
    if random_state is None:
        seed = np.random.SeedSequence(secrets.randbits(128))
        return np.random.RandomState(np.random.MT19937(seed))
    if isinstance(random_state, np.random.RandomState):
        return random_state
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return np.random.RandomState(int(random_state))
    raise TypeError(
        "random_state must be None, an int seed or a numpy.random.RandomState, "
        f"got {type(random_state).__name__}"
    )


def charge(accountant: BudgetAccountant | None, epsilon: float) -> None:
    """Charge ``epsilon`` (pure DP, ``delta = 0``) to ``accountant``.

    Call this before drawing noise. ``BudgetAccountant.spend`` checks first
    and records nothing when it refuses, so a refused step leaves the
    accountant unchanged.

    Raises
    ------
    BudgetError
        If the spend would exceed the accountant's total budget (this includes
        any ``epsilon = inf`` spend against a finite budget).
    TypeError
        If ``accountant`` is neither ``None`` nor a ``BudgetAccountant``.
    """
    if accountant is None:
        return
    if not isinstance(accountant, BudgetAccountant):
        raise TypeError(
            f"accountant must be a diffprivlib BudgetAccountant or None, got {type(accountant).__name__}"
        )
    if math.isinf(epsilon) and not math.isinf(accountant.epsilon):
        raise BudgetError(
            f"Privacy spend of ({epsilon},0) not permissible: noise is disabled (epsilon=inf) "
            f"but the accountant's budget is finite (epsilon={accountant.epsilon})."
        )
    accountant.spend(epsilon, 0.0)
