"""Flower glue of :mod:`flwr_fedeval.identity`: which key and roster this node uses.

Deployment (``flower-supernode --node-config ...``): node config
``fedeval-identity-key`` (path to this node's private key; the same file can
be ``--auth-supernode-private-key``) and ``fedeval-roster`` (path to the
roster). The node's roster name is the key file's stem (``node-3.key`` →
``node-3``) and must be listed in the roster with this very key.

Simulation: run config ``fedeval-identity-dir``; node ``partition-id = i`` loads
``<fedeval-identity-dir>/node-<i>.key`` and ``<fedeval-identity-dir>/roster.json``
(``python -m flwr_fedeval.keys create --out DIR --nodes N`` writes them).
Node config wins over the run config.

Server side: :func:`server_roster` reads ``roster.json`` from the run
config's ``fedeval-identity-dir`` (or run config ``fedeval-roster``); the server only
uses it to leave out nodes early and name them — the clients check everything
themselves.

A node without an identity refuses with :class:`IdentityNotConfigured`, a
:class:`~flwr_fedeval.protocol.NotConfigured` refusal that names the keys to set:
the server stops the run at the first such reply: no retry can fix a node's configuration.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flwr.app import Context

from flwr_fedeval import config_keys
from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster, SignedKey, sign_key
from flwr_fedeval.protocol import NotConfigured

__all__ = [
    "CONFIG_HELP",
    "IdentityNotConfigured",
    "check_participants",
    "has_identity",
    "serve_join",
    "key_set_floor",
    "mask_degree_floor",
    "node_identity",
    "server_roster",
    "signed_key_record",
    "signed_key_from_record",
]

KEY_CONFIG = "fedeval-identity-key"
ROSTER_CONFIG = config_keys.ROSTER
DIR_CONFIG = config_keys.IDENTITY_DIR
#: Node policy: this node's floor on the xMK-CKKS mask-graph degree (:mod:`flwr_fedeval.clients.policy`).
MASK_DEGREE_CONFIG = config_keys.XMK_MASK_DEGREE
#: Node policy: this node's floor on the parties of a key set (:mod:`flwr_fedeval.clients.policy`).
MIN_CLIENTS_CONFIG = config_keys.MIN_CLIENTS

#: What to set, quoted by every "no identity" error.
CONFIG_HELP = (
    f"set node config '{KEY_CONFIG}' (path to this node's private key) and '{ROSTER_CONFIG}' (path to "
    f"the roster), or, in simulation, run config '{DIR_CONFIG}' (a directory with node-<partition-id>.key "
    f"and roster.json; create one with: python -m flwr_fedeval.keys create --out DIR --nodes N)"
)

#: The keys :data:`CONFIG_HELP` names, for :class:`IdentityNotConfigured`.
_HELP_KEYS = ("node config " + KEY_CONFIG, "node config " + ROSTER_CONFIG, "run config " + DIR_CONFIG)


class IdentityNotConfigured(IdentityError, NotConfigured):
    """This node has no usable identity key and roster: a configuration refusal (the run cannot
    succeed until the node's operator sets :data:`CONFIG_HELP`'s keys).

    An :class:`~flwr_fedeval.identity.IdentityError` (as before) and a
    :class:`~flwr_fedeval.protocol.NotConfigured` (reply code ``NOT_CONFIGURED``, ``keys``).
    """

    def __init__(self, reason: str, keys: tuple[str, ...] = _HELP_KEYS) -> None:
        NotConfigured.__init__(self, reason, keys=keys)


_CACHE: dict[tuple[Any, ...], tuple[NodeIdentity, Roster]] = {}
_ROSTER_CACHE: dict[tuple[Any, ...], Roster] = {}
# identities kept per process: one in a deployment (one SuperNode), one per simulated node in a simulation
# (every virtual node of a process would reload its key and the roster on each message otherwise)
_CACHE_SIZE = 256


def _stamp(path: Path) -> tuple[Any, ...]:
    st = path.stat()
    return (str(path), st.st_mtime_ns, st.st_size, st.st_mode)


def _paths(context: Context) -> tuple[Path, Path]:
    node, run = dict(context.node_config), dict(context.run_config)
    if node.get(KEY_CONFIG) or node.get(ROSTER_CONFIG):
        if not (node.get(KEY_CONFIG) and node.get(ROSTER_CONFIG)):
            raise IdentityNotConfigured(f"node config sets only one of '{KEY_CONFIG}' and '{ROSTER_CONFIG}': "
                                        f"{CONFIG_HELP}")
        return Path(str(node[KEY_CONFIG])).expanduser(), Path(str(node[ROSTER_CONFIG])).expanduser()
    directory = str(run.get(DIR_CONFIG, "") or "")
    if not directory:
        raise IdentityNotConfigured(f"this node has no identity key and roster: {CONFIG_HELP}")
    if "partition-id" not in node:
        raise IdentityNotConfigured(f"run config '{DIR_CONFIG}' needs the node config 'partition-id': {CONFIG_HELP}")
    base = Path(directory).expanduser()
    return base / f"node-{int(node['partition-id'])}.key", base / "roster.json"


def node_identity(context: Context) -> tuple[NodeIdentity, Roster]:
    """This node's signing key and the federation's roster (cached per process).

    Raises
    ------
    IdentityNotConfigured
        Nothing configured, files missing, or this node's key not in the roster
        under its name (an ``IdentityError`` and a configuration refusal naming
        the keys to set).
    IdentityError
        A key or roster file that cannot be loaded (e.g. unsafe permissions).
    """
    key_path, roster_path = _paths(context)
    for p in (key_path, roster_path):
        if not p.is_file():
            raise IdentityNotConfigured(f"{p} does not exist: {CONFIG_HELP}")
    stamp = (_stamp(key_path), _stamp(roster_path))
    if stamp not in _CACHE:
        ident = NodeIdentity.load(key_path)
        roster = Roster.load(roster_path)
        if ident.name not in roster:
            raise IdentityNotConfigured(f"this node's name {ident.name!r} (from {key_path.name}) is not in the roster "
                                f"{roster_path}")
        if roster.public_key_bytes(ident.name) != ident.public_key_bytes():
            raise IdentityNotConfigured(f"the roster {roster_path} lists another public key for {ident.name!r} than "
                                f"{key_path}")
        if len(_CACHE) >= _CACHE_SIZE:
            del _CACHE[next(iter(_CACHE))]  # the oldest entry (a changed file's stamp is a new key)
        _CACHE[stamp] = (ident, roster)
    return _CACHE[stamp]


def key_set_floor(context: Context) -> int:
    """This node's floor on the size of a key set it joins (never below 2):
    :func:`flwr_fedeval.clients.policy.key_set_floor` (the node policy's ``fedeval-min-clients``,
    policy file or node config; the run config may only raise it).

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        A policy or run config value that is not an integer >= 2.
    """
    from flwr_fedeval.clients import policy

    return policy.key_set_floor(context)


def mask_degree_floor(context: Context) -> int:
    """This node's floor on the degree of the xMK-CKKS mask graph (0 = it requires the complete graph):
    :func:`flwr_fedeval.clients.policy.mask_degree_floor` (the node policy's
    ``fedeval-xmk-mask-degree``, policy file or node config, default
    :data:`flwr_fedeval.rlwe.masking.DEFAULT_MASK_DEGREE`; the run config may only tighten it).

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        A policy or run config value that is not an integer >= 0.
    """
    from flwr_fedeval.clients import policy

    return policy.mask_degree_floor(context)


def server_roster(run_config: dict[str, Any]) -> Roster | None:
    """The roster the ServerApp uses to leave out unknown nodes early (``None``: not configured)."""
    path = run_config.get(ROSTER_CONFIG) or ""
    if not path and run_config.get(DIR_CONFIG):
        path = os.path.join(str(run_config[DIR_CONFIG]), "roster.json")
    if not path:
        return None
    p = Path(str(path)).expanduser()
    key = _stamp(p) if p.is_file() else None
    if key is None:
        raise IdentityError(f"roster file {p} does not exist: {CONFIG_HELP}")
    if key not in _ROSTER_CACHE:
        _ROSTER_CACHE.clear()
        _ROSTER_CACHE[key] = Roster.load(p)
    return _ROSTER_CACHE[key]


def signed_key_record(identity: NodeIdentity, *, protocol: str, session: str, round: int, role: str,
                      key: bytes, prefix: str = "") -> dict[str, Any]:
    """``{prefix+"signer": name, prefix+"signature": sig}`` for a ConfigRecord next to the key."""
    sig = sign_key(identity, protocol=protocol, session=session, round=round, role=role, key=key)
    return {f"{prefix}signer": identity.name, f"{prefix}signature": sig}


def signed_key_from_record(record: Any, key: bytes, *, prefix: str = "") -> SignedKey:
    """The :class:`SignedKey` of ``key`` from a record written by :func:`signed_key_record`.

    Raises
    ------
    IdentityError
        Signer or signature missing or of the wrong type.
    """
    try:
        signer, sig = record[f"{prefix}signer"], record[f"{prefix}signature"]
    except KeyError as exc:
        raise IdentityError(f"relayed key has no {exc.args[0]!r} (unsigned key refused)") from None
    if not isinstance(signer, str) or not isinstance(sig, bytes):
        raise IdentityError("relayed key: signer must be a string and signature bytes")
    return SignedKey(signer, bytes(key), sig)


# --- who takes part in a plaintext or DP evaluation ------------------------------------
def has_identity(context: Context) -> bool:
    """Whether this node is configured with a roster identity (node config ``fedeval-identity-key``
    or ``fedeval-roster``, or, in simulation, run config ``fedeval-identity-dir``)."""
    node, run = dict(context.node_config), dict(context.run_config)
    return bool(node.get(KEY_CONFIG) or node.get(ROSTER_CONFIG) or run.get(DIR_CONFIG))


def serve_join(request: Any, context: Context, state_key: str) -> Any:
    """The join step of the plaintext and DP phases: sign this node's joining of ``request.session``
    (:func:`flwr_fedeval.protocol.auc.sign_join`) and remember the session under ``state_key``; a
    node without a roster identity replies unsigned.

    Raises
    ------
    IdentityError
        An identity is configured but cannot be loaded.
    """
    from flwr.app import ConfigRecord

    from flwr_fedeval.protocol import auc

    if not has_identity(context):
        return auc.JoinReply()
    ident, _ = node_identity(context)
    context.state[state_key] = ConfigRecord({"session": request.session})
    return auc.sign_join(ident, request.session)


def check_participants(context: Context, listed: Any, state_key: str, what: str) -> int | None:
    """Check the signed participant list of an evaluation request; this node's index in it.

    ▲ the list is present (a node with a roster identity refuses an evaluation whose members did
    not sign); ▲ its session is the one this node joined (used once); ▲ every member's join
    signature verifies against the roster, this node is listed, and the list has at least the
    node's floor (:func:`flwr_fedeval.clients.policy.min_clients`). A node without an identity
    has nothing to check against: ``None``.

    Raises
    ------
    flwr_fedeval.protocol.Refused
        Naming the failed check.
    """
    from flwr_fedeval.clients.policy import min_clients
    from flwr_fedeval.protocol import Refused

    if not has_identity(context):
        return None
    ident, roster = node_identity(context)
    if listed is None:
        raise Refused(f"{what}: the request carries no signed participant list; this node (roster member "
                      f"{ident.name!r}) answers only evaluations whose members signed their joining")
    joined = context.state[state_key]["session"] if state_key in context.state else None
    if joined != listed.session:
        raise Refused(f"{what}: the participant list is for session {listed.session!r}, not the one this node "
                      "joined (or it was used already)")
    del context.state[state_key]
    try:
        verified: int | None = listed.verify(roster, own=ident.name, floor=min_clients(context))
        return verified
    except IdentityError as exc:
        raise Refused(f"{what}: {exc}") from None
