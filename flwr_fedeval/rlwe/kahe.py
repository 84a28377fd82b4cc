"""Key-additive RLWE encryption (KAHE) of a client update -- STAND-IN of the API, to be replaced.

A minimal, unoptimised implementation of the API that the KAHE layer (branch ``w-kahe-core``) provides,
written so that the secure-aggregation glue can be tested end to end before that layer lands. The
merge takes the other branch's file. Construction (Bell-Gascon et al., CRYPTO 2025, on our ring with MSB
encoding): c_j = a_j·k + e_j + Δ·x_j mod Q, a_j uniform from a seed derived from the signed key-set
transcript and the round, k and e_j discrete Gaussian; Σ_C c_j − a_j·Σ_C k = Δ·Σx_j + Σe_j.

Imports neither flwr nor TensorFlow.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct

import numpy as np

from .ring import find_ntt_primes, get_ring
from .sampling import RandomStream, discrete_gaussian, uniform_mod_q

__all__ = ["KaheCiphertext", "KaheError", "KaheParameters", "KaheSum", "encrypt", "kahe_parameters",
           "public_polynomials", "public_seed", "round_key_sum", "sample_key"]

_SEED_DOMAIN = b"flwr-fedeval/kahe/public-seed/v0-stand-in"
_MAGIC = b"KAH0"
_HEADER = struct.Struct("<4sII")  # magic, rows (polynomials), limbs


class KaheError(ValueError):
    """A malformed KAHE ciphertext, parameter set or a key sum that does not round."""


@dataclasses.dataclass(frozen=True)
class KaheParameters:
    n: int
    primes: tuple[int, ...]
    sigma_key: float
    sigma_error: float
    tail: int
    bound: float
    fractional_bits: int
    max_contributors: int
    integer_slots: int

    @property
    def modulus(self) -> int:
        return math.prod(self.primes)

    @property
    def plain_bits(self) -> int:
        return int(math.ceil(math.log2(2 * self.max_contributors * self.bound * 2**self.fractional_bits + 2)))

    @property
    def delta(self) -> int:
        return self.modulus >> self.plain_bits

    @property
    def max_sum_error(self) -> float:
        return self.max_contributors * 2.0 ** (-self.fractional_bits - 1)

    @property
    def bits_per_coefficient(self) -> int:
        return sum(p.bit_length() for p in self.primes)

    def to_bytes(self) -> bytes:
        head = struct.pack("<IIddIdIII", self.n, len(self.primes), self.sigma_key, self.sigma_error, self.tail,
                           self.bound, self.fractional_bits, self.max_contributors, self.integer_slots)
        return b"KAHEP0" + head + b"".join(struct.pack("<Q", p) for p in self.primes)

    @classmethod
    def from_bytes(cls, data: bytes) -> KaheParameters:
        fmt = struct.Struct("<IIddIdIII")
        if data[:6] != b"KAHEP0":
            raise KaheError("not KAHE parameters")
        n, count, sk, se, tail, bound, f, m, slots = fmt.unpack_from(data, 6)
        primes = struct.unpack_from(f"<{count}Q", data, 6 + fmt.size)
        return cls(n, tuple(primes), sk, se, tail, bound, f, m, slots)


def kahe_parameters(max_contributors: int, *, bound: float = 2.0**16, fractional_bits: int = 21,
                    integer_slots: int = 2, n: int = 4096) -> KaheParameters:
    sigma_key, sigma_error = 4.5, 6.36
    tail = int(math.ceil(8 * sigma_error))
    for count in range(2, 6):
        primes = find_ntt_primes(n, 27, count)
        p = KaheParameters(n, tuple(primes), sigma_key, sigma_error, int(math.ceil(8 * sigma_key)), float(bound),
                           fractional_bits, max_contributors, integer_slots)
        if p.delta >= 4 * max_contributors * tail + 2:
            return p
    raise KaheError("no stand-in parameter set")


def public_seed(transcript: bytes, round_: int) -> bytes:
    return hashlib.sha256(_SEED_DOMAIN + struct.pack(">Q", len(transcript)) + bytes(transcript)
                          + struct.pack(">Q", round_)).digest()


def public_polynomials(params: KaheParameters, seed: bytes, count: int) -> np.ndarray:
    """a_j in the NTT domain (uniform there as in the coefficient domain), shape (count, L, n)."""
    return uniform_mod_q(params.primes, params.n, (count,), RandomStream(seed))


def sample_key(params: KaheParameters) -> np.ndarray:
    return discrete_gaussian((params.n,), sigma=params.sigma_key, tail=params.tail).astype(np.int64)


def _rows(params: KaheParameters, length: int) -> int:
    return -(-(length + params.integer_slots) // params.n)


def _encode(params: KaheParameters, values: np.ndarray, integers: np.ndarray) -> tuple[np.ndarray, int]:
    values = np.asarray(values, dtype=np.float64)
    clipped = int(np.count_nonzero(np.abs(values) > params.bound))
    x = np.rint(np.clip(values, -params.bound, params.bound) * 2.0**params.fractional_bits).astype(np.int64)
    flat = np.zeros(_rows(params, values.size) * params.n, dtype=np.int64)
    flat[: values.size] = x
    flat[values.size : values.size + params.integer_slots] = np.asarray(integers, dtype=np.int64)
    return flat.reshape(-1, params.n), clipped


def _a_times(params: KaheParameters, seed: bytes, key: np.ndarray, rows: int) -> np.ndarray:
    ring = get_ring(params.n, params.primes)
    k_hat = ring.ntt(np.stack([np.mod(np.asarray(key, dtype=np.int64), p).astype(np.uint64) for p in params.primes]))
    a_hat = public_polynomials(params, seed, rows)
    return ring.intt((a_hat * k_hat) % ring.q_col)


@dataclasses.dataclass(frozen=True)
class KaheCiphertext:
    params: KaheParameters
    rows: np.ndarray  # (count, L, n) uint64
    clipped: int

    def to_bytes(self) -> bytes:
        return _HEADER.pack(_MAGIC, self.rows.shape[0], self.rows.shape[1]) + self.rows.astype("<u4").tobytes()


def encrypt(params: KaheParameters, seed: bytes, key: np.ndarray, values: np.ndarray,
            integers: np.ndarray) -> KaheCiphertext:
    x, clipped = _encode(params, values, integers)
    rows = x.shape[0]
    q = np.array(params.primes, dtype=np.uint64)[:, None]
    e = discrete_gaussian((rows, params.n), sigma=params.sigma_error,
                          tail=int(math.ceil(8 * params.sigma_error))).astype(np.int64)
    out = _a_times(params, seed, key, rows)
    for li, p in enumerate(params.primes):
        d = params.delta % p
        term = (np.mod(x, p).astype(np.uint64) * np.uint64(d)) % np.uint64(p)
        out[:, li] = (out[:, li] + term + np.mod(e, p).astype(np.uint64)) % np.uint64(p)
    del q
    return KaheCiphertext(params, out, clipped)


class KaheSum:
    def __init__(self, params: KaheParameters, seed: bytes, length: int) -> None:
        self.params, self.seed, self.length = params, seed, length
        self.rows = _rows(params, length)
        self.acc = np.zeros((self.rows, len(params.primes), params.n), dtype=np.uint64)
        self.count = 0

    def add(self, data: bytes | memoryview) -> None:
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise KaheError("KAHE ciphertext: truncated header")
        magic, rows, limbs = _HEADER.unpack_from(data)
        if magic != _MAGIC or rows != self.rows or limbs != len(self.params.primes):
            raise KaheError(f"KAHE ciphertext: header ({magic!r}, {rows}, {limbs}) is not this sum's")
        body = np.frombuffer(data, dtype="<u4", offset=_HEADER.size)
        if body.size != rows * limbs * self.params.n or len(data) != _HEADER.size + 4 * body.size:
            raise KaheError("KAHE ciphertext: payload length")
        x = body.reshape(rows, limbs, self.params.n).astype(np.uint64)
        q = np.array(self.params.primes, dtype=np.uint64)[:, None]
        if np.any(x >= q):
            raise KaheError("KAHE ciphertext: an unreduced residue")
        self.acc = (self.acc + x) % q
        self.count += 1

    def decode(self, key_sum: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = self.params
        ring = get_ring(p.n, p.primes)
        y = (self.acc + (ring.q_col - _a_times(p, self.seed, key_sum, self.rows))) % ring.q_col
        big = ring.to_int(y).reshape(-1)  # centred Python ints? use object arithmetic
        delta = p.delta
        t = 1 << p.plain_bits
        x = np.array([((int(v) + delta // 2) // delta) % t for v in big], dtype=object)
        x = np.array([int(v) - t if v >= t // 2 else int(v) for v in x], dtype=np.int64)
        sums = x[: self.length].astype(np.float64) / 2.0**p.fractional_bits
        return sums, x[self.length : self.length + p.integer_slots].copy()


def round_key_sum(approx: np.ndarray) -> np.ndarray:
    approx = np.asarray(approx, dtype=np.float64)
    nearest = np.rint(approx)
    if not np.all(np.isfinite(approx)) or np.any(np.abs(approx - nearest) > 0.25):
        bad = int(np.count_nonzero(~(np.abs(approx - nearest) <= 0.25)))
        raise KaheError(f"the key sum does not round: {bad} coefficients more than 1/4 from an integer")
    return nearest.astype(np.int64)
