"""xMK-CKKS multi-key aggregation (Ma et al. 2022; Walskaar et al. 2023, Eqs. 1-11).

Protocol (DESIGN.md §3), with a = expand_public_polynomial(params, seed):

1. each client: ``sk_i, pk_i = keygen(params, a)``           b_i = -s_i a + e_i
2. server: ``pk = aggregate_public_keys([pk_i])``            b = sum_i b_i  (Eq. 1)
3. each client: ``ct_i = encrypt_vector(params, pk, a, x_i, ...)``
   c0 = v b + m + e0, c1 = v a + e1                          (Eq. 6 / Eq. 8)
4. server: ``C = add_ciphertexts([ct_i])``                   C = sum_i ct_i (Eq. 3 / Eq. 9)
5. each client: ``D_i = partial_decrypt(params, sk_i, C.c1, num_clients=M)``
   D_i = s_i C1 + e*_i                                        (Eq. 7 / Eq. 10)
6. server: ``combine_and_decode(params, C.c0, [D_i], length, scale_bits=...)``
   sum_i m_i ~ C0 + sum_i D_i                                 (Eq. 5 / Eq. 11)

Secrets s_i and ephemeral v are uniform ternary polynomials with n
coefficients; e_i, e0, e1 are discrete Gaussian (sigma = 3.2); e*_i is
uniform in [-B_smudge, B_smudge) with B_smudge >= 2^40 * B_fresh(M)
(:func:`~flwr_fedeval.rlwe.params.smudging_bound`). All randomness comes from
:class:`~flwr_fedeval.rlwe.sampling.RandomStream` (ChaCha20 keyed by the OS
CSPRNG).

All ring elements are ``uint64`` arrays in RNS form, shape (L, n) for keys and
(k, L, n) for a batch of k polynomials (one model vector).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from . import serialization as ser
from .encoding import decode, encode
from .params import ParameterSet, smudging_bound
from .sampling import (
    RandomStream,
    discrete_gaussian,
    expand_public_polynomial,
    ternary,
    uniform_smudging,
)

__all__ = [
    "SecretKey",
    "PublicKey",
    "Ciphertext",
    "DecryptionShare",
    "expand_a",
    "keygen",
    "aggregate_public_keys",
    "encrypt",
    "encrypt_vector",
    "add_ciphertexts",
    "partial_decrypt",
    "combine",
    "combine_and_decode",
    "polys_to_bytes",
    "polys_from_bytes",
]


def _same_params(params: ParameterSet, other: ParameterSet, what: str) -> None:
    if other != params:
        raise ValueError(f"{what} uses parameter set {other.name!r}, expected {params.name!r}")


@dataclass(frozen=True, eq=False)
class SecretKey:
    """A client's secret s_i: ternary polynomial, ``int8`` array of shape (n,).

    Keep it in the client's state only; ``to_bytes`` exists so that a Flower
    client can store it in ``context.state``.
    """

    params: ParameterSet
    s: np.ndarray

    def __repr__(self) -> str:  # never print the key
        return f"SecretKey(params={self.params.name!r})"

    def to_bytes(self) -> bytes:
        """Header + n signed bytes."""
        return ser.pack_header(ser.KIND_SECRET_KEY, self.params, 1) + self.s.astype(
            np.int8
        ).tobytes()

    @classmethod
    def from_bytes(cls, data: bytes, params: ParameterSet | None = None) -> SecretKey:
        """Load a secret key; raises ``ValueError`` naming the bad field."""
        params, count, aux = ser.unpack_header(data, ser.KIND_SECRET_KEY, params)
        _no_aux(aux)
        if count != 1:
            raise ValueError(f"count is {count}, expected 1 for a secret key")
        if len(data) - ser.HEADER_SIZE != params.n:
            raise ValueError(
                f"payload length is {len(data) - ser.HEADER_SIZE} bytes, expected {params.n}"
            )
        s = np.frombuffer(data, dtype=np.int8, offset=ser.HEADER_SIZE).copy()
        if np.any(np.abs(s.astype(np.int16)) > 1):
            raise ValueError("secret key has coefficients outside {-1, 0, 1}")
        return cls(params, s)


@dataclass(frozen=True, eq=False)
class PublicKey:
    """A public-key share b_i (``num_shares`` = 1) or the aggregate b (Eq. 1).

    Attributes
    ----------
    params : ParameterSet
    b : ndarray of shape (L, n), uint64
    num_shares : int
        Number of client shares summed into ``b``.
    """

    params: ParameterSet
    b: np.ndarray
    num_shares: int = 1

    def to_bytes(self) -> bytes:
        """Header + bit-packed residues of b."""
        return ser.pack_header(
            ser.KIND_PUBLIC_KEY, self.params, 1, self.num_shares
        ) + ser.pack_polys(self.params, [self.b[None]])

    @classmethod
    def from_bytes(cls, data: bytes, params: ParameterSet | None = None) -> PublicKey:
        """Load a public key / share; raises ``ValueError`` naming the bad field."""
        params, count, aux = ser.unpack_header(data, ser.KIND_PUBLIC_KEY, params)
        if count != 1:
            raise ValueError(f"count is {count}, expected 1 for a public key")
        if aux < 1:
            raise ValueError("num_shares must be >= 1")
        (b,) = ser.unpack_polys(params, data, 1, ("b",))
        return cls(params, b[0], aux)


@dataclass(frozen=True, eq=False)
class Ciphertext:
    """A batch of k ciphertexts (c0, c1) (Eq. 6), or their sum (Eq. 3).

    Attributes
    ----------
    params : ParameterSet
    c0, c1 : ndarray of shape (k, L, n), uint64
    num_summed : int
        Number of fresh ciphertexts added together.
    """

    params: ParameterSet
    c0: np.ndarray
    c1: np.ndarray
    num_summed: int = 1

    @property
    def num_polys(self) -> int:
        """k, the number of polynomials per component."""
        return int(self.c0.shape[0])

    def to_bytes(self) -> bytes:
        """Header + bit-packed residues of c0 then c1."""
        return ser.pack_header(
            ser.KIND_CIPHERTEXT, self.params, self.num_polys, self.num_summed
        ) + ser.pack_polys(self.params, [self.c0, self.c1])

    @classmethod
    def from_bytes(cls, data: bytes, params: ParameterSet | None = None) -> Ciphertext:
        """Load a ciphertext; raises ``ValueError`` naming the bad field."""
        params, count, aux = ser.unpack_header(data, ser.KIND_CIPHERTEXT, params)
        if aux < 1:
            raise ValueError("num_summed must be >= 1")
        c0, c1 = ser.unpack_polys(params, data, count, ("c0", "c1"))
        return cls(params, c0, c1, aux)


@dataclass(frozen=True, eq=False)
class DecryptionShare:
    """A partial decryption D_i = s_i C1 + e*_i (Eq. 7), shape (k, L, n) uint64."""

    params: ParameterSet
    d: np.ndarray

    def to_bytes(self) -> bytes:
        """Header + bit-packed residues of d."""
        return ser.pack_header(
            ser.KIND_DECRYPTION_SHARE, self.params, int(self.d.shape[0])
        ) + ser.pack_polys(self.params, [self.d])

    @classmethod
    def from_bytes(
        cls, data: bytes, params: ParameterSet | None = None
    ) -> DecryptionShare:
        """Load a decryption share; raises ``ValueError`` naming the bad field."""
        params, count, aux = ser.unpack_header(data, ser.KIND_DECRYPTION_SHARE, params)
        _no_aux(aux)
        (d,) = ser.unpack_polys(params, data, count, ("d",))
        return cls(params, d)


def polys_to_bytes(params: ParameterSet, polys: np.ndarray) -> bytes:
    """Serialize a batch of ring elements (e.g. C1_sum), shape (k, L, n) uint64."""
    params.ring.check(polys, "polys")
    return ser.pack_header(ser.KIND_POLYNOMIALS, params, int(polys.shape[0])) + ser.pack_polys(
        params, [polys]
    )


def polys_from_bytes(
    data: bytes, params: ParameterSet | None = None, *, count: int | None = None
) -> np.ndarray:
    """Inverse of :func:`polys_to_bytes`, accepting only the canonical encoding.

    Parameters
    ----------
    data : bytes
    params : ParameterSet, optional
        Expected parameter set.
    count : int, optional
        Expected number of polynomials k.

    Returns
    -------
    ndarray of shape (k, L, n), uint64

    Raises
    ------
    ValueError
        Naming the bad field: any header field (magic, version, kind,
        params_id, n, limbs, count, aux != 0), the payload length, or a
        residue >= q_i. Every ring element has exactly one encoding, so two
        different byte strings never load to the same C1.
    """
    params, got, aux = ser.unpack_header(data, ser.KIND_POLYNOMIALS, params)
    _no_aux(aux)
    if count is not None and got != count:
        raise ValueError(f"count is {got}, expected {count}")
    (p,) = ser.unpack_polys(params, data, got, ("polys",))
    return p


def _no_aux(aux: int) -> None:
    if aux != 0:
        raise ValueError(f"aux is {aux}, expected 0 for this kind")


# ---------------------------------------------------------------------------
def expand_a(params: ParameterSet, seed: bytes) -> np.ndarray:
    """The shared public polynomial a, expanded from a 32-byte public seed.

    Returns
    -------
    ndarray of shape (L, n), uint64, uniform in R_q (ChaCha20 keyed by
    SHA-256(domain || params id || seed))

    Raises
    ------
    ValueError
        If ``seed`` is not 32 bytes.
    """
    return expand_public_polynomial(params.primes, params.n, seed, params.name)


def keygen(
    params: ParameterSet, a: np.ndarray, *, rng: RandomStream | None = None
) -> tuple[SecretKey, PublicKey]:
    """Generate a client's key pair: s_i ternary, b_i = -s_i a + e_i (Eq. 1).

    Parameters
    ----------
    params : ParameterSet
    a : ndarray of shape (L, n), uint64
        Shared public polynomial (:func:`expand_a`).
    rng : RandomStream, optional
        Defaults to a fresh OS-keyed ChaCha20 stream.

    Returns
    -------
    (SecretKey, PublicKey)
        s of shape (n,) int8 in {-1, 0, 1}; b of shape (L, n) uint64.

    Raises
    ------
    ValueError
        If ``a`` has the wrong shape/dtype or values >= q_i.
    """
    ring = params.ring
    ring.check(a, "a")
    if a.shape != (params.limbs, params.n):
        raise ValueError(f"a has shape {a.shape}, expected {(params.limbs, params.n)}")
    rng = RandomStream() if rng is None else rng
    s = ternary((params.n,), rng)
    e = discrete_gaussian((params.n,), params.sigma, params.tail_cut, rng)
    sa = ring.mul_small(s, a)
    b = ring.add(ring.neg(sa), ring.from_signed(e))
    return SecretKey(params, s), PublicKey(params, b, 1)


def aggregate_public_keys(shares: Sequence[PublicKey]) -> PublicKey:
    """Aggregate public key b = sum_i b_i (Eq. 1).

    Raises
    ------
    ValueError
        If ``shares`` is empty or mixes parameter sets.
    """
    if not shares:
        raise ValueError("shares must not be empty")
    params = shares[0].params
    for j, sh in enumerate(shares):
        _same_params(params, sh.params, f"shares[{j}]")
        params.ring.check(sh.b, f"shares[{j}].b")
    b = params.ring.sum(np.stack([sh.b for sh in shares]))
    return PublicKey(params, b, sum(sh.num_shares for sh in shares))


def encrypt(
    params: ParameterSet,
    public_key: PublicKey,
    a: np.ndarray,
    plaintext: np.ndarray,
    *,
    rng: RandomStream | None = None,
) -> Ciphertext:
    """Encrypt plaintext polynomials: c0 = v b + m + e0, c1 = v a + e1 (Eq. 6).

    Parameters
    ----------
    params : ParameterSet
    public_key : PublicKey
        The aggregate key b (Eq. 1).
    a : ndarray of shape (L, n), uint64
    plaintext : ndarray of shape (k, L, n), uint64
        Encoded messages (:func:`~flwr_fedeval.rlwe.encoding.encode`).
    rng : RandomStream, optional

    Returns
    -------
    Ciphertext
        c0, c1 of shape (k, L, n); a fresh ternary v and Gaussian e0, e1
        per polynomial.

    Raises
    ------
    ValueError
        On shape/dtype/parameter mismatches or values >= q_i.
    """
    ring = params.ring
    _same_params(params, public_key.params, "public_key")
    ring.check(a, "a")
    ring.check(plaintext, "plaintext")
    if plaintext.ndim != 3:
        raise ValueError(f"plaintext must have shape (k, L, n), got {plaintext.shape}")
    rng = RandomStream() if rng is None else rng
    k, L, n = plaintext.shape
    v = ternary((k, n), rng)
    e0 = discrete_gaussian((k, n), params.sigma, params.tail_cut, rng)
    e1 = discrete_gaussian((k, n), params.sigma, params.tail_cut, rng)
    # one FFT of v per polynomial; v*a and v*b computed together (2L signals)
    ab = np.concatenate([a, public_key.b], axis=0)  # (2L, n)
    q_sig = np.concatenate([ring._q_i64, ring._q_i64], axis=0)
    s_norm = float(np.sqrt(np.max(np.count_nonzero(v, axis=-1))))
    addend = np.empty((k, 2 * L, n), dtype=np.int64)
    addend[:, :L] = e1[:, None, :]
    np.add(plaintext.view(np.int64), e0[:, None, :], out=addend[:, L:])
    prod = ring.mul_small_spectrum(ring.fft_small(v), s_norm, ab, q_sig, addend)
    return Ciphertext(params, prod[:, L:], prod[:, :L], 1)  # (c0, c1)


def encrypt_vector(
    params: ParameterSet,
    public_key: PublicKey,
    a: np.ndarray,
    values: np.ndarray,
    *,
    scale_bits: int,
    num_clients: int,
    rng: RandomStream | None = None,
) -> Ciphertext:
    """Encode a float vector (fixed point, Delta = 2^scale_bits) and encrypt it.

    Parameters
    ----------
    values : array-like of shape (N,), float
    scale_bits, num_clients : int
        See :func:`~flwr_fedeval.rlwe.encoding.encode`.

    Returns
    -------
    Ciphertext with k = ceil(N / n) polynomials per component.

    Raises
    ------
    EncodingRangeError
        If a value or the M-fold sum could wrap modulo q.
    """
    pt = encode(params, values, scale_bits=scale_bits, num_clients=num_clients)
    return encrypt(params, public_key, a, pt, rng=rng)


def add_ciphertexts(ciphertexts: Sequence[Ciphertext]) -> Ciphertext:
    """Homomorphic sum C = (sum c0_i, sum c1_i) (Eq. 3 / Eq. 9).

    Raises
    ------
    ValueError
        If the list is empty or mixes parameter sets or sizes.
    """
    if not ciphertexts:
        raise ValueError("ciphertexts must not be empty")
    params = ciphertexts[0].params
    shape = ciphertexts[0].c0.shape
    for j, ct in enumerate(ciphertexts):
        _same_params(params, ct.params, f"ciphertexts[{j}]")
        if ct.c0.shape != shape or ct.c1.shape != shape:
            raise ValueError(f"ciphertexts[{j}] has shape {ct.c0.shape}, expected {shape}")
    ring = params.ring
    if len(ciphertexts) == 1:
        c = ciphertexts[0]
        return Ciphertext(params, c.c0.copy(), c.c1.copy(), c.num_summed)
    c0 = np.zeros(shape, dtype=np.uint64)
    c1 = np.zeros(shape, dtype=np.uint64)
    for ct in ciphertexts:  # residues < 2^31: up to 2^33 terms cannot overflow
        c0 += ct.c0
        c1 += ct.c1
    c0 %= ring.q_col
    c1 %= ring.q_col
    return Ciphertext(params, c0, c1, sum(ct.num_summed for ct in ciphertexts))


def partial_decrypt(
    params: ParameterSet,
    secret: SecretKey,
    c1_sum: np.ndarray,
    *,
    num_clients: int,
    rng: RandomStream | None = None,
) -> DecryptionShare:
    """Partial decryption with smudging: D_i = s_i C1 + e*_i (Eq. 7 / Eq. 10).

    Parameters
    ----------
    params : ParameterSet
    secret : SecretKey
    c1_sum : ndarray of shape (k, L, n), uint64
        The summed C1 of the aggregate ciphertext.
    num_clients : int
        M, number of ciphertexts in the sum; sets the smudging half-width
        B_smudge(M) = 2^(40 + ceil(log2 B_fresh(M))) (see
        :func:`~flwr_fedeval.rlwe.params.smudging_bound`).
    rng : RandomStream, optional

    Returns
    -------
    DecryptionShare of shape (k, L, n)

    Raises
    ------
    ValueError
        On parameter/shape mismatch or values >= q_i.

    Notes
    -----
    The protocol-level checks of DESIGN.md §3 step 3 (this client is a
    contributor, enough contributors, C1 is not this client's own c1) belong
    to the caller, which knows the round.
    """
    ring = params.ring
    _same_params(params, secret.params, "secret")
    ring.check(c1_sum, "c1_sum")
    if c1_sum.ndim != 3:
        raise ValueError(f"c1_sum must have shape (k, L, n), got {c1_sum.shape}")
    rng = RandomStream() if rng is None else rng
    k = c1_sum.shape[0]
    s_norm = float(np.sqrt(np.count_nonzero(secret.s)))
    bits = smudging_bound(params, num_clients).bit_length() - 1
    smudge = uniform_smudging(params.primes, params.n, bits, (k,), rng)
    d = ring.mul_small_spectrum(
        ring.fft_small(secret.s), s_norm, c1_sum, addend=smudge.view(np.int64)
    )
    return DecryptionShare(params, d)


def combine(
    params: ParameterSet, c0_sum: NDArray[np.uint64], shares: Sequence[DecryptionShare]
) -> NDArray[np.uint64]:
    """Recover the plaintext sum: C0 + sum_i D_i (Eq. 5 / Eq. 11).

    Returns
    -------
    ndarray of shape (k, L, n), uint64 -- sum_i m_i plus bounded noise.

    Raises
    ------
    ValueError
        If ``shares`` is empty or shapes/parameter sets disagree.
    """
    ring = params.ring
    ring.check(c0_sum, "c0_sum")
    if not shares:
        raise ValueError("shares must not be empty")
    acc: NDArray[np.uint64] = c0_sum.copy()
    for j, sh in enumerate(shares):
        _same_params(params, sh.params, f"shares[{j}]")
        if sh.d.shape != c0_sum.shape:
            raise ValueError(f"shares[{j}] has shape {sh.d.shape}, expected {c0_sum.shape}")
        ring.check(sh.d, f"shares[{j}].d")
        acc += sh.d
        if j % 4 == 3:
            acc %= ring.q_col
    acc %= ring.q_col
    return acc


def combine_and_decode(
    params: ParameterSet,
    c0_sum: np.ndarray,
    shares: Sequence[DecryptionShare],
    length: int,
    *,
    scale_bits: int,
) -> np.ndarray:
    """Combine (Eq. 11) and decode the aggregate to floats.

    Returns
    -------
    ndarray of shape (length,), float64
        sum_i x_i within (B_total(M) + M/2) / 2^scale_bits
        (:func:`~flwr_fedeval.rlwe.params.check_noise_budget`).
    """
    return decode(params, combine(params, c0_sum, shares), scale_bits=scale_bits, length=length)
