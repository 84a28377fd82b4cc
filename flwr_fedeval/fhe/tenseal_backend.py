"""TenSEAL (Microsoft SEAL) implementation of :class:`~flwr_fedeval.fhe.backend.CKKSContext`.

Vectors are always full batches (``n/2`` slots, zero-padded) so that
``CKKSVector.sum()`` rotates over the whole batch (``log2(n/2)`` rotations:
every slot ends up holding the total, no partial-window sums). TenSEAL marks
a summed vector as size 1 although every slot holds the sum; :meth:`decrypt`
re-labels the size so that *all* slots are returned, which is what a curious
client could do with the bytes it receives.

Known limit: TenSEAL's Python API generates the full default set of Galois
keys (both directions, every power of two), so the public context is ~35 MB
at ``n = 8192``; the protocols use only the positive power-of-two steps.
"""

from __future__ import annotations

import os
import secrets
import struct
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import tenseal as ts

from flwr_fedeval.fhe.backend import (
    KIND_CIPHERTEXT,
    KIND_PUBLIC_CONTEXT,
    KIND_SECRET_CONTEXT,
    CKKSContext,
    CKKSParams,
    NoSecretKeyError,
    SerializationError,
    pack_blobs,
    peek,
    unpack_blobs,
    unwrap,
    wrap,
)

__all__ = ["TenSEALContext", "create", "load"]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Encoded:
    """A SEAL plaintext encoded by :meth:`TenSEALContext.encode_plain`."""

    __slots__ = ("pt",)

    def __init__(self, pt: Any) -> None:  # a tenseal.sealapi.Plaintext
        self.pt = pt


class TenSEALContext(CKKSContext):
    backend = "tenseal"

    def __init__(self, ctx: ts.Context, params: CKKSParams, context_id: bytes) -> None:
        self._sa: tuple[Any, Any, Any] | None = None  # (sealapi module, Evaluator, CKKSEncoder)
        self._ctx = ctx
        self.params = params
        self.context_id = context_id

    @property
    def is_private(self) -> bool:
        return bool(self._ctx.is_private())

    # -- arithmetic -------------------------------------------------------
    def encrypt(self, values: Iterable[float]) -> Any:
        return ts.ckks_vector(self._ctx, self._pad(values).tolist())

    def _full(self, ct: ts.CKKSVector) -> ts.CKKSVector:
        """Same ciphertext, labelled with the full batch size."""
        if ct.size() == self.slot_count:
            return ct
        raw = ct.serialize()
        # CKKSVectorProto: field 1 = packed shape (one varint), field 2 = ciphertext.
        if raw[:1] != b"\n":
            raise SerializationError("unexpected TenSEAL vector layout")
        length = raw[1]
        body = raw[2 + length:]
        size = _varint(self.slot_count)
        patched = b"\n" + bytes([len(size)]) + size + body
        return ts.ckks_vector_from(self._ctx, patched)

    def decrypt(self, ct: Any) -> np.ndarray:
        if not self.is_private:
            raise NoSecretKeyError("this TenSEAL context holds no secret key (public context)")
        return np.asarray(self._full(ct).decrypt(), dtype=np.float64)

    def add_many(self, cts: Sequence[Any]) -> Any:
        cts = list(cts)
        if not cts:
            raise ValueError("add_many needs at least one ciphertext")
        if len(cts) == 1:
            return cts[0]  # CKKSVector.copy() deep-copies the whole context (slow)
        acc = cts[0].add(cts[1])
        for ct in cts[2:]:
            acc.add_(ct)
        return acc

    def multiply(self, a: Any, b: Any) -> Any:
        return a.mul(b)

    def multiply_plain(self, ct: Any, values: Sequence[float]) -> Any:
        vals = self._pad(values)
        if ct.size() == 1 and not vals[1:].any():
            # Summed vector (size 1): TenSEAL zero-pads a 1-element plaintext.
            return ct.mul([float(vals[0])])
        return self._full(ct).mul(vals.tolist())

    # -- pre-encoded plaintexts (secure Shapley values) --------------------
    def _sealapi(self) -> tuple[Any, Any, Any]:
        """TenSEAL's bundled SEAL bindings on this context's SEALContext (lazy)."""
        if self._sa is None:
            import tenseal.sealapi as sa

            sc = self._ctx.seal_context().data
            self._sa = (sa, sa.Evaluator(sc), sa.CKKSEncoder(sc))
        return self._sa

    def encode_plain(self, values: Iterable[float]) -> Any:
        sa, _, encoder = self._sealapi()
        pt = sa.Plaintext()
        encoder.encode(self._pad(values).tolist(), float(2 ** self.params.scale_bits), pt)
        return _Encoded(pt)

    def _vector_from_seal(self, ct: Any) -> ts.CKKSVector:
        """Wrap a SEAL ciphertext into a full-batch CKKSVector (CKKSVectorProto:
        1 = shape, 2 = SEAL ciphertext bytes, 3 = initial scale)."""
        fd, path = tempfile.mkstemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.close(fd)
        try:
            ct.save(path)
            with open(path, "rb") as f:
                body = f.read()
        finally:
            os.unlink(path)
        size = _varint(self.slot_count)
        proto = (b"\n" + bytes([len(size)]) + size + b"\x12" + _varint(len(body)) + body
                 + b"\x19" + struct.pack("<d", float(2 ** self.params.scale_bits)))
        return ts.ckks_vector_from(self._ctx, proto)

    def dot_plain(self, cts: Sequence[Any], plains: Sequence[Any]) -> Any:
        """``Σ_o cts[o] ⊙ plains[o]`` without rescaling (result at scale Δ², same level).

        Runs on SEAL directly (TenSEAL's bundled ``sealapi`` on this context):
        plaintexts from :meth:`encode_plain` are reused, raw vectors are
        encoded here; one multiply_plain + add per term, no rescale.
        TenSEAL's own rescale resets the scale to Δ although the dropped prime
        is only ≈ Δ (a systematic relative error ~1e-9); skipping it keeps
        integer-valued results exact (relative decode error ~2^-49, measured),
        which SecSV's modular reconstruction needs. Values must stay below
        ``2^(log2 Q − 2·scale_bits − 1)`` (2^59 at the default 158-bit top level).
        Ciphertexts must be at the top level (fresh, or sums of fresh ones).
        """
        cts = list(cts)
        if not cts or len(cts) != len(plains):
            raise ValueError(f"dot_plain needs equally many (>= 1) ciphertexts and plaintexts, "
                             f"got {len(cts)} and {len(plains)}")
        sa, evaluator, _ = self._sealapi()
        acc, tmp = sa.Ciphertext(), sa.Ciphertext()
        for n, (ct, p) in enumerate(zip(cts, plains)):
            pt = p.pt if isinstance(p, _Encoded) else self.encode_plain(p).pt
            seal_ct = self._full(ct).ciphertext()[0]
            evaluator.multiply_plain(seal_ct, pt, acc if n == 0 else tmp)
            if n:
                evaluator.add_inplace(acc, tmp)
        return self._vector_from_seal(acc)

    def rotate(self, ct: Any, steps: int) -> Any:
        """SEAL ``rotate_vector`` (left by ``steps``) on the full batch; needs the Galois keys."""
        steps = int(steps) % self.slot_count
        if steps == 0:
            return ct
        if not self._ctx.has_galois_keys():
            raise ValueError("this TenSEAL context has no rotation (Galois) keys")
        sa, evaluator, _ = self._sealapi()
        out = sa.Ciphertext()
        evaluator.rotate_vector(self._full(ct).ciphertext()[0], steps, self._ctx.galois_keys().data, out)
        return self._vector_from_seal(out)

    def sum_slots(self, ct: Any) -> Any:
        if ct.size() != self.slot_count:
            ct = self._full(ct)
        return ct.sum()

    # -- checks ---------------------------------------------------------------
    def ciphertext_layout(self, ct: Any) -> tuple[int, int, float, int]:
        """``(slots, RNS primes left, scale, polynomials)``; a parms_id outside this
        context's chain at the top level reports level -1."""
        seal_ct = ct.ciphertext()[0]
        primes = int(seal_ct.coeff_modulus_size())
        top = len(self.params.coeff_mod_bit_sizes) - 1      # the special prime is not a data level
        if primes == top and seal_ct.parms_id() != self._ctx.seal_context().data.first_parms_id():
            primes = -1
        return int(ct.size()), primes, float(seal_ct.scale), int(seal_ct.size())

    # -- serialization ----------------------------------------------------
    def serialize_ciphertext(self, ct: Any) -> bytes:
        return wrap(KIND_CIPHERTEXT, self.backend, self.context_id, ct.serialize())

    def deserialize_ciphertext(self, data: bytes) -> Any:
        payload = unwrap(data, KIND_CIPHERTEXT, self.backend, self.context_id)
        try:
            return ts.ckks_vector_from(self._ctx, payload)
        except Exception as exc:  # TenSEAL raises ValueError/RuntimeError variants
            raise SerializationError(f"TenSEAL could not load the ciphertext: {exc}") from None

    def public_bytes(self, *, rotation_keys: bool = True) -> bytes:
        pub = self._ctx.serialize(save_public_key=True, save_secret_key=False,
                                  save_galois_keys=rotation_keys, save_relin_keys=True)
        return wrap(KIND_PUBLIC_CONTEXT, self.backend, self.context_id,
                    pack_blobs([self.params.to_json(), pub]))

    def secret_bytes(self) -> bytes:
        if not self.is_private:
            raise NoSecretKeyError("a public context has no secret key to share")
        sec = self._ctx.serialize(save_public_key=True, save_secret_key=True,
                                  save_galois_keys=False, save_relin_keys=False)
        return wrap(KIND_SECRET_CONTEXT, self.backend, self.context_id,
                    pack_blobs([self.params.to_json(), sec]))


def create(params: CKKSParams) -> TenSEALContext:
    ctx = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=params.poly_modulus_degree,
        coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes),
    )
    ctx.global_scale = float(2 ** params.scale_bits)
    ctx.generate_galois_keys()
    ctx.generate_relin_keys()
    return TenSEALContext(ctx, params, secrets.token_bytes(16))


def load(data: bytes) -> TenSEALContext:
    kind, _, context_id = peek(data)
    payload = unwrap(data, kind, "tenseal", context_id)
    params_json, native = unpack_blobs(payload, expected=2)
    params = CKKSParams.from_json(params_json)
    try:
        ctx = ts.context_from(native)
    except Exception as exc:
        raise SerializationError(f"TenSEAL could not load the context: {exc}") from None
    if kind == KIND_PUBLIC_CONTEXT and ctx.is_private():  # never trust a "public" label
        ctx.make_context_public()
    ctx.global_scale = float(2 ** params.scale_bits)
    return TenSEALContext(ctx, params, context_id)
