"""Pairwise zero-sum masks mod q for xMK-CKKS (Bonawitz et al., CCS 2017, §4).

Why: a partial decryption D_i = s_i·C1 + e*_i (Walskaar et al. 2023, Eq. 7)
is computed for whatever C1 the server sends. A deviating server that sends
C1 = c1_i + 1 (or any crafted C1) would otherwise decrypt client i's update.
With masks, every client encrypts m_i + r_i instead of m_i, where

    r_i = sum_{j in K, j != i} sign(i, j) * PRG(k_ij)      mod q,
    sign(i, j) = +1 if name_i < name_j else -1,

K is the key set (roster names), and k_ij = k_ji is a pairwise key from an
X25519 agreement between i and j. The masks cancel exactly in the sum over
the whole key set, sum_{i in K} r_i = 0 (mod q), so the decoded sum is
unchanged (no headroom is used: the masks are exact residues mod q and leave
the noise untouched). For any other combination -- one client, a strict
subset T of K, or any C1 the server crafts -- the masks of the pairs
crossing T do not cancel and the decrypted value is uniform mod q, i.e.
independent of every update (as long as the server does not know k_ij,
which needs one of the two X25519 private keys).

Derivation, per pair and per encryption (key set and round):

    shared = X25519(x_i, X_j)                               (RFC 7748)
    k_ij   = HKDF-SHA256(shared, salt = none,
                         info = DOMAIN || context || name_lo || name_hi)
    PRG    = ChaCha20 keystream under k_ij (``cryptography``), expanded to
             residues uniform in [0, q_l) per RNS prime by rejection of
             bit_length(q_l)-bit words (exactly uniform mod q by the CRT).

``context`` binds the key-set transcript and the round
(:func:`mask_context`), so masks are fresh per key set and round, and two
clients that were shown different key sets derive different k_ij (their
masks then never cancel: the round fails instead of leaking).

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import struct
from typing import Mapping

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from .params import ParameterSet

__all__ = [
    "MASK_KEY_BYTES",
    "MaskKeyError",
    "new_mask_keypair",
    "mask_public_key",
    "mask_context",
    "pairwise_mask_key",
    "expand_mask",
    "client_mask",
    "mask_plaintext",
    "apply_mask",
]

MASK_KEY_BYTES = 32
_DOMAIN = b"flwr-fedeval/xmkckks/pairwise-mask/v1"
_CHUNK = 1 << 15  # residues per step (keeps the temporaries in cache)


class MaskKeyError(ValueError):
    """A mask key is malformed or the X25519 agreement failed (e.g. a low-order point)."""


def _lp(data: bytes) -> bytes:
    """Length-prefixed field (8-byte big-endian length)."""
    return struct.pack(">Q", len(data)) + data


def new_mask_keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair for the masks of one key set.

    Returns
    -------
    (private, public) : (bytes, bytes)
        Raw 32-byte encodings (RFC 7748). Keep ``private`` in the client's
        state only; ``public`` goes into the signed commitment.
    """
    key = X25519PrivateKey.generate()
    private = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return private, key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _private(raw: bytes) -> X25519PrivateKey:
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != MASK_KEY_BYTES:
        raise MaskKeyError(f"mask private key must be {MASK_KEY_BYTES} bytes")
    return X25519PrivateKey.from_private_bytes(bytes(raw))


def _public(raw: bytes, what: str) -> X25519PublicKey:
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != MASK_KEY_BYTES:
        raise MaskKeyError(f"{what} must be {MASK_KEY_BYTES} bytes")
    return X25519PublicKey.from_public_bytes(bytes(raw))


def mask_public_key(private: bytes) -> bytes:
    """The raw public key of a raw X25519 private key."""
    return _private(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def mask_context(transcript: bytes, round_: int) -> bytes:
    """Context bytes of one encryption: the key-set transcript digest and the round.

    Parameters
    ----------
    transcript : bytes
        Digest of the key set every member agreed on (names and commitments,
        :func:`flwr_fedeval.rlwe.keyset.transcript_digest`).
    round_ : int
        Round number (>= 0); a client encrypts at most once per key set and round.

    Raises
    ------
    ValueError
        If ``round_`` is negative or not an int.
    """
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise ValueError(f"round must be an integer >= 0, got {round_!r}")
    return _lp(bytes(transcript)) + struct.pack(">Q", round_)


def pairwise_mask_key(
    own_private: bytes, peer_public: bytes, *, own_name: str, peer_name: str, context: bytes
) -> bytes:
    """k_ij = HKDF-SHA256(X25519(x_i, X_j), info = DOMAIN || context || names), 32 bytes.

    Symmetric: both members of a pair derive the same key (the names are
    put in sorted order).

    Raises
    ------
    MaskKeyError
        If a key is not 32 bytes, the names are equal, or the agreement
        yields the all-zero secret (a low-order public key).
    """
    if own_name == peer_name:
        raise MaskKeyError(f"a pairwise mask needs two distinct members, got {own_name!r} twice")
    try:
        shared = _private(own_private).exchange(_public(peer_public, f"mask public key of {peer_name!r}"))
    except ValueError as exc:  # cryptography refuses the all-zero shared secret
        if isinstance(exc, MaskKeyError):
            raise
        raise MaskKeyError(f"X25519 agreement with {peer_name!r} failed: {exc}") from None
    lo, hi = sorted((own_name, peer_name))
    info = _DOMAIN + _lp(bytes(context)) + _lp(lo.encode()) + _lp(hi.encode())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


class _LimbStream:
    """Residues uniform in [0, p) from ChaCha20(key, nonce = limb), in chunks.

    A chunk of ``need`` values takes ``need + spare`` little-endian 32-bit
    keystream words (``spare`` fixed by p and the chunk size), each cut to
    bit_length(p - 1) bits. The first ``need`` are the values; every value
    >= p is replaced, in position order, by the next spare word that is < p
    (and by further keystream words, should the spare ones run out). This is
    rejection sampling: every value is an independent, exactly uniform
    residue. The sequence depends only on (key, limb, p) and the chunk size,
    fixed by the protocol (max(2^15, n) values).
    """

    def __init__(self, key: bytes, limb: int, p: int, chunk: int = 1 << 15) -> None:
        nonce = bytes(4) + struct.pack("<IQ", limb, 0)  # block counter 0 | limb
        self._enc = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor()
        self.p = p
        bits = (p - 1).bit_length()
        self._cut = np.uint32((1 << bits) - 1)
        accept = p / float(1 << bits)
        self._spare = int(chunk * (1.0 / accept - 1.0) * 1.5) + 64
        width = chunk + self._spare
        self._zeros = bytes(4 * width)
        self._raw = bytearray(4 * width)
        self._vals = np.empty(width, dtype=np.uint32)
        self._bad = np.empty(width, dtype=bool)

    def next(self, need: int) -> np.ndarray:
        """The next ``need`` (<= chunk) residues, a uint32 view valid until the next call."""
        w = need + self._spare
        self._enc.update_into(memoryview(self._zeros)[: 4 * w], self._raw)
        words = np.frombuffer(self._raw, dtype="<u4", count=w)
        vals = np.bitwise_and(words, self._cut, out=self._vals[:w])
        bad = np.flatnonzero(np.greater_equal(vals[:need], self.p, out=self._bad[:need]))
        if bad.size:
            pool = vals[need:]
            pool = pool[pool < self.p]
            if pool.size < bad.size:  # rare: more keystream
                extra = [pool]
                while sum(e.size for e in extra) < bad.size:
                    more = np.frombuffer(self._enc.update(bytes(4 * (bad.size + 64))), dtype="<u4") & self._cut
                    extra.append(more[more < self.p])
                pool = np.concatenate(extra)
            vals[bad] = pool[: bad.size]
        return vals[:need]


def _pair_key_bytes(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
        raise ValueError("mask key must be 32 bytes")
    return bytes(key)


def _check_polys(num_polys) -> int:
    if isinstance(num_polys, bool) or int(num_polys) != num_polys or num_polys < 1:
        raise ValueError(f"num_polys must be an integer >= 1, got {num_polys!r}")
    return int(num_polys)


def _chunks(total: int, chunk: int):
    for start in range(0, total, chunk):
        yield start, min(chunk, total - start)


def expand_mask(params: ParameterSet, key: bytes, num_polys: int) -> np.ndarray:
    """PRG(k_ij): ``num_polys`` ring elements uniform mod q from a 32-byte key.

    Parameters
    ----------
    params : ParameterSet
    key : bytes of length 32
        A pairwise mask key (:func:`pairwise_mask_key`).
    num_polys : int
        k >= 1, the number of plaintext polynomials of the encrypted vector.

    Returns
    -------
    ndarray of shape (k, L, n), uint64, limb l uniform in [0, q_l)
        Limb l, flattened over (k, n), is the residue sequence of
        ChaCha20(k_ij, nonce = l) (see ``_LimbStream``).

    Raises
    ------
    ValueError
        If ``key`` is not 32 bytes or ``num_polys`` < 1.
    """
    zero = np.zeros((_check_polys(num_polys), params.limbs, params.n), dtype=np.uint64)
    return _masked(params, zero, [(_pair_key_bytes(key), np.add)])


def _masked(params: ParameterSet, base: np.ndarray, pairs: list) -> np.ndarray:
    """base + sum of ±PRG(key) mod q, chunk by chunk (the accumulator stays in cache)."""
    k, L, n = base.shape
    chunk = max(_CHUNK, n)  # a multiple of n (both are powers of two)
    out = np.empty_like(base)
    total = k * n
    for l, p in enumerate(params.primes):
        # |acc| < 2^31 * (number of terms): int32 while that cannot overflow
        wide = (len(pairs) + 1) * p >= 2**31
        acc_buf = np.empty(chunk, dtype=np.int64 if wide else np.int32)
        streams = [(_LimbStream(key, l, p, chunk), op) for key, op in pairs]
        for start, need in _chunks(total, chunk):
            t0, rows = start // n, need // n  # chunks hold whole polynomials
            acc = acc_buf[:need]
            acc.reshape(rows, n)[:] = base[t0 : t0 + rows, l, :]
            for stream, op in streams:
                vals = stream.next(need)
                op(acc, vals if wide else vals.view(np.int32), out=acc, casting="unsafe")
            acc %= p
            out[t0 : t0 + rows, l, :] = acc.reshape(rows, n)
    return out


def mask_plaintext(
    params: ParameterSet,
    plaintext: np.ndarray,
    *,
    own_name: str,
    own_private: bytes,
    peers: Mapping[str, bytes],
    context: bytes,
) -> np.ndarray:
    """m_i + r_i mod q with r_i = sum_{j != i} sign(i, j)·PRG(k_ij) (Bonawitz et al. 2017, §4).

    Parameters
    ----------
    params : ParameterSet
    plaintext : ndarray of shape (k, L, n), uint64
        The encoded plaintext m_i (:func:`~flwr_fedeval.rlwe.encoding.encode`).
    own_name : str
        This client's roster name.
    own_private : bytes
        This client's X25519 mask private key (32 bytes).
    peers : mapping of str to bytes
        Every *other* key-set member's name -> its X25519 mask public key
        (32 bytes), as checked against its signed commitment. Must not
        contain ``own_name``; must not be empty.
    context : bytes
        :func:`mask_context` of the key set and round.

    Returns
    -------
    ndarray of shape (k, L, n), uint64
        m_i + r_i; the masks r_i of all members of a key set sum to 0 mod q,
        so the sum of the masked plaintexts is sum_i m_i exactly.

    Raises
    ------
    MaskKeyError
        If ``peers`` is empty or contains ``own_name``, or an agreement fails.
    ValueError
        If ``plaintext`` is not a reduced (k, L, n) uint64 batch.
    """
    params.ring.check(plaintext, "plaintext")
    if plaintext.ndim != 3:
        raise ValueError(f"plaintext must have shape (k, L, n), got {plaintext.shape}")
    if not peers:
        raise MaskKeyError("a mask needs at least one other key-set member")
    if own_name in peers:
        raise MaskKeyError(f"peers must not contain this client ({own_name!r})")
    pairs = [
        (
            pairwise_mask_key(own_private, peers[name], own_name=own_name, peer_name=name, context=context),
            np.add if own_name < name else np.subtract,
        )
        for name in sorted(peers)
    ]
    return _masked(params, plaintext, pairs)


def client_mask(
    params: ParameterSet,
    *,
    own_name: str,
    own_private: bytes,
    peers: Mapping[str, bytes],
    context: bytes,
    num_polys: int,
) -> np.ndarray:
    """The mask r_i alone, shape (k, L, n) uint64 (:func:`mask_plaintext` of zero)."""
    zero = np.zeros((_check_polys(num_polys), params.limbs, params.n), dtype=np.uint64)
    return mask_plaintext(
        params, zero, own_name=own_name, own_private=own_private, peers=peers, context=context
    )


def apply_mask(params: ParameterSet, plaintext: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """m + r mod q for plaintext and mask batches of shape (k, L, n) uint64.

    Raises
    ------
    ValueError
        If the shapes differ or a value is not reduced mod q_l.
    """
    ring = params.ring
    ring.check(plaintext, "plaintext")
    ring.check(mask, "mask")
    if plaintext.shape != mask.shape:
        raise ValueError(f"mask has shape {mask.shape}, plaintext {plaintext.shape}")
    return ring.add(plaintext, mask)

