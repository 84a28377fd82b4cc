"""The member party's typed state: one key set's secrets and the round ledgers, loaded once per message.

A member's state lives on its node between messages (Flower's ``context.state``; the deployment
engine starts a process per message, so never in module globals). :class:`MemberState` is that state
as one typed record, in the manner of Flower's ``SecAggPlusState``: the client adapter
(:mod:`flwr_fedeval.clients.xmkckks`) loads it once when a message arrives
(:meth:`MemberState.from_config`) and saves it once before the reply (:meth:`MemberState.to_config`);
every step reads and writes attributes, so a misspelt field is an ``AttributeError`` (a bug), never a
refusal. :class:`MemberLedger` is the part that survives a re-key (the last training round, the
count of clipped values).

No Flower import; the values of :meth:`MemberState.to_config` are the scalar and list types that a
Flower ``ConfigRecord`` holds.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flwr_fedeval.secagg.parameters import KeySetParameters

__all__ = ["MemberLedger", "MemberState", "Refusal"]

ConfigValue = int | float | str | bytes | bool | list[int] | list[float] | list[str] | list[bytes] | list[bool]
_T = TypeVar("_T", bound="_Record")


class Refusal(ValueError):
    """A member will not serve a request (the client adapter replies with an error carrying the reason).

    ``already_contributed`` marks the refusals of the no-retry rules (a second update, signature or
    decryption share where one is allowed): the adapter replies ``ALREADY_CONTRIBUTED`` for them.
    """

    def __init__(self, reason: str, *, already_contributed: bool = False) -> None:
        self.already_contributed = already_contributed
        super().__init__(reason)


class _Record:
    """A dataclass saved as a mapping of ConfigRecord values: one key per field (``_`` spelt ``-``); a
    missing key loads as the field's default."""

    @classmethod
    def from_config(cls: type[_T], values: Mapping[str, Any]) -> _T:
        """The record saved by :meth:`to_config`.

        Raises
        ------
        TypeError
            ``values`` holds a key of no field (a record of another version: a bug, not a refusal).
        """
        hints = typing.get_type_hints(cls)
        names = {f.name.replace("_", "-"): f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise TypeError(f"{cls.__name__}: no field for {unknown}")
        kwargs: dict[str, Any] = {}
        for key, name in names.items():
            if key in values:
                kwargs[name] = _convert(hints[name], values[key])
        return cls(**kwargs)

    def to_config(self) -> dict[str, ConfigValue]:
        """Every field as a ConfigRecord value (``bytes``, ``str``, ``int``, ``float``, ``bool`` or a list of
        one of them)."""
        out: dict[str, ConfigValue] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            out[f.name.replace("_", "-")] = list(value) if isinstance(value, (list, tuple)) else value
        return out


def _convert(hint: Any, value: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        return [item(v) for v in value]
    if hint is bytes:
        return bytes(value)
    return hint(value)


@dataclass
class MemberLedger(_Record):
    """What a member keeps across key sets (never cleared by a re-key).

    ``last_round``: the latest round it trained in (the global models it trained on are in the node's
    privacy ledger, across runs); ``clipped_values`` / ``clipped_last``: the node operator's count of
    values clipped to the signed bound (never sent in clear).
    """

    last_round: int = -1
    clipped_values: int = 0
    clipped_last: int = 0


@dataclass
class MemberState(_Record):
    """One member's state of its current key set (cleared by a new commitment).

    Step 1a (commit): ``key_id``, ``params``, ``seed_a``, ``round`` (of the commitment), ``name`` (its
    roster name), ``secret`` s_i, ``share`` b_i, ``mask_private`` / ``mask_public`` (X25519),
    ``commitment``; ``used_key_ids`` (kept across key sets: it never commits twice for one).
    Step 1b (reveal): the signed parameters (``mask_degree``, ``scale_bits``, ``max_abs_value``,
    ``threshold``, ``limbs``, ``decryption_attempts``, ``bulk``, ``fractional_bits``), ``members`` and
    ``member_commitments`` (aligned), ``transcript`` T; ``confirmed`` once every member's signature over
    T checked. Step 1c (shares): ``shares_round``, ``own_shares`` (its own Shamir shares until step 2),
    ``self_seed`` (until its one use). Step 2 (train): ``sk_share``, ``member_mask_keys``,
    ``key_shares``, ``seed_shares`` (aligned with ``members``), ``sk_round``; ``enc_round``,
    ``enc_model``, ``num_polys``, ``own_c1`` (the digest of its c1). Step 2b: ``signed_round``. Step 3:
    the decryption ledger of the round (``pdec_round``, ``pdec_c1``, ``pdec_model``, ``pdec_active``,
    ``pdec_attempts``) and the members whose seed / mask key it revealed shares of
    (``revealed_seeds`` / ``revealed_keys``, across the key set's rounds).
    """

    key_id: str = ""
    params: str = ""
    seed_a: bytes = b""
    round: int = -1
    name: str = ""
    secret: bytes = b""
    share: bytes = b""
    mask_private: bytes = b""
    mask_public: bytes = b""
    commitment: bytes = b""
    used_key_ids: list[str] = field(default_factory=list)
    mask_degree: int = 0
    scale_bits: int = 0
    max_abs_value: float = 0.0
    threshold: int = 0
    limbs: int = 0
    decryption_attempts: int = 0
    bulk: str = ""
    fractional_bits: int = 0
    members: list[str] = field(default_factory=list)
    member_commitments: list[bytes] = field(default_factory=list)
    transcript: bytes = b""
    confirmed: bool = False
    shares_round: int = -1
    own_shares: list[bytes] = field(default_factory=list)
    self_seed: bytes = b""
    sk_share: bytes = b""
    member_mask_keys: list[bytes] = field(default_factory=list)
    key_shares: list[bytes] = field(default_factory=list)
    seed_shares: list[bytes] = field(default_factory=list)
    sk_round: int = -1
    enc_round: int = -1
    enc_model: bytes = b""
    num_polys: int = 0
    own_c1: str = ""
    signed_round: int = -1
    pdec_round: int = -1
    pdec_c1: str = ""
    pdec_model: bytes = b""
    pdec_active: list[str] = field(default_factory=list)
    pdec_attempts: list[int] = field(default_factory=list)
    revealed_seeds: list[str] = field(default_factory=list)
    revealed_keys: list[str] = field(default_factory=list)

    @property
    def revealed(self) -> bool:
        """Whether step 1b ran for this key set (the members are known)."""
        return bool(self.members)

    def reveal(self, parameters: KeySetParameters, members: list[tuple[str, bytes]], transcript: bytes) -> None:
        """Keep the signed parameters, the members' (name, commitment) pairs and T of step 1b."""
        self.mask_degree, self.scale_bits = parameters.mask_degree, parameters.scale_bits
        self.max_abs_value, self.threshold = parameters.max_abs_value, parameters.threshold
        self.limbs, self.decryption_attempts = parameters.limbs, parameters.decryption_attempts
        self.bulk, self.fractional_bits = parameters.bulk, parameters.fractional_bits
        self.members = [name for name, _ in members]
        self.member_commitments = [h for _, h in members]
        self.transcript = transcript

    def parameters(self) -> KeySetParameters:
        """The signed parameters of step 1b (checked again: what this member signed validated then).

        Raises
        ------
        flwr_fedeval.rlwe.keyset.KeySetError
            The key set has not been revealed to this member.
        """
        return KeySetParameters(self.params, self.key_id, self.seed_a, self.round, len(self.members),
                                self.mask_degree, self.scale_bits, self.max_abs_value, self.threshold, self.limbs,
                                self.decryption_attempts, self.bulk, self.fractional_bits)
