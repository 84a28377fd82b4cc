"""OpenFHE implementation of :class:`~flwr_fedeval.fhe.backend.CKKSContext`.

The paper's engine and ring (Baykara et al. 2025, §VII: n = 2^14, Δ = 2^50,
60-bit first modulus, ``HEStd_128_classic``) with depth 2 instead of 3 and
rescaling right after each product: 3 RNS limbs per ciphertext instead of 4,
rotations on 2, results leave mod-reduced to one limb. Other sets:
:meth:`CKKSParams.fast_openfhe` (n = 2^13, less precise) and
:meth:`CKKSParams.paper_openfhe`. Install: the ``[openfhe]`` extra; the PyPI
wheel (``openfhe==1.6.1.0.22.4``) loads only on CPython 3.10 here
(``make run-openfhe``, ``scripts/test-openfhe.sh``).

OpenFHE traps handled here:

* ``OMP_NUM_THREADS`` is set to 1 before the import unless already set
  (the library otherwise spawns a thread per core on a shared machine).
* The evaluation-key store is process-global and keyed by the secret key's
  tag: keys are always serialized with their tag, so a process holding
  several contexts (tests, a simulation) never ships another context's keys.
* Ciphertext deserialization precomputes CRT tables by default, which
  dominates the aggregator's time; it is disabled once the keys are loaded.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fedeval._extras import require

ofhe = require("openfhe", extra="openfhe", purpose="the OpenFHE CKKS engine (fhe-backend 'openfhe')")

from flwr_fedeval.fhe.backend import (  # noqa: E402
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

__all__ = ["OpenFHEContext", "create", "load"]

_BIN = ofhe.BINARY


def _ser(obj: Any) -> bytes:
    out = ofhe.Serialize(obj, _BIN)
    return out if isinstance(out, bytes) else out.encode("latin-1")


class OpenFHEContext(CKKSContext):
    backend = "openfhe"

    def __init__(self, cc: Any, public_key: Any, secret_key: Any, params: CKKSParams, context_id: bytes) -> None:
        self._cc = cc
        self._pk = public_key
        self._sk = secret_key
        self.params = params
        self.context_id = context_id
        self._steps = [1 << i for i in range(params.slot_count.bit_length() - 1)]
        self._manual = params.scaling == "fixed-manual"

    @property
    def is_private(self) -> bool:
        return self._sk is not None

    # -- arithmetic -------------------------------------------------------
    def _plain(self, values: NDArray[np.float64], level: int = 0) -> Any:
        # Encoded at the ciphertext's level: fewer limbs to transform.
        return self._cc.MakeCKKSPackedPlaintext(values.tolist(), 1, level)

    def _rescale(self, ct: Any) -> Any:
        if self._manual:
            return self._cc.Rescale(ct)
        return ct

    def encrypt(self, values: Iterable[float]) -> Any:
        if self._pk is None:
            raise NoSecretKeyError("this OpenFHE context has no public key")
        return self._cc.Encrypt(self._pk, self._plain(self._pad(values)))

    def decrypt(self, ct: Any) -> np.ndarray:
        if self._sk is None:
            raise NoSecretKeyError("this OpenFHE context holds no secret key (public context)")
        pt = self._cc.Decrypt(ct, self._sk)
        pt.SetLength(self.slot_count)
        return np.asarray(pt.GetRealPackedValue(), dtype=np.float64)

    def add_many(self, cts: Sequence[Any]) -> Any:
        cts = list(cts)
        if not cts:
            raise ValueError("add_many needs at least one ciphertext")
        if len(cts) == 1:
            return cts[0]
        return self._cc.EvalAddMany(cts)

    def multiply(self, a: Any, b: Any) -> Any:
        return self._rescale(self._cc.EvalMult(a, b))

    def multiply_plain(self, ct: Any, values: Sequence[float]) -> Any:
        level = ct.GetLevel() if self._manual else 0
        return self._rescale(self._cc.EvalMult(ct, self._plain(self._pad(values), level)))

    def rotate(self, ct: Any, steps: int) -> Any:
        """Left rotation by ``steps`` as one ``EvalRotate`` per binary digit (the keys are the powers of two)."""
        steps = int(steps) % self.slot_count
        for step in self._steps:
            if steps & step:
                ct = self._cc.EvalRotate(ct, step)
        return ct

    def sum_slots(self, ct: Any) -> Any:
        for step in reversed(self._steps):
            ct = self._cc.EvalAdd(ct, self._cc.EvalRotate(ct, step))
        return ct

    def ciphertext_layout(self, ct: Any) -> tuple[int, int, float, int]:
        """``(slots, level, noise-scale degree, 2)`` (OpenFHE tracks the scale as a degree)."""
        return int(ct.GetSlots()), int(ct.GetLevel()), float(ct.GetNoiseScaleDeg()), 2

    # -- serialization ----------------------------------------------------
    def serialize_ciphertext(self, ct: Any) -> bytes:
        return wrap(KIND_CIPHERTEXT, self.backend, self.context_id, _ser(ct))

    def deserialize_ciphertext(self, data: bytes) -> Any:
        payload = unwrap(data, KIND_CIPHERTEXT, self.backend, self.context_id)
        try:
            ct = ofhe.DeserializeCiphertextString(payload, _BIN)
        except Exception as exc:
            raise SerializationError(f"OpenFHE could not load the ciphertext: {exc}") from None
        if ct is None:
            raise SerializationError("OpenFHE could not load the ciphertext")
        return ct

    def _tag(self) -> str:
        key = self._sk if self._sk is not None else self._pk
        return str(key.GetKeyTag())

    def public_bytes(self, *, rotation_keys: bool = True) -> bytes:
        if not rotation_keys:
            raise ValueError("the OpenFHE backend always ships its rotation keys")
        tag = self._tag()
        blobs = [
            self.params.to_json(),
            _ser(self._cc),
            _ser(self._pk),
            _to_bytes(ofhe.SerializeEvalMultKeyString(_BIN, tag)),
            _to_bytes(ofhe.SerializeEvalAutomorphismKeyString(_BIN, tag)),
        ]
        return wrap(KIND_PUBLIC_CONTEXT, self.backend, self.context_id, pack_blobs(blobs))

    def secret_bytes(self) -> bytes:
        if self._sk is None:
            raise NoSecretKeyError("a public context has no secret key to share")
        blobs = [self.params.to_json(), _ser(self._cc), _ser(self._pk), _ser(self._sk)]
        return wrap(KIND_SECRET_CONTEXT, self.backend, self.context_id, pack_blobs(blobs))


def _to_bytes(x: bytes | str) -> bytes:
    return x if isinstance(x, bytes) else x.encode("latin-1")


def create(params: CKKSParams) -> OpenFHEContext:
    p = ofhe.CCParamsCKKSRNS()
    p.SetMultiplicativeDepth(params.mult_depth)
    p.SetScalingModSize(params.scale_bits)
    p.SetFirstModSize(params.first_mod_bits)
    p.SetRingDim(params.poly_modulus_degree)
    p.SetBatchSize(params.slot_count)
    p.SetSecurityLevel(ofhe.SecurityLevel.HEStd_128_classic)
    if params.scaling == "fixed-manual":
        p.SetScalingTechnique(ofhe.ScalingTechnique.FIXEDMANUAL)
    else:
        p.SetScalingTechnique(ofhe.ScalingTechnique.FLEXIBLEAUTO)  # no extra encryption level
    p.SetKeySwitchTechnique(ofhe.KeySwitchTechnique.HYBRID)
    if params.num_large_digits:
        p.SetNumLargeDigits(params.num_large_digits)
    cc = ofhe.GenCryptoContext(p)
    for feature in (ofhe.PKESchemeFeature.PKE, ofhe.PKESchemeFeature.KEYSWITCH,
                    ofhe.PKESchemeFeature.LEVELEDSHE, ofhe.PKESchemeFeature.ADVANCEDSHE):
        cc.Enable(feature)
    if cc.GetRingDimension() != params.poly_modulus_degree:
        raise ValueError(
            f"OpenFHE chose ring dimension {cc.GetRingDimension()} for these parameters, "
            f"expected {params.poly_modulus_degree}"
        )
    keys = cc.KeyGen()
    cc.EvalMultKeyGen(keys.secretKey)
    ctx = OpenFHEContext(cc, keys.publicKey, keys.secretKey, params, secrets.token_bytes(16))
    cc.EvalRotateKeyGen(keys.secretKey, ctx._steps)
    return ctx


def load(data: bytes) -> OpenFHEContext:
    kind, _, context_id = peek(data)
    payload = unwrap(data, kind, "openfhe", context_id)
    try:
        if kind == KIND_PUBLIC_CONTEXT:
            params_json, cc_b, pk_b, mult_b, rot_b = unpack_blobs(payload, expected=5)
        else:
            params_json, cc_b, pk_b, sk_b = unpack_blobs(payload, expected=4)
        params = CKKSParams.from_json(params_json)
        cc = ofhe.DeserializeCryptoContextString(cc_b, _BIN)
        pk = ofhe.DeserializePublicKeyString(pk_b, _BIN)
        sk = None
        if kind == KIND_PUBLIC_CONTEXT:
            # The key store is process-global and keyed by tag; the key holder's
            # own process already has these keys (same tag = same secret key).
            tag = pk.GetKeyTag()
            if tag not in ofhe.CryptoContext.GetAllEvalMultKeys():
                ofhe.DeserializeEvalMultKeyString(mult_b, _BIN)
            if tag not in ofhe.CryptoContext.GetAllEvalAutomorphismKeys():
                ofhe.DeserializeEvalAutomorphismKeyString(rot_b, _BIN)
        else:
            sk = ofhe.DeserializePrivateKeyString(sk_b, _BIN)
    except SerializationError:
        raise
    except Exception as exc:
        raise SerializationError(f"OpenFHE could not load the context: {exc}") from None
    ofhe.DisablePrecomputeCRTTablesAfterDeserializaton()
    return OpenFHEContext(cc, pk, sk, params, context_id)
