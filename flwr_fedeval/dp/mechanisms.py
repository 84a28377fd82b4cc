"""Vectorised draws from diffprivlib's Laplace and randomized-response mechanisms.

diffprivlib's ``randomise`` is scalar (one Python call and four ``rng.random()``
calls per value). DPAUC_Lap perturbs ``4·|Θ|`` counts per client, so the client
steps validate the privacy parameters **with the diffprivlib mechanism** and then
draw from *the same distribution* with numpy in one call:

* Laplace: diffprivlib's 4-uniform sampler [HB21],
  ``X = log(1-U1)·cos(πU2) + log(1-U3)·cos(πU4)`` (standard Laplace), released
  value ``v - b·X`` with ``b = Δ/ε``. The uniforms are taken from the client's
  ``RandomState`` in the same order as ``Laplace.randomise`` would take them, so
  the vectorised and scalar paths agree draw for draw for the same seed.
* Randomized response (diffprivlib ``Binary``): flip with probability
  ``1/(1+e^ε)`` [DPAUC Eq. 1; FedAUC Eq. 2].

``benchmarks/bench_dp.py`` times both paths side by side.

References
----------
.. [HB21] Holohan, N. and Braghin, S. "Secure Random Sampling in Differential
   Privacy", ESORICS 2021 (the sampler of ``diffprivlib.mechanisms.Laplace``).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from diffprivlib.mechanisms import Binary, Laplace
from numpy.typing import ArrayLike, NDArray

__all__ = [
    "Sampler",
    "flip_probability",
    "laplace_mechanism",
    "laplace_randomise",
    "randomized_response",
]

Sampler = Literal["vectorised", "diffprivlib"]


def laplace_mechanism(epsilon: float, sensitivity: float, rng: np.random.RandomState | None) -> Laplace:
    """A diffprivlib ``Laplace`` mechanism; its constructor validates the parameters."""
    return Laplace(epsilon=epsilon, delta=0.0, sensitivity=sensitivity, random_state=rng)


def laplace_randomise(
    values: ArrayLike,
    mechanism: Laplace,
    rng: np.random.RandomState,
    *,
    sampler: Sampler = "vectorised",
) -> NDArray[np.float64]:
    """Add Laplace(``Δ/ε``) noise of ``mechanism`` to every entry of ``values``.

    Parameters
    ----------
    values : ndarray
        Exact statistics (any shape); returned as float64 with noise added.
    mechanism : diffprivlib.mechanisms.Laplace
        Validated mechanism (``delta = 0``) whose ``random_state`` is ``rng``.
    rng : numpy.random.RandomState
        The client's random state (the same object the mechanism holds).
    sampler : {"vectorised", "diffprivlib"}
        ``"diffprivlib"`` calls ``mechanism.randomise`` per entry.

    Returns
    -------
    ndarray of float64, same shape as ``values``
        With ``epsilon = inf`` (scale 0) the values are returned unchanged.
    """
    x: NDArray[np.float64] = np.asarray(values, dtype=np.float64)
    scale = float(mechanism.sensitivity / mechanism.epsilon)
    if scale == 0.0:
        return x.copy()
    if sampler == "diffprivlib":
        flat = [mechanism.randomise(float(v)) for v in x.ravel()]
        return np.asarray(flat, dtype=np.float64).reshape(x.shape)
    if sampler != "vectorised":
        raise ValueError(f"sampler must be 'vectorised' or 'diffprivlib', got {sampler!r}")
    u: NDArray[np.float64] = rng.random_sample(x.shape + (4,))
    standard: NDArray[np.float64] = np.log(1 - u[..., 0]) * np.cos(np.pi * u[..., 1]) + np.log(1 - u[..., 2]) * np.cos(
        np.pi * u[..., 3]
    )
    return x - scale * standard


def flip_probability(epsilon: float) -> float:
    """``ρ = 1/(1+e^ε)``, the flip probability of ε-randomized response (0 for ε=inf)."""
    if math.isinf(epsilon):
        return 0.0
    return 1.0 / (1.0 + math.exp(epsilon))


def randomized_response(
    labels: NDArray[np.int64],
    epsilon: float,
    rng: np.random.RandomState,
    *,
    sampler: Sampler = "vectorised",
) -> NDArray[np.int64]:
    """Flip each binary label independently with probability ``1/(1+e^ε)``.

    Same distribution as diffprivlib ``Binary(epsilon, value0="0",
    value1="1").randomise`` (which flips iff ``U·(e^ε+1) > e^ε``).

    Returns
    -------
    ndarray of int64, same shape as ``labels``
    """
    labels = np.asarray(labels, dtype=np.int64)
    if sampler == "diffprivlib":
        mech = Binary(epsilon=epsilon, value0="0", value1="1", random_state=rng)
        return np.asarray([int(mech.randomise(str(v))) for v in labels.ravel()], dtype=np.int64).reshape(
            labels.shape
        )
    if sampler != "vectorised":
        raise ValueError(f"sampler must be 'vectorised' or 'diffprivlib', got {sampler!r}")
    Binary(epsilon=epsilon, value0="0", value1="1")  # parameter validation only
    rho = flip_probability(epsilon)
    if rho == 0.0:
        return labels.copy()
    flips: NDArray[np.bool_] = rng.random_sample(labels.shape) < rho
    return np.where(flips, 1 - labels, labels)
