"""A phase's X25519 key pair in the node's state, bound to the phase's session id.

The FHE AUC phase and SecSV each give every node a fresh X25519 key pair per
session (:mod:`flwr_fedeval.keyshare`, RFC 7748) at their first step, kept in
``context.state`` (a ``ConfigRecord``: ``session``, ``private``, ``public``) so
that later steps of the same session (each a new ClientApp process on the
deployment engine) can open what was sealed to the node. A request of another
session is refused: a key pair never serves two sessions.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context

from flwr_fedeval import keyshare
from flwr_fedeval.protocol import Refused, config_field, config_record

__all__ = ["load_session_keypair", "new_session_keypair"]


def new_session_keypair(context: Context, state_key: str, session: str) -> keyshare.KeyPair:
    """Draw a fresh X25519 key pair (CSPRNG) for ``session`` and keep it under ``state_key``."""
    kp = keyshare.generate_keypair()
    context.state[state_key] = ConfigRecord({"session": session, "private": kp.private, "public": kp.public})
    return kp


def load_session_keypair(context: Context, state_key: str, session: str, *, missing: str) -> keyshare.KeyPair:
    """The key pair kept under ``state_key`` for ``session``.

    Raises
    ------
    flwr_fedeval.protocol.Refused
        ``missing`` if the node has none (its first step did not run here), or if it
        belongs to another session.
    """
    if state_key not in context.state:
        raise Refused(missing)
    rec = config_record(context.state, state_key)
    if rec.get("session") != session:
        raise Refused("session id does not match this node's key pair for the phase")
    return keyshare.KeyPair(private=config_field(rec, "session", "private", bytes),
                            public=config_field(rec, "session", "public", bytes))
