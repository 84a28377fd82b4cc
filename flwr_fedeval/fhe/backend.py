"""The CKKS seam: one small interface over TenSEAL (default) and OpenFHE.

The FHE AUC protocols (:mod:`flwr_fedeval.fhe.auc`,
:mod:`flwr_fedeval.fhe.auc_malicious`) use only the operations declared on
:class:`CKKSContext`: encrypt a float vector, add many ciphertexts, ct×ct
multiply, plaintext multiply (mask), sum over **all** slots, decrypt **all**
slots, and byte serialization of the public context (public key + evaluation
keys), of the secret context (secret key, for the key relay) and of
ciphertexts.

Every byte string that leaves a context is wrapped in a small envelope::

    b"FFHE" | version (1) | kind (1) | backend (1) | context id (16)
            | CRC-32 of payload (4) | payload

The context id is drawn at key generation and travels with the public and
secret contexts, so a ciphertext made under another key set raises
:class:`ContextMismatchError` instead of decrypting to garbage, and a
corrupted byte string raises :class:`SerializationError` before the native
library sees it (OpenFHE may crash on malformed input). The CRC catches
accidents, not an adversary: a malicious aggregator can recompute it, and
tampering is what the malicious protocol detects.

No flwr and no TensorFlow imports here; backends are imported lazily so that
the OpenFHE venv (Python 3.10) does not need TenSEAL and vice versa.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar, Protocol

import numpy as np

from flwr_fedeval.rlwe.params import HE_STANDARD_128_TABLE

__all__ = [
    "BACKENDS",
    "CKKSContext",
    "CKKSParams",
    "ContextMismatchError",
    "FHEError",
    "NoSecretKeyError",
    "SerializationError",
    "create_context",
    "default_backend",
    "load_context",
    "pack_blobs",
    "unpack_blobs",
]

BACKENDS = ("tenseal", "openfhe")
_BACKEND_CODE = {"tenseal": 1, "openfhe": 2}
_CODE_BACKEND = {v: k for k, v in _BACKEND_CODE.items()}

MAGIC = b"FFHE"
VERSION = 2
KIND_CIPHERTEXT = 1
KIND_PUBLIC_CONTEXT = 2
KIND_SECRET_CONTEXT = 3
_KIND_NAME = {1: "ciphertext", 2: "public context", 3: "secret context"}
_HEADER = struct.Struct(">4sBBB16sI")  # magic, version, kind, backend, ctx id, CRC-32


class FHEError(Exception):
    """Base class of the errors raised by the CKKS seam."""


class SerializationError(FHEError, ValueError):
    """Bytes that are not a valid serialized object of the expected kind."""


class ContextMismatchError(SerializationError):
    """A ciphertext (or context) made under a different key set or backend."""


class NoSecretKeyError(FHEError):
    """Decryption attempted with a context that holds no secret key."""


def default_backend() -> str:
    """Backend named by the ``FHE_BACKEND`` environment variable, else ``"tenseal"``."""
    name = os.environ.get("FHE_BACKEND", "tenseal").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"FHE_BACKEND must be one of {BACKENDS}, got {name!r}")
    return name


@dataclass(frozen=True)
class CKKSParams:
    """CKKS parameters of one backend, validated on construction.

    Parameters
    ----------
    backend : {"tenseal", "openfhe"}
    poly_modulus_degree : int
        Ring dimension ``n`` (power of two); the batch has ``n/2`` slots.
    scale_bits : int
        ``log2`` of the CKKS scale Δ.
    coeff_mod_bit_sizes : tuple of int, optional
        TenSEAL/SEAL only: bit sizes of the RNS primes, first = decryption
        prime, last = special (key-switching) prime; one rescale per inner
        prime. Their sum must not exceed the HomomorphicEncryption.org bound
        for 128-bit classical security (218 bits at n = 8192, 438 at 16384).
    mult_depth : int
        OpenFHE only: multiplicative depth. The protocols need 2 (ct×ct, then
        the mask), which is the default (no spare level, as the TenSEAL set).
    first_mod_bits : int
        OpenFHE only: size of the first (decryption) modulus.
    num_large_digits : int
        OpenFHE only: ``dnum`` of HYBRID key switching (0 = OpenFHE's choice).
        One RNS limb per digit (``mult_depth + 1``) keeps the special modulus
        P to one prime, so Q·P fits the 128-bit bound of n = 2^13
        (:meth:`fast_openfhe`).
    scaling : {"fixed-manual", "flexible-auto"}
        OpenFHE only: ``fixed-manual`` rescales right after every product, so
        rotations run on fewer RNS limbs and results leave with one limb (the
        result is mod-reduced before download); ``flexible-auto`` (the paper's)
        rescales lazily.
    batch_size : int, default=0
        OpenFHE only: number of slots ``B`` (power of two ≤ n/2; 0 = n/2).
        With sparse packing the B slots repeat cyclically, so a sum over all
        B slots is still a whole-batch sum (no partial windows) but needs only
        ``log2 B`` rotations. See :meth:`for_slots`.

    Notes
    -----
    Default TenSEAL set: ``n = 8192``, primes ``[60, 49, 49, 60]`` (218 bits,
    exactly the 128-bit bound), Δ = 2^49: depth 2, no spare level, values at
    the last level must stay below ``2^(60-49-1) = 1024`` in magnitude. The
    usual ``[60, 40, 40, 60]``/2^40 set is 512× less precise (relative error
    ~1e-6 after mask, too coarse for the 1e-6 AUC target).
    Default OpenFHE set: the paper's ring (``n = 2^14``, Δ = 2^50, first
    modulus 60 bits: headroom 2^9, 2^27 pooled rows, the FHE AUC's certified
    error bound as with TenSEAL) with depth 2 instead of 3 and fixed-manual
    rescaling right after every product: ciphertexts carry 3 RNS limbs instead
    of 4, rotations run on 2, results leave mod-reduced to one limb (a third of
    the download). 128-bit classical per the HomomorphicEncryption.org
    standard (OpenFHE checks it under ``HEStd_128_classic``).
    :meth:`fast_openfhe` halves the ring (``n = 2^13``, Δ = 2^47, first
    modulus 55 bits — OpenFHE refuses more at n = 2^13 with HYBRID key
    switching — dnum = 3): ~2× faster again, but only 2^24 pooled rows and a
    4-8× larger CKKS error, so the malicious protocol's certified error bound
    reaches its 1e-6 limit on ordinary data at M = 100 (measured) and clients
    refuse. :meth:`paper_openfhe` is the paper's set (depth 3, flexible-auto).
    BV key switching (no special prime) was measured 10-100× noisier.
    """

    backend: str = "tenseal"
    poly_modulus_degree: int = 8192
    scale_bits: int = 49
    coeff_mod_bit_sizes: tuple[int, ...] = (60, 49, 49, 60)
    mult_depth: int = 3
    first_mod_bits: int = 60
    batch_size: int = 0
    num_large_digits: int = 3
    scaling: str = "fixed-manual"

    # HomomorphicEncryption.org standard, 128-bit classical, ternary secret (one table, in rlwe.params).
    _MAX_LOGQ: ClassVar[dict[int, int]] = HE_STANDARD_128_TABLE

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        n = self.poly_modulus_degree
        if n not in self._MAX_LOGQ:
            raise ValueError(f"poly_modulus_degree must be a power of two in [1024, 32768], got {n!r}")
        if not 20 <= self.scale_bits <= 59:
            raise ValueError(f"scale_bits must be in [20, 59], got {self.scale_bits!r}")
        if self.backend == "tenseal":
            sizes = tuple(int(s) for s in self.coeff_mod_bit_sizes)
            if len(sizes) < 4:
                raise ValueError(
                    "coeff_mod_bit_sizes needs >= 4 primes (decryption, 2 rescales, special), "
                    f"got {sizes}"
                )
            if sum(sizes) > self._MAX_LOGQ[n]:
                raise ValueError(
                    f"coeff_mod_bit_sizes sum to {sum(sizes)} bits > {self._MAX_LOGQ[n]}, "
                    f"the 128-bit classical bound for n={n}"
                )
            if self.batch_size:
                raise ValueError("batch_size is an OpenFHE option; TenSEAL always uses n/2 slots")
        else:
            b = self.batch_size
            if b and (b & (b - 1) or b > n // 2 or b < 2):
                raise ValueError(f"batch_size must be 0 or a power of two in [2, n/2={n // 2}], got {b!r}")
            if self.mult_depth < 2:
                raise ValueError(f"mult_depth must be >= 2, got {self.mult_depth!r}")
            if isinstance(self.num_large_digits, bool) or not isinstance(self.num_large_digits, int) \
                    or self.num_large_digits < 0:
                raise ValueError(f"num_large_digits must be an integer >= 0, got {self.num_large_digits!r}")
            if self.scaling not in ("fixed-manual", "flexible-auto"):
                raise ValueError(f"scaling must be 'fixed-manual' or 'flexible-auto', got {self.scaling!r}")

    @classmethod
    def default(cls, backend: str | None = None) -> CKKSParams:
        """The default (128-bit) parameter set of ``backend``."""
        backend = backend or default_backend()
        if backend == "openfhe":
            return cls(backend="openfhe", poly_modulus_degree=16384, scale_bits=50,
                       coeff_mod_bit_sizes=(), mult_depth=2, first_mod_bits=60,
                       num_large_digits=0, scaling="fixed-manual")
        return cls(backend="tenseal")

    @classmethod
    def fast_openfhe(cls) -> CKKSParams:
        """A faster, less precise OpenFHE set (see the class notes): ``n = 2^13``,
        Δ = 2^47, first modulus 55 bits, depth 2, HYBRID dnum = 3, fixed-manual."""
        return cls(backend="openfhe", poly_modulus_degree=8192, scale_bits=47,
                   coeff_mod_bit_sizes=(), mult_depth=2, first_mod_bits=55,
                   num_large_digits=3, scaling="fixed-manual")

    @classmethod
    def paper_openfhe(cls) -> CKKSParams:
        """The FHE AUC paper's OpenFHE set (Baykara et al. 2025, §VII), for comparison:
        ``n = 2^14``, Δ = 2^50, first modulus 60 bits, depth 3, HYBRID key
        switching (OpenFHE's dnum), flexible-auto rescaling."""
        return cls(backend="openfhe", poly_modulus_degree=16384, scale_bits=50,
                   coeff_mod_bit_sizes=(), mult_depth=3, first_mod_bits=60,
                   num_large_digits=0, scaling="flexible-auto")

    @classmethod
    def for_slots(cls, needed_slots: int, backend: str | None = None, *,
                  base: CKKSParams | None = None) -> CKKSParams:
        """Default parameters of ``backend`` (or ``base``) with the smallest batch holding ``needed_slots``."""
        p = base if base is not None else cls.default(backend)
        if needed_slots > p.poly_modulus_degree // 2:
            raise ValueError(
                f"{needed_slots} slots exceed the {p.poly_modulus_degree // 2} of n={p.poly_modulus_degree}"
            )
        if p.backend != "openfhe":
            return p
        b = max(2, 1 << max(0, int(needed_slots - 1).bit_length()))
        return replace(p, batch_size=b)

    @property
    def slot_count(self) -> int:
        return self.batch_size or self.poly_modulus_degree // 2

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> CKKSParams:
        try:
            d = json.loads(bytes(data).decode())
            d["coeff_mod_bit_sizes"] = tuple(d["coeff_mod_bit_sizes"])
            d.setdefault("num_large_digits", 0)  # contexts serialized before these fields
            d.setdefault("scaling", "flexible-auto")
            return cls(**d)
        except (ValueError, KeyError, TypeError) as exc:
            raise SerializationError(f"invalid CKKS parameters in context: {exc}") from None

    @property
    def max_final_value(self) -> float:
        """Largest magnitude a value may have at the last level (decryption headroom)."""
        first = self.coeff_mod_bit_sizes[0] if self.backend == "tenseal" else self.first_mod_bits
        return float(2 ** (first - self.scale_bits - 1))


def _digest(payload: bytes | memoryview) -> int:
    # CRC-32 catches accidental corruption at ~3 GB/s (BLAKE2b cost 0.5 ms per
    # ciphertext, a third of the aggregator's deserialization time). It is no
    # defence against an adversary, and is not meant to be one.
    return zlib.crc32(payload)


def wrap(kind: int, backend: str, context_id: bytes, payload: bytes) -> bytes:
    """Envelope ``payload`` (internal; used by the backends)."""
    header = _HEADER.pack(MAGIC, VERSION, kind, _BACKEND_CODE[backend], context_id, _digest(payload))
    return header + payload


def peek(data: bytes) -> tuple[int, str, bytes]:
    """``(kind, backend, context_id)`` of an envelope, after checking it."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SerializationError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEADER.size:
        raise SerializationError(f"{len(data)} bytes is too short for a flwr-fedeval FHE object")
    magic, version, kind, code, ctx_id, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SerializationError("not a flwr-fedeval FHE object (bad magic bytes)")
    if version != VERSION:
        raise SerializationError(f"unsupported FHE envelope version {version}")
    if kind not in _KIND_NAME:
        raise SerializationError(f"unknown object kind {kind}")
    if code not in _CODE_BACKEND:
        raise SerializationError(f"unknown backend code {code}")
    if _digest(memoryview(data)[_HEADER.size:]) != digest:
        raise SerializationError(
            f"corrupted {_KIND_NAME[kind]}: checksum mismatch ({len(data)} bytes)"
        )
    return kind, _CODE_BACKEND[code], ctx_id


def unwrap(data: bytes, kind: int, backend: str, context_id: bytes | None) -> bytes:
    """Check the envelope and return the payload (internal)."""
    got_kind, got_backend, got_id = peek(data)
    if got_kind != kind:
        raise SerializationError(f"expected a {_KIND_NAME[kind]}, got a {_KIND_NAME[got_kind]}")
    if got_backend != backend:
        raise ContextMismatchError(
            f"{_KIND_NAME[kind]} was made by the {got_backend} backend, this context is {backend}"
        )
    if context_id is not None and got_id != context_id:
        raise ContextMismatchError(
            f"{_KIND_NAME[kind]} belongs to key set {got_id.hex()[:12]}…, "
            f"this context is {context_id.hex()[:12]}…"
        )
    return bytes(data[_HEADER.size:])


def pack_blobs(blobs: Sequence[bytes]) -> bytes:
    """Concatenate byte strings with 8-byte length prefixes (a message body)."""
    out = [struct.pack(">I", len(blobs))]
    for b in blobs:
        out.append(struct.pack(">Q", len(b)))
        out.append(bytes(b))
    return b"".join(out)


def unpack_blobs(data: bytes, expected: int | None = None) -> list[bytes]:
    """Inverse of :func:`pack_blobs`; raises :class:`SerializationError` on bad framing."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise SerializationError(f"expected bytes, got {type(data).__name__}")
    data = bytes(data)
    try:
        (count,) = struct.unpack_from(">I", data, 0)
        pos, blobs = 4, []
        for _ in range(count):
            (size,) = struct.unpack_from(">Q", data, pos)
            pos += 8
            if pos + size > len(data):
                raise SerializationError("truncated message")
            blobs.append(data[pos:pos + size])
            pos += size
    except struct.error as exc:
        raise SerializationError(f"malformed message framing: {exc}") from None
    if pos != len(data):
        raise SerializationError(f"{len(data) - pos} trailing bytes after the last item")
    if expected is not None and count != expected:
        raise SerializationError(f"expected {expected} items in the message, got {count}")
    return blobs


class CKKSContext(ABC):
    """A CKKS key set: private (clients) or public (aggregator).

    Ciphertext objects are backend-native and opaque; only bytes cross
    process boundaries. Every vector is a full batch of :attr:`slot_count`
    slots (shorter inputs are zero-padded), so that :meth:`sum_slots` sums
    the *whole* batch and :meth:`decrypt` returns every slot.
    """

    backend: str
    params: CKKSParams
    context_id: bytes

    @property
    def slot_count(self) -> int:
        return self.params.slot_count

    @property
    @abstractmethod
    def is_private(self) -> bool:
        """True iff this context holds the secret key."""

    # -- arithmetic -------------------------------------------------------
    @abstractmethod
    def encrypt(self, values: Iterable[float]) -> Any:
        """Encrypt ``values`` (≤ slot_count reals, zero-padded to a full batch)."""

    @abstractmethod
    def decrypt(self, ct: Any) -> np.ndarray:
        """All ``slot_count`` slots of ``ct`` (real parts), float64."""

    @abstractmethod
    def add_many(self, cts: Sequence[Any]) -> Any:
        """Sum of one or more ciphertexts."""

    @abstractmethod
    def multiply(self, a: Any, b: Any) -> Any:
        """Slot-wise product (relinearised and rescaled); uses one level."""

    @abstractmethod
    def multiply_plain(self, ct: Any, values: Sequence[float]) -> Any:
        """Slot-wise product with a plaintext vector (the mask); uses one level."""

    @abstractmethod
    def sum_slots(self, ct: Any) -> Any:
        """Every slot := sum over all ``slot_count`` slots (log2 rotations)."""

    def encode_plain(self, values: Iterable[float]) -> Any:
        """Pre-encode a plaintext vector for repeated use in :meth:`dot_plain`.

        Added for Matrix Reducing (secure Shapley values), where the same data
        shares multiply many encrypted models. The default returns the padded
        float vector (no saving); TenSEAL returns an encoded SEAL plaintext at
        the top level (valid for fresh ciphertexts and sums of them).
        """
        return self._pad(values)

    def dot_plain(self, cts: Sequence[Any], plains: Sequence[Any]) -> Any:
        """``Σ_o cts[o] ⊙ plains[o]``: slot-wise ciphertext×plaintext products, summed.

        Added for Matrix Reducing (secure Shapley values). ``plains`` holds
        float vectors or results of :meth:`encode_plain`. Uses one level. The
        default composes :meth:`multiply_plain` and :meth:`add_many`; TenSEAL
        overrides it without any rescale, which keeps integer-valued results
        exact up to ~2^45.
        """
        cts = list(cts)
        if not cts or len(cts) != len(plains):
            raise ValueError(f"dot_plain needs equally many (>= 1) ciphertexts and plaintexts, "
                             f"got {len(cts)} and {len(plains)}")
        return self.add_many([self.multiply_plain(c, p) for c, p in zip(cts, plains)])

    def rotate(self, ct: Any, steps: int) -> Any:
        """Slots rotated left by ``steps``: slot ``i`` of the result holds slot ``(i + steps) mod slot_count``.

        Added for Matrix Squaring (HESV's baseline packing, Zheng et al. 2023
        §4.2, step 5). Uses no level. A step that is not a power of two costs
        one key switch per power of two in its decomposition (SEAL's NAF,
        OpenFHE's binary digits). Needs the rotation keys: a context loaded
        from ``public_bytes(rotation_keys=False)`` raises. Backends override it;
        the default refuses.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot rotate ciphertexts")

    # -- checks on received ciphertexts (a deviating server) -------------------------
    def ciphertext_layout(self, ct: Any) -> tuple[int, int, float, int]:
        """``(slots, level, scale, polynomials)`` of ``ct`` as this backend reports them.

        ``level`` counts the RNS primes the ciphertext still has (TenSEAL) or
        OpenFHE's level (0 = fresh). Backends override it; the default refuses.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot report ciphertext layouts")

    def fresh_layout(self) -> tuple[int, int, float, int]:
        """The layout of a fresh ciphertext under this context (what clients send).

        Measured once by encrypting zeros under the (public) key, so it holds
        for every backend and parameter set."""
        cached = getattr(self, "_fresh_layout", None)
        if cached is None:
            cached = self._fresh_layout = self.ciphertext_layout(self.encrypt([0.0]))
        return cached

    def check_fresh(self, ct: Any) -> Any:
        """Refuse a received ciphertext whose slot count, level, scale or size is not a fresh one's.

        Aggregating ciphertexts of different levels or scales raises inside
        the CKKS library (or, worse, computes a wrong number); a server checks
        every ciphertext with this before aggregation so that one bad node is
        left out and named.

        Raises
        ------
        SerializationError
            Naming the field that differs, e.g. ``"slot count 2048, expected 4096"``.
        """
        got, want = self.ciphertext_layout(ct), self.fresh_layout()
        for name, g, w in zip(("slot count", "level", "scale", "polynomial count"), got, want):
            if g != w:
                raise SerializationError(f"ciphertext {name} {g}, expected {w} (a fresh ciphertext under the "
                                         f"public context)")
        return ct

    # -- serialization ----------------------------------------------------
    @abstractmethod
    def serialize_ciphertext(self, ct: Any) -> bytes:
        ...

    @abstractmethod
    def deserialize_ciphertext(self, data: bytes) -> Any:
        """Raises :class:`SerializationError`/:class:`ContextMismatchError` on bad input."""

    @abstractmethod
    def public_bytes(self, *, rotation_keys: bool = True) -> bytes:
        """Public context for the aggregator: params, public key, relin and rotation keys.

        ``rotation_keys=False`` leaves the rotation (Galois) keys out — 37.7 MB of
        the 37.7 MB TenSEAL default context — for protocols without rotations
        (SecSV, Matrix Reducing); such a context cannot ``sum_slots``. TenSEAL only:
        OpenFHE raises ``ValueError``.
        """

    @abstractmethod
    def secret_bytes(self) -> bytes:
        """Secret context for the other clients (secret key, no evaluation keys)."""

    # helpers ------------------------------------------------------------
    def _pad(self, values: Iterable[float]) -> np.ndarray:
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError(f"values must be 1-D, got shape {arr.shape}")
        if arr.size > self.slot_count:
            raise ValueError(f"{arr.size} values do not fit in {self.slot_count} slots")
        if not np.isfinite(arr).all():
            raise ValueError("values contain NaN or infinity")
        out = np.zeros(self.slot_count, dtype=np.float64)
        out[: arr.size] = arr
        return out


class _Engine(Protocol):
    """What a backend module provides (``tenseal_backend``, ``openfhe_backend``)."""

    def create(self, params: CKKSParams) -> CKKSContext: ...

    def load(self, data: bytes) -> CKKSContext: ...


def _backend_module(name: str) -> _Engine:
    if name == "tenseal":
        from flwr_fedeval.fhe import tenseal_backend

        return tenseal_backend
    if name == "openfhe":
        from flwr_fedeval.fhe import openfhe_backend

        return openfhe_backend
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")


def create_context(backend: str | None = None, params: CKKSParams | None = None) -> CKKSContext:
    """Generate a fresh private key set (run by the key-holder client).

    Parameters
    ----------
    backend : {"tenseal", "openfhe"}, optional
        Defaults to ``params.backend`` or :func:`default_backend`.
    params : CKKSParams, optional
        Defaults to :meth:`CKKSParams.default` of the backend.
    """
    if params is None:
        params = CKKSParams.default(backend)
    elif backend is not None and backend != params.backend:
        raise ValueError(f"backend={backend!r} but params.backend={params.backend!r}")
    return _backend_module(params.backend).create(params)


def load_context(data: bytes) -> CKKSContext:
    """Load a public or secret context produced by :meth:`CKKSContext.public_bytes`
    or :meth:`CKKSContext.secret_bytes` (the backend is read from the bytes)."""
    kind, backend, _ = peek(data)
    if kind not in (KIND_PUBLIC_CONTEXT, KIND_SECRET_CONTEXT):
        raise SerializationError(f"expected a context, got a {_KIND_NAME[kind]}")
    return _backend_module(backend).load(data)
