"""The public parameters of xMK secure aggregation: one signed type per key set, one settings type per run.

:class:`KeySetParameters` is what every member of a key set signs: its canonical bytes
(:meth:`KeySetParameters.to_bytes`, :func:`flwr_fedeval.rlwe.keyset.transcript_parameters`) and the
members' commitments make the transcript T (:meth:`KeySetParameters.transcript`). It is checked once,
when it is built, by the server (from its settings) and by every member (from the reveal request):
a member refuses the key set whose parameters do not validate.

:class:`ProtocolParameters` is what the server operator chooses (``XMKFedAvg`` / ``SecureAggregation``
take these keywords); :meth:`ProtocolParameters.key_set_parameters` derives the signed parameters of a
key set of N members from them (the threshold, the scale and the limb count that the noise budget
allows for N, the KAHE parameter set of N).

No Flower import: the protocol parties (:mod:`flwr_fedeval.secagg.member`,
:mod:`flwr_fedeval.secagg.server`) are below Flower.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import capsule, compact, keyset, masking
from flwr_fedeval.rlwe import threshold as shamir
from flwr_fedeval.rlwe.kahe import KaheError, KaheParameters, kahe_parameters
from flwr_fedeval.rlwe.keyset import KeySetError

__all__ = ["BULK_MODES", "REKEY_CHOICES", "KeySetParameters", "ProtocolParameters", "protocol_keywords"]

#: ``"kahe"``: the update under KAHE, only its key under xMK-CKKS; ``"ckks"``: every weight under xMK-CKKS.
BULK_MODES = ("kahe", "ckks")
#: New keys every round, or a key set reused while the same clients take part.
REKEY_CHOICES = ("every-round", "per-client-set")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class KeySetParameters:
    """The public parameters of one key set of N members, as T binds them (every field is signed).

    Parameters
    ----------
    parameter_set : str
        Name of an :data:`flwr_fedeval.rlwe.PARAMETER_SETS` entry (128-bit, HE-Standard).
    key_id : str
        H(parameter set, seed-a) (:func:`flwr_fedeval.rlwe.keyset.key_set_id`).
    seed_a : bytes
        32 bytes: the seed of the public polynomial a (Eq. 1), drawn by the server.
    round : int
        The round the commitments were signed for (the key set's first round).
    num_members : int
        N, the members of the key set (T binds their names and commitments, :meth:`transcript`).
    mask_degree : int
        k of the pairwise-mask graph (0 = complete graph).
    scale_bits : int
        log2 Δ of the xMK-CKKS encoding (the capsule's in KAHE mode).
    max_abs_value : float
        B, the bound every encrypted value ``|n_i·Δw|`` is clipped to.
    threshold : int
        t of the t-out-of-N decryption.
    limbs : int
        L', the RNS limbs of c0 and of the decryption shares on the wire.
    decryption_attempts : int
        a, the most active sets of the partial decryption per round.
    bulk : {"kahe", "ckks"}
        Where the update goes: under KAHE (its key in a capsule) or every weight under xMK-CKKS.
    fractional_bits : int
        F of the KAHE fixed point (KAHE mode, >= 1); 0 in CKKS mode.

    Attributes
    ----------
    params : flwr_fedeval.rlwe.ParameterSet
        The parameter set itself.
    kahe : flwr_fedeval.rlwe.kahe.KaheParameters or None
        KAHE mode: :func:`flwr_fedeval.rlwe.kahe.kahe_parameters` of (N, B, F), derived here (never
        taken from the server); ``None`` in CKKS mode.

    Raises
    ------
    flwr_fedeval.rlwe.keyset.KeySetError
        At construction, the one check of a key set's parameters: an unknown or weaker than 128-bit
        parameter set, N < 2, a seed-a that is not 32 bytes, a key-set id other than H(params, seed-a),
        a mask degree that is not an integer >= 0, B not finite and > 0, t outside [floor(N/2) + 1, N]
        (two disjoint survivor groups must not both decrypt), a scale beyond the noise budget for N and
        the encoding's bound, L' outside [the fewest that budget allows after modulus switching, L],
        a outside [1, :data:`flwr_fedeval.rlwe.params.MAX_DECRYPTION_ATTEMPTS`] (the smudging noise is
        sized for that many), a bulk mode outside :data:`BULK_MODES`, F < 1 in KAHE mode or F != 0 in
        CKKS mode, or no KAHE parameter set for (N, B, F).
    """

    parameter_set: str
    key_id: str
    seed_a: bytes
    round: int
    num_members: int
    mask_degree: int
    scale_bits: int
    max_abs_value: float
    threshold: int
    limbs: int
    decryption_attempts: int
    bulk: str
    fractional_bits: int
    params: rlwe.ParameterSet = field(init=False, repr=False, compare=False)
    kahe: KaheParameters | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            params = rlwe.get_parameter_set(self.parameter_set)
            rlwe.validate_security(params)
        except ValueError as exc:
            raise KeySetError(f"parameter set: {exc}") from None
        object.__setattr__(self, "params", params)
        for name in ("round", "num_members", "mask_degree", "scale_bits", "threshold", "limbs",
                     "decryption_attempts", "fractional_bits"):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 0:
                raise KeySetError(f"{name} must be an integer >= 0, got {getattr(self, name)!r}")
        n = self.num_members
        if n < 2:
            raise KeySetError(f"a key set has at least 2 members, got {n}")
        if len(self.seed_a) != 32 or keyset.key_set_id(params, self.seed_a) != self.key_id:
            raise KeySetError(f"key-id {self.key_id!r} is not H(params, seed-a) of a 32-byte seed-a")
        if not (math.isfinite(self.max_abs_value) and self.max_abs_value > 0):
            raise KeySetError(f"the value bound B must be a finite number > 0, got {self.max_abs_value!r}")
        low = shamir.min_threshold(n)
        if not low <= self.threshold <= n:
            raise KeySetError(f"threshold t={self.threshold} must be in [{low}, {n}] (t > N/2: two disjoint "
                              f"survivor groups must not both decrypt)")
        if not 1 <= self.decryption_attempts <= rlwe.MAX_DECRYPTION_ATTEMPTS:
            raise KeySetError(f"decryption attempts a={self.decryption_attempts} must be in "
                              f"[1, {rlwe.MAX_DECRYPTION_ATTEMPTS}]: the smudging noise is sized for at most "
                              f"{rlwe.MAX_DECRYPTION_ATTEMPTS} active sets per round")
        if self.bulk not in BULK_MODES:
            raise KeySetError(f"bulk must be one of {BULK_MODES}, got {self.bulk!r}")
        kahe_params = None
        if self.bulk == "kahe":
            if self.fractional_bits < 1:
                raise KeySetError(f"KAHE mode needs fractional bits F >= 1, got {self.fractional_bits}")
            try:
                kahe_params = kahe_parameters(n, bound=self.max_abs_value, fractional_bits=self.fractional_bits)
            except KaheError as exc:
                raise KeySetError(f"no KAHE parameter set: {exc}") from None
        elif self.fractional_bits != 0:
            raise KeySetError(f"CKKS mode has no KAHE fractional bits, got F={self.fractional_bits}")
        object.__setattr__(self, "kahe", kahe_params)
        bound = self.encoding_bound
        best = rlwe.max_scale_bits(params, num_clients=n, max_abs_value=bound)
        if self.scale_bits > best:
            raise KeySetError(f"scale 2^{self.scale_bits} exceeds the noise budget for {n} clients and bound "
                              f"{bound:.4g} (at most 2^{best})")
        fewest = compact.compact_limbs(params, num_clients=n, scale_bits=self.scale_bits, max_abs_value=bound)
        if not fewest <= self.limbs <= params.limbs:
            raise KeySetError(f"limb count L'={self.limbs} must be in [{fewest}, {params.limbs}]: fewer limbs than "
                              f"{fewest} do not hold the sum of {n} updates at scale 2^{self.scale_bits} and "
                              f"bound {bound:.4g} after modulus switching")

    @property
    def encoding_bound(self) -> float:
        """The value bound of the xMK-CKKS encoding: the capsule's (the cut of the KAHE key) in KAHE mode,
        B in CKKS mode."""
        return self.max_abs_value if self.kahe is None else capsule.capsule_bound(self.kahe)

    def to_bytes(self) -> bytes:
        """The canonical bytes T binds (:func:`flwr_fedeval.rlwe.keyset.transcript_parameters`): the
        parameter set, key-set id, seed-a, round, k, log2 Δ, B, t, L', a, bulk mode and the KAHE set's bytes."""
        return keyset.transcript_parameters(
            self.params, key_id=self.key_id, seed_a=self.seed_a, round_=self.round, mask_degree=self.mask_degree,
            scale_bits=self.scale_bits, max_abs_value=self.max_abs_value, threshold=self.threshold,
            limbs=self.limbs, decryption_attempts=self.decryption_attempts, bulk=self.bulk,
            kahe_parameters=self.kahe.to_bytes() if self.kahe is not None else b"")

    def transcript(self, members: Sequence[tuple[str, bytes]]) -> bytes:
        """T over these parameters and the N members' (name, commitment) pairs
        (:func:`flwr_fedeval.rlwe.keyset.transcript_of`).

        Raises
        ------
        flwr_fedeval.rlwe.keyset.KeySetError
            ``members`` are not N pairs.
        """
        if len(members) != self.num_members:
            raise KeySetError(f"{len(members)} members, the parameters are for {self.num_members}")
        return keyset.transcript_of(self.to_bytes(), members)


@dataclass(frozen=True)
class ProtocolParameters:
    """The server operator's settings of xMK secure aggregation (``XMKFedAvg`` and ``SecureAggregation``
    take them as keywords, with these defaults).

    Parameters
    ----------
    parameter_set : str, default="xmk-n4096-q109"
        Name of an :data:`flwr_fedeval.rlwe.PARAMETER_SETS` entry (all 128-bit secure under the
        HomomorphicEncryption.org standard).
    max_abs_value : float, default=2**16
        Public bound B on every encrypted value ``|n_i·Δw|`` and ``n_i``, signed in T: clients clip to
        [-B, B] (as Flower's SecAgg+ ``clipping_range``) and never refuse.
    scale_bits : int, optional
        log2 Δ of the xMK-CKKS encoding; default the largest the noise budget allows
        (:func:`flwr_fedeval.rlwe.max_scale_bits`).
    rekey : {"every-round", "per-client-set"}, default="every-round"
        New keys every round, or a key set reused while the same clients take part.
    step_timeout : float, default=600
        Seconds to wait for the replies of key generation and partial decryption.
    max_attempts : int, default=3
        Key setups per round (before the train request; nothing is retried after it).
    mask_degree : int, default=4
        k of the pairwise-mask graph (:func:`flwr_fedeval.rlwe.masking.mask_neighbours`); 0 = complete graph.
    threshold : int, optional
        t of the t-out-of-N decryption; default floor(N/2) + 1.
    limbs : int, optional
        L' of c0 and the decryption shares on the wire; default (and floor) the fewest the noise budget
        allows (:func:`flwr_fedeval.rlwe.compact.compact_limbs`).
    decryption_attempts : int, default=2
        a, the most active sets of the partial decryption per round.
    bulk : {"kahe", "ckks"}, default="kahe"
        The update under KAHE and only its key under xMK-CKKS, or every weight under xMK-CKKS.
    fractional_bits : int, default=21
        F of KAHE's fixed point (KAHE mode).

    Raises
    ------
    ValueError
        At construction: an unknown or weaker than 128-bit parameter set, B not a finite number >= 1, a
        ``rekey`` or ``bulk`` outside its choices, ``max_attempts < 1``, a mask degree, threshold, limb
        count, number of decryption attempts or F out of range, or (KAHE mode) no KAHE parameter set
        for B and F.
    """

    parameter_set: str = rlwe.DEFAULT_PARAMETER_SET.name
    max_abs_value: float = 2.0**16
    scale_bits: int | None = None
    rekey: str = "every-round"
    step_timeout: float = 600.0
    max_attempts: int = 3
    mask_degree: int = masking.DEFAULT_MASK_DEGREE
    threshold: int | None = None
    limbs: int | None = None
    decryption_attempts: int = rlwe.MAX_DECRYPTION_ATTEMPTS
    bulk: str = "kahe"
    fractional_bits: int = 21

    def __post_init__(self) -> None:
        rlwe.validate_security(self.params)
        if not (isinstance(self.max_abs_value, (int, float)) and math.isfinite(self.max_abs_value)
                and self.max_abs_value >= 1):
            raise ValueError(f"max_abs_value must be a finite number >= 1, got {self.max_abs_value!r}")
        object.__setattr__(self, "max_abs_value", float(self.max_abs_value))
        if self.rekey not in REKEY_CHOICES:
            raise ValueError(f"rekey must be one of {REKEY_CHOICES}, got {self.rekey!r}")
        if not _is_int(self.max_attempts) or self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if not _is_int(self.mask_degree) or self.mask_degree < 0:
            raise ValueError(f"mask_degree must be an integer >= 0 (0 = complete graph), got {self.mask_degree!r}")
        if self.threshold is not None and (not _is_int(self.threshold) or self.threshold < 2):
            raise ValueError(f"threshold must be an integer >= 2 or None (floor(N/2) + 1), got {self.threshold!r}")
        if self.limbs is not None:
            compact.level_parameter_set(self.params, self.limbs)  # ValueError unless 1 <= limbs <= L
        if not _is_int(self.decryption_attempts) or not 1 <= self.decryption_attempts <= rlwe.MAX_DECRYPTION_ATTEMPTS:
            raise ValueError(f"decryption_attempts must be an integer in [1, {rlwe.MAX_DECRYPTION_ATTEMPTS}], "
                             f"got {self.decryption_attempts!r}")
        if self.bulk not in BULK_MODES:
            raise ValueError(f"bulk must be one of {BULK_MODES}, got {self.bulk!r}")
        if not _is_int(self.fractional_bits) or self.fractional_bits < 1:
            raise ValueError(f"fractional_bits must be an integer >= 1, got {self.fractional_bits!r}")
        if self.bulk == "kahe":  # KaheError (a ValueError) if none fits
            kahe_parameters(2, bound=self.max_abs_value, fractional_bits=self.fractional_bits)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The keywords, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def pick(cls, values: dict[str, Any]) -> ProtocolParameters:
        """The settings among ``values`` (a constructor's locals): one entry per :meth:`names`."""
        return cls(**{name: values[name] for name in cls.names()})

    @property
    def params(self) -> rlwe.ParameterSet:
        """The parameter set (:func:`flwr_fedeval.rlwe.get_parameter_set`)."""
        return rlwe.get_parameter_set(self.parameter_set)

    def threshold_for(self, num_members: int) -> int:
        """t of a key set of N members: ``threshold`` if set, else floor(N/2) + 1.

        Raises
        ------
        ValueError
            ``threshold`` is set and not in [floor(N/2) + 1, N].
        """
        low = shamir.min_threshold(num_members)
        if self.threshold is None:
            return low
        if not low <= self.threshold <= num_members:
            raise ValueError(f"threshold {self.threshold} is not in [{low}, {num_members}] for {num_members} members")
        return self.threshold

    def kahe_for(self, num_members: int) -> KaheParameters | None:
        """The KAHE parameter set of N members (KAHE mode; ``None`` in CKKS mode)."""
        if self.bulk != "kahe":
            return None
        return kahe_parameters(num_members, bound=self.max_abs_value, fractional_bits=self.fractional_bits)

    def ckks_bound(self, num_members: int) -> float:
        """The value bound of the xMK-CKKS encoding: the capsule's in KAHE mode, B in CKKS mode."""
        params = self.kahe_for(num_members)
        return self.max_abs_value if params is None else capsule.capsule_bound(params)

    def scale_bits_for(self, num_members: int) -> int:
        """log2 Δ of the xMK-CKKS encoding with N contributors, checked against the noise budget.

        Raises
        ------
        flwr_fedeval.rlwe.NoiseBudgetError
            ``scale_bits`` is set and exceeds the budget for N and the encoding's bound.
        """
        bound = self.ckks_bound(num_members)
        best = rlwe.max_scale_bits(self.params, num_clients=num_members, max_abs_value=bound)
        if self.scale_bits is None:
            return best
        if self.scale_bits > best:
            raise rlwe.NoiseBudgetError(f"scale 2^{self.scale_bits} exceeds the noise budget for {num_members} "
                                        f"clients and max |value| {bound} (at most 2^{best})")
        return self.scale_bits

    def limbs_for(self, num_members: int, scale_bits: int) -> int:
        """L' of N members at scale 2^scale_bits: ``limbs``, raised to the fewest the budget allows."""
        fewest = compact.compact_limbs(self.params, num_clients=num_members, scale_bits=scale_bits,
                                       max_abs_value=self.ckks_bound(num_members))
        return fewest if self.limbs is None else max(int(self.limbs), fewest)

    def key_set_parameters(self, num_members: int, *, key_id: str, seed_a: bytes, round_: int) -> KeySetParameters:
        """The signed parameters of a key set of N members from these settings.

        Raises
        ------
        ValueError
            ``threshold`` does not fit N; flwr_fedeval.rlwe.NoiseBudgetError: ``scale_bits`` does not.
        """
        scale_bits = self.scale_bits_for(num_members)
        return KeySetParameters(
            self.parameter_set, key_id, seed_a, round_, num_members, self.mask_degree, scale_bits,
            self.max_abs_value, self.threshold_for(num_members), self.limbs_for(num_members, scale_bits),
            self.decryption_attempts, self.bulk, self.fractional_bits if self.bulk == "kahe" else 0)


_InitT = TypeVar("_InitT", bound=Callable[..., None])


def protocol_keywords(init: _InitT) -> _InitT:
    """Show ``init(self, ..., **protocol)`` with every :class:`ProtocolParameters` keyword and its default in
    place of ``**protocol`` (``help()``, :func:`inspect.signature`): the settings are written once, in
    :class:`ProtocolParameters`, and an unknown keyword is its ``TypeError``."""
    sig = inspect.signature(init)
    kept = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    added = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
             for f in dataclasses.fields(ProtocolParameters)]
    cast(Any, init).__signature__ = sig.replace(parameters=kept + added)  # read by inspect.signature
    return init
