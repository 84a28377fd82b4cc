"""Pairwise zero-sum masks mod q for xMK-CKKS (Bonawitz et al., CCS 2017, §4; Bell et al., CCS 2020).

Why: a partial decryption D_i = s_i·C1 + e*_i (Walskaar et al. 2023, Eq. 7)
is computed for whatever C1 the server sends. A deviating server that sends
C1 = c1_i + 1 (or any crafted C1) would otherwise decrypt client i's update.
With masks, every client encrypts m_i + r_i instead of m_i, where

    r_i = sum_{j in N(i)} sign(i, j) * PRG(k_ij)      mod q,
    sign(i, j) = +1 if name_i < name_j else -1,

K is the key set (roster names), N(i) the neighbours of i in the mask
graph over K (:func:`mask_neighbours`: the complete graph, N(i) = K minus {i},
of Bonawitz et al., or a k-regular connected graph derived from the signed
key-set transcript, as in SecAgg+), and k_ij = k_ji is a pairwise key from
an X25519 agreement between i and j. The masks cancel exactly in the sum
over the whole key set, sum_{i in K} r_i = 0 (mod q), so the decoded sum is
unchanged (no headroom is used: the masks are exact residues mod q and leave
the noise untouched). For any other combination -- one client, a strict
subset T of K, or any C1 the server crafts -- the masks of the edges
crossing T (there is one: the graph is connected) do not cancel and the
decrypted value is uniform mod q, i.e. independent of every update (as long
as the server does not know k_ij, which needs one of the two X25519 private
keys).

Derivation, per pair and per encryption (key set and round):

    shared = X25519(x_i, X_j)                               (RFC 7748)
    k_ij   = HKDF-SHA256(shared, salt = none,
                         info = DOMAIN || context || name_lo || name_hi)
    PRG    = AES-256-CTR keystream under k_ij (``cryptography``, AES-NI),
             one IV per RNS prime, expanded to residues uniform in
             [0, q_l) by rejection of bit_length(q_l)-bit words (exactly
             uniform mod q by the CRT).

``context`` binds the key-set transcript and the round
(:func:`mask_context`), so masks are fresh per key set and round, and two
clients that were shown different key sets derive different k_ij (their
masks then never cancel: the round fails instead of leaking).

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from numpy.typing import NDArray

from .params import ParameterSet

__all__ = [
    "MASK_KEY_BYTES",
    "MaskKeyError",
    "MaskSum",
    "mask_pairs",
    "new_mask_keypair",
    "mask_public_key",
    "mask_context",
    "pairwise_mask_key",
    "expand_mask",
    "client_mask",
    "mask_plaintext",
    "apply_mask",
    "DEFAULT_MASK_DEGREE",
    "graph_degree",
    "check_mask_degree",
    "mask_neighbours",
    "induced_components",
    "check_contributors_connected",
]

MASK_KEY_BYTES = 32
_DOMAIN = b"flwr-fedeval/xmkckks/pairwise-mask/v2"  # v2: AES-256-CTR PRG


#: Default degree k of the mask graph (SecAgg+, Bell et al. 2020): the smallest k >= 4
#: that keeps the mask cost within 10 % of an xMK-CKKS round at M = 10
#: (``benchmarks/bench_xmk_security.py``). 0 = the complete graph (Bonawitz et al. 2017).
DEFAULT_MASK_DEGREE = 4
_GRAPH_DOMAIN = b"flwr-fedeval/xmkckks/mask-graph/v1"


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


#: values per step of a stream (a protocol constant: the rejection refill is per step)
_STEP = 1 << 16


class _Scratch:
    """Work buffers for one step, shared by every stream of a mask (no page faults per stream)."""

    def __init__(self, size: int = _STEP) -> None:
        self.zeros = bytes(4 * size)
        self.raw = bytearray(4 * size + 16)
        self.vals = np.empty(size, dtype=np.uint32)
        self.bad = np.empty(size, dtype=bool)


class _LimbStream:
    """Residues uniform in [0, p) from AES-256-CTR(key, IV = limb || 0), exactly.

    The keystream is read as little-endian 32-bit words, each cut to
    bit_length(p - 1) bits. :meth:`next` takes ``need`` words; every value
    >= p is replaced, in position order, by the next further word that is
    < p (reading ``2·#rejected + 16`` further words at a time until enough
    are accepted). This is rejection sampling: every value is an
    independent, exactly uniform residue. The sequence depends only on
    (key, limb, p) and the step sizes, fixed by the protocol: a limb of k·n
    values is taken in steps of ``_STEP`` = 2^16 values (the last shorter).

    AES-256-CTR rather than ChaCha20: with AES-NI it produces the keystream
    about twice as fast (``benchmarks/bench_mask_expansion.py``).
    """

    def __init__(self, key: bytes, limb: int, p: int, scratch: _Scratch | None = None) -> None:
        iv = struct.pack(">QQ", limb, 0)  # 2^64 blocks per limb: the streams never overlap
        self._enc = Cipher(algorithms.AES(key), modes.CTR(iv)).encryptor()
        self.p = p
        self._cut = np.uint32((1 << (p - 1).bit_length()) - 1)
        self._p32 = np.uint32(p)
        self._scratch = scratch or _Scratch()

    def _words(self, count: int) -> NDArray[np.uint32]:
        """The next ``count`` keystream words, cut (fresh array)."""
        words: NDArray[np.uint32] = np.frombuffer(self._enc.update(bytes(4 * count)), dtype="<u4")
        cut: NDArray[np.uint32] = words & self._cut
        return cut

    def next(self, need: int) -> NDArray[np.uint32]:
        """The next ``need`` (<= scratch size) residues, a uint32 view valid until the next call."""
        s = self._scratch
        if need > s.vals.size:
            raise ValueError(f"a step takes at most {s.vals.size} values, asked for {need}")
        n_bytes = self._enc.update_into(memoryview(s.zeros)[: 4 * need], s.raw)
        words = np.frombuffer(s.raw, dtype="<u4", count=n_bytes // 4)
        vals: NDArray[np.uint32] = np.bitwise_and(words, self._cut, out=s.vals[:need])
        bad = np.flatnonzero(np.greater_equal(vals, self._p32, out=s.bad[:need]))
        if bad.size:
            pool = np.empty(0, dtype=np.uint32)
            while pool.size < bad.size:
                more = self._words(2 * (bad.size - pool.size) + 16)
                pool = np.concatenate([pool, more[more < self._p32]])
            vals[bad] = pool[: bad.size]
        return vals


def _pair_key_bytes(key: bytes) -> bytes:
    if not isinstance(key, (bytes, bytearray)) or len(key) != 32:
        raise ValueError("mask key must be 32 bytes")
    return bytes(key)


def _check_polys(num_polys: int) -> int:
    if isinstance(num_polys, bool) or int(num_polys) != num_polys or num_polys < 1:
        raise ValueError(f"num_polys must be an integer >= 1, got {num_polys!r}")
    return int(num_polys)


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
        AES-256-CTR(k_ij, IV = l) (see ``_LimbStream``).

    Raises
    ------
    ValueError
        If ``key`` is not 32 bytes or ``num_polys`` < 1.
    """
    zero = np.zeros((_check_polys(num_polys), params.limbs, params.n), dtype=np.uint64)
    return _masked(params, zero, [(_pair_key_bytes(key), np.add)])


def _reduce(acc: np.ndarray, tmp: np.ndarray, p: int, bound: int) -> None:
    """acc mod p in place for uint32 values in [0, bound·p): conditional subtractions of 2^j·p.

    min(a, a - c) in uint32 is a - c if a >= c and a otherwise (a - c wraps
    above a); cheaper than an integer division.
    """
    j = max(bound - 1, 1).bit_length() - 1
    while j >= 0:
        np.subtract(acc, np.uint32(p << j), out=tmp)
        np.minimum(acc, tmp, out=acc)
        j -= 1


class MaskSum:
    """base + Σ ±PRG(key) mod q, a range of polynomials at a time (memory flat in the model size).

    The streams of every (key, limb) are kept between calls, so consecutive calls of
    :meth:`next_rows` over [0, k) give exactly what one call over all k rows gives,
    which is what the clients compute (:func:`mask_plaintext`, :func:`expand_mask`):
    each stream reads the same keystream words in the same steps of :attr:`rows`
    polynomials (the rejection refill is per step), whatever the ranges. The server
    rebuilds the masks of a round this way, a few polynomials at a time, instead of
    holding them at full size.

    Exact integer arithmetic in uint32: the accumulator starts at
    base + (#subtracted)·p, every added term is < p and the subtracted ones
    never take it below zero, so it stays in [0, (1 + #terms)·p); it is
    reduced mod p whenever another group of terms could overflow 2^32, and
    at the end of each step.

    Parameters
    ----------
    params : ParameterSet
    pairs : sequence of (bytes, ufunc)
        (32-byte key, ``np.add`` or ``np.subtract``) per stream.
    num_polys : int
        k, the polynomials of the whole mask.

    Raises
    ------
    ValueError
        A key is not 32 bytes, ``num_polys`` < 1, or a prime too large for uint32 accumulation.
    """

    def __init__(self, params: ParameterSet, pairs: Sequence[tuple[bytes, np.ufunc]], num_polys: int) -> None:
        self.params = params
        self.num_polys = _check_polys(num_polys)
        #: polynomials per step: a range passed to :meth:`next_rows` is a multiple of it (but the last)
        self.rows = max(_STEP // params.n, 1)  # n and _STEP are powers of two
        self.done = 0
        step = self.rows * params.n
        scratch = _Scratch(step)
        self._acc = np.empty(step, dtype=np.uint32)
        self._tmp = np.empty(step, dtype=np.uint32)
        self._limbs = []
        for l, p in enumerate(params.primes):
            budget = (2**32 - 1) // p - 1  # terms that fit on top of a reduced value
            if budget < 1:
                raise ValueError(f"prime {p} too large for 32-bit mask accumulation")
            streams = [(_LimbStream(_pair_key_bytes(key), l, p, scratch), op) for key, op in pairs]
            groups = [streams[g : g + budget] for g in range(0, len(streams), budget)]
            offsets = [np.uint32(sum(op is np.subtract for _, op in grp) * p) for grp in groups]
            self._limbs.append((p, groups, offsets))

    def next_rows(self, base: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """base + Σ ±PRG(key) for the next ``len(base)`` polynomials (continuing where the last call stopped).

        Parameters
        ----------
        base : ndarray of shape (r, L, n), uint64, reduced
            r a multiple of :attr:`rows`, or the rest of the k polynomials.

        Returns
        -------
        ndarray of shape (r, L, n), uint64, reduced

        Raises
        ------
        ValueError
            A wrong shape, or r neither a multiple of :attr:`rows` nor the rest.
        """
        L, n = self.params.limbs, self.params.n
        if base.ndim != 3 or base.shape[1:] != (L, n):
            raise ValueError(f"base must have shape (r, {L}, {n}), got {base.shape}")
        k = base.shape[0]
        left = self.num_polys - self.done
        if not (0 < k <= left and (k % self.rows == 0 or k == left)):
            raise ValueError(f"{k} polynomials asked for, {left} left; steps of {self.rows}")
        out = np.empty_like(base)
        for l, (p, groups, offsets) in enumerate(self._limbs):
            for t0 in range(0, k, self.rows):
                r = min(self.rows, k - t0)
                need = r * n
                acc, tmp = self._acc[:need], self._tmp[:need]
                np.copyto(acc.reshape(r, n), base[t0 : t0 + r, l, :], casting="unsafe")
                for gi, (grp, offset) in enumerate(zip(groups, offsets)):
                    if gi:
                        _reduce(acc, tmp, p, 1 + len(groups[gi - 1]))
                    if offset:
                        acc += offset
                    for stream, op in grp:
                        op(acc, stream.next(need), out=acc)
                _reduce(acc, tmp, p, 1 + len(groups[-1]) if groups else 1)
                out[t0 : t0 + r, l, :] = acc.reshape(r, n)
        self.done += k
        return out


def _masked(
    params: ParameterSet, base: NDArray[np.uint64], pairs: Sequence[tuple[bytes, np.ufunc]]
) -> NDArray[np.uint64]:
    """base + sum of ±PRG(key) mod q, step by step (the buffers stay in cache): :class:`MaskSum` at once."""
    return MaskSum(params, pairs, base.shape[0]).next_rows(base)


def mask_pairs(
    *, own_name: str, own_private: bytes, peers: Mapping[str, bytes], context: bytes
) -> list[tuple[bytes, np.ufunc]]:
    """The streams of r_i: (k_ij, ``np.add`` if name_i < name_j else ``np.subtract``) per neighbour j, by name.

    Raises
    ------
    MaskKeyError
        If ``peers`` is empty or contains ``own_name``, or an agreement fails.
    """
    if not peers:
        raise MaskKeyError("a mask needs at least one other key-set member")
    if own_name in peers:
        raise MaskKeyError(f"peers must not contain this client ({own_name!r})")
    return [
        (
            pairwise_mask_key(own_private, peers[name], own_name=own_name, peer_name=name, context=context),
            np.add if own_name < name else np.subtract,
        )
        for name in sorted(peers)
    ]


def mask_plaintext(
    params: ParameterSet,
    plaintext: np.ndarray,
    *,
    own_name: str,
    own_private: bytes,
    peers: Mapping[str, bytes],
    context: bytes,
) -> np.ndarray:
    """m_i + r_i mod q with r_i = sum_{j in N(i)} sign(i, j)·PRG(k_ij) (Bonawitz et al. 2017, §4).

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
        Each neighbour's name (every other member for the complete graph,
        else :func:`mask_neighbours`) -> its X25519 mask public key (32
        bytes), as checked against its signed commitment. Must not contain
        ``own_name``; must not be empty.
    context : bytes
        :func:`mask_context` of the key set and round.

    Returns
    -------
    ndarray of shape (k, L, n), uint64
        m_i + r_i; the masks r_i of all members of a key set (each over its
        neighbours in the same graph) sum to 0 mod q, so the sum of the
        masked plaintexts is sum_i m_i exactly.

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
    pairs = mask_pairs(own_name=own_name, own_private=own_private, peers=peers, context=context)
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



def _check_degree_value(degree: object, what: str = "mask degree") -> int:
    if isinstance(degree, bool) or not isinstance(degree, (int, np.integer)) or degree < 0:
        raise MaskKeyError(f"{what} must be an integer >= 0 (0 = complete graph), got {degree!r}")
    return int(degree)


def graph_degree(degree: int, num_members: int) -> int:
    """The degree the mask graph of ``num_members`` members actually has for a requested ``degree``.

    0 or any value >= M - 1 gives the complete graph (M - 1). Otherwise the
    smallest feasible degree >= max(degree, 2) of a circulant graph: 2 keeps
    it connected (a ring), and an odd degree needs an even M (M·k is twice
    the number of edges), so it is raised by one for odd M.

    Raises
    ------
    MaskKeyError
        If ``degree`` is not an integer >= 0 or ``num_members`` < 2.
    """
    degree = _check_degree_value(degree)
    if isinstance(num_members, bool) or not isinstance(num_members, (int, np.integer)) or num_members < 2:
        raise MaskKeyError(f"a mask graph needs at least 2 members, got {num_members!r}")
    m = int(num_members)
    if degree == 0 or degree >= m - 1:
        return m - 1
    degree = max(degree, 2)
    if degree % 2 and m % 2:
        degree += 1
    return min(degree, m - 1)


def check_mask_degree(degree: int, num_members: int, floor: int) -> int:
    """A member's check of the server's mask degree against its own floor; returns the graph's degree.

    Both are read through :func:`graph_degree`, so a floor of 0 (or >= M - 1)
    demands the complete graph and a floor f accepts any graph of degree >= f.

    Raises
    ------
    MaskKeyError
        If the graph of ``degree`` has a lower degree than the graph of ``floor``
        (a member with fewer neighbours than this client requires), or a value
        is not an integer >= 0.
    """
    floor = _check_degree_value(floor, "mask-degree floor")
    got, need = graph_degree(degree, num_members), graph_degree(floor, num_members)
    if got < need:
        raise MaskKeyError(
            f"mask degree {degree} gives each of the {num_members} members {got} neighbours, this client requires "
            f"at least {need} (its floor fedeval-xmk-mask-degree = {floor}; 0 = complete graph)"
        )
    return got


def mask_neighbours(names: Iterable[str], degree: int, transcript: bytes) -> dict[str, tuple[str, ...]]:
    """The mask graph of a key set: each member's neighbours (SecAgg+, Bell et al., CCS 2020, §3).

    The members are placed on a ring in the order of
    SHA-256(domain || T || name), T the key-set transcript digest (which
    holds every member's commitment, fixed before anyone's share is
    revealed, and the degree), so the server cannot choose who is adjacent
    to whom. Member at position i is adjacent to positions i ± 1, ...,
    i ± floor(k/2) and, for odd k, i + M/2 (a Harary graph H_{k,M}: k-regular
    and k-connected, hence connected), k = :func:`graph_degree`; for
    k = M - 1 the complete graph.

    Why any connected graph suffices against the server: the masks of a
    linear combination Σ a_i (m_i + r_i) cancel only if a_i = a_j (mod q_l)
    on every edge, i.e. a is constant on the (single) connected component:
    only multiples of the full sum decrypt.

    Parameters
    ----------
    names : sequence of str
        The key set's members (distinct roster names).
    degree : int
        The public degree k (0 = complete graph).
    transcript : bytes
        The key-set transcript digest T every member signed.

    Returns
    -------
    dict of str to tuple of str
        Each member's neighbours, sorted by name; symmetric.

    Raises
    ------
    MaskKeyError
        Duplicate names, fewer than 2 members, or a bad degree.
    """
    names = [str(n) for n in names]
    if len(set(names)) != len(names):
        raise MaskKeyError("mask graph members must be distinct")
    m = len(names)
    k = graph_degree(degree, m)
    if k == m - 1:
        return {name: tuple(sorted(o for o in names if o != name)) for name in names}
    t = _lp(bytes(transcript))

    def rank(name: str) -> bytes:
        return hashlib.sha256(_GRAPH_DOMAIN + t + _lp(name.encode())).digest()

    ring = sorted(names, key=lambda name: (rank(name), name))
    offsets = list(range(1, k // 2 + 1)) + ([m // 2] if k % 2 else [])
    out = {}
    for i, name in enumerate(ring):
        adj = {ring[(i + o) % m] for o in offsets} | {ring[(i - o) % m] for o in offsets}
        out[name] = tuple(sorted(adj))
    return out


def induced_components(graph: Mapping[str, Sequence[str]], subset: Iterable[str]) -> list[list[str]]:
    """The connected components of the mask graph induced on ``subset`` (each sorted, in order of their
    first member).

    Why it matters: the masks of a combination Σ a_i (m_i + r_i) over C cancel on the edges inside C only
    if a is constant on each component of the graph induced on C; the masks of the edges from C to K∖C
    are removed by the server (it reconstructs the mask keys of K∖C). So once the members of K∖C are
    rebuilt, only the sums over the components of C are protected: with two components the server
    could decrypt each one, and a member whose neighbours all left C is alone in its component
    (its update unmasked by 2·c1 or by one colluding contributor's correlated ciphertext).

    Raises
    ------
    MaskKeyError
        A member of ``subset`` that is not in ``graph``.
    """
    members = sorted({str(s) for s in subset})
    unknown = [m for m in members if m not in graph]
    if unknown:
        raise MaskKeyError(f"{unknown} are not members of the mask graph")
    inside = set(members)
    seen: set[str] = set()
    components = []
    for start in members:
        if start in seen:
            continue
        stack, component = [start], []
        seen.add(start)
        while stack:
            node = stack.pop()
            component.append(node)
            for peer in graph[node]:
                if peer in inside and peer not in seen:
                    seen.add(peer)
                    stack.append(peer)
        components.append(sorted(component))
    return components


def check_contributors_connected(names: Iterable[str], degree: int, transcript: bytes,
                                 contributors: Iterable[str]) -> None:
    """A decryptor's check that the mask graph of the key set (:func:`mask_neighbours`) induced on the
    contributor set C is connected (:func:`induced_components`).

    Raises
    ------
    MaskKeyError
        The induced graph has more than one component (naming them), or a contributor is not a member.
    """
    components = induced_components(mask_neighbours(names, degree, transcript), contributors)
    if len(components) > 1:
        raise MaskKeyError(f"the mask graph induced on the contributor set is not connected (components "
                           f"{components}): the server could decrypt each part, or a member whose neighbours "
                           f"all left C alone")
