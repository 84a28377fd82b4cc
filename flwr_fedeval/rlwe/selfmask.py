"""Self-masks for xMK-CKKS contributors (Bonawitz et al., CCS 2017, §4, "double masking").

Why: the pairwise masks of :mod:`~flwr_fedeval.rlwe.masking` of a member
lost *before* its upload are removed by reconstructing its X25519 mask
private key from t Shamir shares (:func:`~flwr_fedeval.rlwe.threshold.combine_bytes`).
A deviating server could claim that a member who *did* upload dropped,
reconstruct its pairwise masks and strip them from its ciphertext. So every
contributor i also adds a self-mask u_i = PRG(b_i) under a fresh 32-byte
seed b_i that it Shamir-shares among the key set; for every member the
honest members reveal shares of either the mask private key (dropped before
upload) or the self-mask seed (uploaded), never both (SecAgg's rule; Flower's
SecAgg+ does the same). The server subtracts sum_{i uploaded} u_i after
decryption.

    u_i = expand_mask(params, SHA-256(DOMAIN || b_i), k)      (k, L, n) uint64

i.e. the same AES-256-CTR stream, rejection-sampled exactly uniform mod
every q_l, as the pairwise masks (:func:`~flwr_fedeval.rlwe.masking.expand_mask`),
under a key derived from the seed with a domain label of its own (a
self-mask stream never coincides with a pairwise one). A seed is drawn
fresh (``secrets``) for every encryption and never reused.

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import hashlib
import secrets

import numpy as np
from numpy.typing import NDArray

from .masking import expand_mask
from .params import ParameterSet

__all__ = ["SELF_MASK_SEED_BYTES", "new_self_mask_seed", "self_mask", "self_mask_key"]

#: Length of a self-mask seed b_i.
SELF_MASK_SEED_BYTES = 32
_DOMAIN = b"flwr-fedeval/xmkckks/self-mask/v1"


def new_self_mask_seed() -> bytes:
    """A fresh 32-byte self-mask seed from the OS CSPRNG (``secrets.token_bytes``)."""
    return secrets.token_bytes(SELF_MASK_SEED_BYTES)


def self_mask(params: ParameterSet, seed: bytes, num_polys: int) -> NDArray[np.uint64]:
    """The self-mask u_i = PRG(b_i): ``num_polys`` ring elements uniform mod q.

    Parameters
    ----------
    params : ParameterSet
    seed : bytes of length 32
        The contributor's self-mask seed b_i (:func:`new_self_mask_seed`).
    num_polys : int
        k >= 1, the number of plaintext polynomials of the encrypted vector.

    Returns
    -------
    ndarray of shape (k, L, n), uint64, limb l uniform in [0, q_l)
        Add it with :func:`~flwr_fedeval.rlwe.masking.apply_mask` before
        encryption; subtract it from the decrypted sum once b_i is
        reconstructed.

    Raises
    ------
    ValueError
        If ``seed`` is not 32 bytes or ``num_polys`` < 1.
    """
    mask: NDArray[np.uint64] = expand_mask(params, self_mask_key(seed), num_polys)
    return mask


def self_mask_key(seed: bytes) -> bytes:
    """The PRG key of u_i, SHA-256(DOMAIN || b_i) (32 bytes): expand it in ranges of polynomials
    with :class:`~flwr_fedeval.rlwe.masking.MaskSum` (the same stream as :func:`self_mask`).

    Raises
    ------
    ValueError
        If ``seed`` is not 32 bytes.
    """
    if not isinstance(seed, (bytes, bytearray)) or len(seed) != SELF_MASK_SEED_BYTES:
        raise ValueError(f"seed must be {SELF_MASK_SEED_BYTES} bytes")
    return hashlib.sha256(_DOMAIN + bytes(seed)).digest()
