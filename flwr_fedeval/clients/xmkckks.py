"""Client side of xMK-CKKS secure aggregation for any Flower ClientApp.

Add two query handlers and wrap your ``train`` handler with the mod::

    from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod

    app = ClientApp()
    register_xmkckks_handlers(app)          # query.xmk_keygen, query.xmk_pdec

    @app.train(mods=[xmkckks_mod])
    def train(msg, context): ...            # unchanged: replies "arrays" + "metrics"

The mod leaves ordinary (plaintext) training untouched; when the train
message carries an ``"xmk"`` ConfigRecord it turns the reply into one
xMK-CKKS ciphertext of ``[n_i·(w_i − w_global), n_i]`` (Walskaar et al.
2023, Eq. 6; DESIGN.md §3 step 2): neither the update nor ``num-examples``
leaves the client in clear.

The client's secret key s_i lives in ``context.state`` (a ConfigRecord under
``"xmk-state"``), never in module globals (the deployment engine starts a
process per message).
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from flwr_fedeval import rlwe
from flwr_fedeval.clients.keras_adapter import WeightLayout
from flwr_fedeval.messages import (
    QUERY_XMK_KEYGEN,
    QUERY_XMK_PDEC,
    XMK_C1_KEY,
    XMK_CIPHERTEXT_KEY,
    XMK_CONFIG_KEY,
    XMK_SHARE_KEY,
    array_to_bytes,
    bytes_to_array,
)

__all__ = [
    "PartialDecryptionRefused",
    "register_xmkckks_handlers",
    "xmk_keygen",
    "xmk_partial_decrypt",
    "xmkckks_mod",
]

log = logging.getLogger(__name__)

_STATE_KEY = "xmk-state"
_MAX_OWN_C1 = 16  # digests of this client's recent c1 kept for the C1 != c1 check


class PartialDecryptionRefused(RuntimeError):
    """The client refuses to partially decrypt (the reply becomes an error)."""


def _state(context: Context) -> ConfigRecord:
    if _STATE_KEY not in context.state:
        context.state[_STATE_KEY] = ConfigRecord()
    return context.state[_STATE_KEY]


def _params(config: ConfigRecord) -> rlwe.ParameterSet:
    params = rlwe.get_parameter_set(str(config["params"]))
    rlwe.validate_security(params)
    return params


def _min_clients(context: Context) -> int:
    """The client's own floor on contributors (never below 2).

    Taken from the node config ``xmk-min-clients`` (set by the SuperNode's
    operator), else from the run config ``min-nodes``.
    """
    value = context.node_config.get("xmk-min-clients", context.run_config.get("min-nodes", 2))
    return max(2, int(value))


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def xmk_keygen(msg: Message, context: Context) -> Message:
    """Step 1: generate (s_i, b_i = −s_i·a + e_i) for the announced key set.

    Request ``"xmk"`` ConfigRecord: ``params`` (parameter-set name),
    ``seed-a`` (32 bytes), ``key-id``. Reply: ``public-share`` (bytes of b_i).
    The secret stays in ``context.state``. Source: Walskaar et al. 2023, Eq. 1.
    """
    config = msg.content[XMK_CONFIG_KEY]
    params = _params(config)
    a = rlwe.expand_a(params, bytes(config["seed-a"]))
    secret, public = rlwe.keygen(params, a)
    state = _state(context)
    state["key-id"] = str(config["key-id"])
    state["params"] = params.name
    state["secret"] = secret.to_bytes()
    state["own-c1"] = []
    share = public.to_bytes()
    state["own-share"] = _digest(share)
    reply = ConfigRecord({"public-share": share, "key-id": str(config["key-id"])})
    return Message(content=RecordDict({XMK_CONFIG_KEY: reply}), reply_to=msg)


def xmk_partial_decrypt(msg: Message, context: Context) -> Message:
    """Step 3: D_i = s_i·C1 + e*_i with smudging noise (Walskaar et al. 2023, Eq. 7).

    Refuses (raises :class:`PartialDecryptionRefused`, which the Flower
    runtime turns into an error reply; nothing is decrypted) when

    * the request's key set is not the one this client holds a key for,
    * this node is not among the listed contributors,
    * fewer contributors than the client's floor (:func:`_min_clients`),
    * C1 equals this client's own c1 (decrypting it would reveal its update),
    * the listed number of clients disagrees with the contributor list.
    """
    config = msg.content[XMK_CONFIG_KEY]
    state = _state(context)
    if "secret" not in state or state["key-id"] != str(config["key-id"]):
        raise PartialDecryptionRefused(f"no secret key for key set {config['key-id']!r}")
    params = _params(config)
    if params.name != state["params"]:
        raise PartialDecryptionRefused("parameter set differs from the key's")
    contributors = [int(x) for x in config["contributors"]]
    if len(set(contributors)) != len(contributors):
        raise PartialDecryptionRefused("contributor list has duplicates")
    if context.node_id not in contributors:
        raise PartialDecryptionRefused(f"node {context.node_id} is not among the contributors")
    floor = _min_clients(context)
    if len(contributors) < floor:
        raise PartialDecryptionRefused(
            f"{len(contributors)} contributors, this client requires at least {floor}"
        )
    if int(config["num-clients"]) != len(contributors):
        raise PartialDecryptionRefused("num-clients disagrees with the contributor list")
    c1_bytes = array_to_bytes(msg.content[XMK_C1_KEY]["c1"])
    if _digest(c1_bytes) in list(state["own-c1"]):
        raise PartialDecryptionRefused("C1 equals this client's own c1")
    c1 = rlwe.polys_from_bytes(c1_bytes, params)
    secret = rlwe.SecretKey.from_bytes(bytes(state["secret"]), params)
    share = rlwe.partial_decrypt(params, secret, c1, num_clients=len(contributors))
    content = RecordDict({XMK_SHARE_KEY: ArrayRecord({"share": bytes_to_array(share.to_bytes())})})
    return Message(content=content, reply_to=msg)


def _joint_public_key(config: ConfigRecord, state: ConfigRecord, params: rlwe.ParameterSet) -> rlwe.PublicKey:
    """b = Σ b_i computed by the client from the shares the server relays (Eq. 1).

    The client does not take an aggregate key from the server: it checks that
    its own share b_i is among the shares and that there is one per announced
    client, so a server cannot make it encrypt under a key the server alone
    controls.

    Raises
    ------
    ValueError
        If this client's share is missing or the count disagrees with ``num-clients``.
    """
    shares = [bytes(s) for s in config["public-shares"]]
    if len(shares) != int(config["num-clients"]) or len(set(shares)) != len(shares):
        raise ValueError(
            f"{len(shares)} distinct public shares for {int(config['num-clients'])} clients"
        )
    if state["own-share"] not in {_digest(s) for s in shares}:
        raise ValueError("the key set does not contain this client's public share")
    return rlwe.aggregate_public_keys([rlwe.PublicKey.from_bytes(s, params) for s in shares])


def xmkckks_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: encrypt the reply of a ``train`` handler under the joint key.

    Active only when the message carries the ``"xmk"`` ConfigRecord (the
    secure-aggregation strategy sets it); otherwise the handler's reply
    passes through unchanged. The wrapped handler must reply with
    ``"arrays"`` (new weights, same layout as the received ones) and a
    ``"metrics"`` MetricRecord with ``"num-examples"``.

    The reply carries the ciphertext of ``[n_i·(w_i − w), n_i]`` (float64,
    fixed point with Δ = 2^scale-bits) under ``"xmk-ciphertext"`` and the
    metrics without ``num-examples``.

    Raises
    ------
    ValueError
        If the key set is unknown or the handler's reply lacks the fields.
    flwr_fedeval.rlwe.EncodingRangeError
        If a value exceeds the server's ``max-abs-value`` bound.
    """
    if msg.metadata.message_type != "train" or XMK_CONFIG_KEY not in msg.content:
        return call_next(msg, context)
    config = msg.content[XMK_CONFIG_KEY]
    state = _state(context)
    if "secret" not in state or state["key-id"] != str(config["key-id"]):
        raise ValueError(f"train request for key set {config['key-id']!r}, but no key for it")
    params = _params(config)
    global_arrays = msg.content["arrays"].to_numpy_ndarrays()

    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    try:
        new_arrays = reply.content["arrays"].to_numpy_ndarrays()
        metrics = reply.content["metrics"]
        num_examples = int(metrics["num-examples"])
    except KeyError as exc:
        raise ValueError(f"train reply lacks {exc} (needs 'arrays' and metrics 'num-examples')") from exc
    if num_examples < 1:
        raise ValueError(f"num-examples must be >= 1, got {num_examples}")
    layout = WeightLayout.of(global_arrays)
    update = layout.flatten(new_arrays) - layout.flatten(global_arrays)
    vector = np.append(num_examples * update, float(num_examples))
    max_abs = float(config["max-abs-value"])
    if np.max(np.abs(vector)) > max_abs:
        raise rlwe.EncodingRangeError(
            f"|n_i·Δw| reaches {np.max(np.abs(vector)):.4g}, above the agreed bound "
            f"max-abs-value={max_abs:.4g}; raise it on the server"
        )
    a = rlwe.expand_a(params, bytes(config["seed-a"]))
    public_key = _joint_public_key(config, state, params)
    ct = rlwe.encrypt_vector(
        params,
        public_key,
        a,
        vector,
        scale_bits=int(config["scale-bits"]),
        num_clients=int(config["num-clients"]),
    )
    own = list(state["own-c1"])[-(_MAX_OWN_C1 - 1) :]
    state["own-c1"] = own + [_digest(rlwe.polys_to_bytes(params, ct.c1))]
    clear_metrics = MetricRecord({k: v for k, v in metrics.items() if k != "num-examples"})
    content = RecordDict(
        {
            XMK_CIPHERTEXT_KEY: ArrayRecord({"ciphertext": bytes_to_array(ct.to_bytes())}),
            "metrics": clear_metrics,
        }
    )
    return Message(content=content, reply_to=msg)


def register_xmkckks_handlers(app) -> None:
    """Register :func:`xmk_keygen` and :func:`xmk_partial_decrypt` on ``app``."""
    app.query(QUERY_XMK_KEYGEN.split(".", 1)[1])(xmk_keygen)
    app.query(QUERY_XMK_PDEC.split(".", 1)[1])(xmk_partial_decrypt)
