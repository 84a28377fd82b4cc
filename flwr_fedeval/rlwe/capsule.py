"""The key capsule of KAHE mode: the one polynomial k_i under threshold xMK-CKKS.

In KAHE mode (DESIGN.md §3) a client's update travels under key-additive RLWE
(:mod:`flwr_fedeval.rlwe.kahe`) with a fresh key k_i per round; k_i itself travels as one xMK-CKKS
plaintext polynomial of n integer coefficients (|k| <= the KAHE parameter set's cut ⌈tail σ_key⌉), masked with
the client's pairwise and self masks exactly as a CKKS-mode update (:mod:`flwr_fedeval.rlwe.masking`,
:mod:`flwr_fedeval.rlwe.selfmask`). The t decryptors decrypt the capsule sum only; the server gets
K_C = Σ_{i∈C} k_i up to the CKKS error and rounds it (:func:`flwr_fedeval.rlwe.kahe.round_key_sum`:
refused if any coefficient is more than 1/4 from an integer), then decodes the KAHE sum.

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from .encoding import encode
from .kahe import KaheParameters
from .params import ParameterSet

__all__ = ["CAPSULE_POLYS", "capsule_bound", "encode_key"]

#: Polynomials of a key capsule: k_i has n coefficients, one xMK-CKKS plaintext polynomial.
CAPSULE_POLYS = 1


def capsule_bound(params: KaheParameters) -> float:
    """The value bound of the capsule's CKKS encoding: the cut of k (every |k_j| <= ⌈tail σ_key⌉), float.

    With it the CKKS noise budget (:func:`flwr_fedeval.rlwe.max_scale_bits`) and the compact limbs
    (:func:`flwr_fedeval.rlwe.compact.compact_limbs`) of the capsule are those of a payload of n values
    bounded by the tail: the error of K_C stays far below the 1/4 that rounding allows.
    """
    return float(params.key_cut)


def encode_key(params: ParameterSet, key: NDArray[np.int64], *, scale_bits: int, num_clients: int,
               kahe_params: KaheParameters) -> NDArray[np.uint64]:
    """The capsule's plaintext: k (int64, shape (n,)) at scale 2^scale_bits, one polynomial (1, L, n) uint64.

    Raises
    ------
    ValueError
        ``key`` is not n integers within the cut of ``kahe_params`` (a key outside it would
        break the noise budget the scale was chosen for).
    """
    key = np.asarray(key)
    if key.shape != (kahe_params.n,) or not np.issubdtype(key.dtype, np.integer):
        raise ValueError(f"a KAHE key is {kahe_params.n} integers, got shape {key.shape} dtype {key.dtype}")
    if key.size and int(np.max(np.abs(key))) > kahe_params.key_cut:
        raise ValueError(f"a KAHE key coefficient exceeds the cut {kahe_params.key_cut}")
    return encode(params, key.astype(np.float64), scale_bits=scale_bits, num_clients=num_clients)
