"""A deviating FHE AUC server for the security tests: the honest steps 1–4 of the real phase, then
whatever step-6 ciphertexts a test crafts from the public context (it never holds a secret key).

Each node gets its own identity folder made by ``python -m flwr_fedeval.keys create`` with the
policy a test asks for (``policy_dir``); ``fedeval-evaluations-per-model`` is raised in node config
so that one grid can run several sessions on one global model (each session is a new key set).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from flwr.app import ArrayRecord, Message, RecordDict

from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.fhe.auc import FHEAUCConfig, _load_client_messages
from flwr_fedeval.fhe.auc_malicious import MaliciousAUCConfig
from flwr_fedeval.fhe.backend import default_backend, pack_blobs
from flwr_fedeval.keys import create
from flwr_fedeval.protocol import fhe_auc
from flwr_fedeval.strategies.base import Failures
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase, FHERun
from flwr_fedeval.testing import InProcessGrid

N = 20
BACKEND = default_backend()


def policy_dir(tmp: Path, num_nodes: int = 3, **policy) -> str:
    """A folder of keys, roster and policy files (``fedeval_share_auc=True`` → ``fedeval-share-auc = true``)."""
    create(tmp, [f"node-{i}" for i in range(num_nodes)], policy={k.replace("_", "-"): v for k, v in policy.items()})
    return str(tmp)


def grid_over(identity_dir: str, num_nodes: int = 3, **node_policy) -> InProcessGrid:
    configs = [{"partition-id": i, "num-partitions": num_nodes, "fedeval-evaluations-per-model": 1000,
                **{k.replace("_", "-"): v for k, v in node_policy.items()}} for i in range(num_nodes)]
    return InProcessGrid(client_app, num_nodes, {"identity-dir": identity_dir}, node_configs=configs)


def steps_1_2(phase: FHEAUCPhase, grid) -> FHERun:
    """Steps 1–2 as the honest phase runs them (the key holder signs the participant list)."""
    failed = Failures()
    run = FHERun(secrets.token_hex(16), tuple(sorted(grid.node_ids)))
    keys = phase.collect_public_keys(grid, list(run.nodes), run.session, failed)
    bound = max(sum(v[1] for v in keys.values()), 1)
    config = MaliciousAUCConfig(n_points=N, max_rows=bound, n_splits=phase.n_splits) \
        if phase.protocol == "malicious" else FHEAUCConfig(n_points=N, max_rows=bound)
    return phase._key_holder(grid, run.replace(config=config), keys, failed)


def counts_request(phase: FHEAUCPhase, run: FHERun, node: int, arrays: ArrayRecord, *, protocol: str | None = None):
    """The step-3–4 request of ``node``; ``protocol`` other than the phase's: the server's forgery."""
    params = fhe_auc.EncryptionParams(protocol or phase.protocol, N, run.config.max_rows, phase.n_splits,
                                      secrets.token_bytes(16), -1.0)
    request = fhe_auc.CountsRequest(run.session, params, run.holder_key, phase.thresholds, run.participant_list,
                                    None if node == run.holder else run.bundles[node])
    content = RecordDict({"arrays": arrays})
    for key, record in request.to_record().items():
        content[key] = record
    return Message(content, dst_node_id=node, message_type=fhe_auc.COUNTS.message_type)


def session_counts(phase: FHEAUCPhase, grid, arrays: ArrayRecord) -> tuple[FHERun, dict[int, bytes]]:
    """Steps 1–4 of one new session: the run and every node's encrypted counts."""
    run = steps_1_2(phase, grid)
    replies = grid.send_and_receive([counts_request(phase, run, n, arrays) for n in run.participants])
    counts = {}
    for reply in replies:
        assert not reply.has_error(), reply.error.reason
        counts[reply.metadata.src_node_id] = fhe_auc.CountsReply.from_record(reply.content).auc
    return run, counts


def shifted_solo_auc(run: FHERun, message: bytes, theta: float, c: float = 1.3) -> bytes:
    """Semi-honest step 5 over one client's counts alone, shifted: decrypts to AUC_v − θ.

    ``E(c·num − θ·2c·PN)``, ``E(2c·PN)``, ``E(c·res)`` (the masks at one level, as
    :func:`flwr_fedeval.fhe.auc.aggregate_auc` does), so ``num/den = AUC_v − θ``.
    """
    ctx = run.context
    ((a, b, r),) = _load_client_messages(ctx, [message], 3)
    num = ctx.sum_slots(ctx.multiply(a, b))
    denom = ctx.multiply(ctx.sum_slots(a), ctx.sum_slots(b))
    res = ctx.sum_slots(ctx.multiply(r, b))
    out = [ctx.add_many([ctx.multiply_plain(num, [c]), ctx.multiply_plain(denom, [-2.0 * c * theta])]),
           ctx.multiply_plain(denom, [2.0 * c]), ctx.multiply_plain(res, [c])]
    return pack_blobs([ctx.serialize_ciphertext(x) for x in out])


def offset_counts(run: FHERun, message: bytes, theta: float) -> bytes:
    """One client's counts message with ``θ`` added to every slot of its first ciphertext."""
    ctx = run.context
    (cts,) = _load_client_messages(ctx, [message], len(_blobs(message)))
    cts[0] = ctx.add_many([cts[0], ctx.encrypt([theta] * ctx.slot_count)])
    return pack_blobs([ctx.serialize_ciphertext(x) for x in cts])


def _blobs(message: bytes) -> list[bytes]:
    from flwr_fedeval.fhe.backend import unpack_blobs

    return unpack_blobs(message)


def result_reply(grid, run: FHERun, node: int, result: bytes) -> Message:
    request = fhe_auc.ResultRequest(run.session, result).to_record()
    (reply,) = grid.send_and_receive([Message(request, dst_node_id=node, message_type=fhe_auc.RESULT.message_type)])
    return reply


def reply_bytes(reply: Message) -> tuple:
    """What the server learns from a reply, message ids left out: the error's code and reason, or every
    record's entries (ConfigRecord values, ArrayRecord bytes)."""
    if reply.has_error():
        return ("error", int(reply.error.code), reply.error.reason)
    out = []
    for key, record in sorted(reply.content.items()):
        if isinstance(record, ArrayRecord):
            out.append((key, tuple((k, a.numpy().tobytes()) for k, a in record.items())))
        else:
            out.append((key, tuple(sorted((k, repr(v)) for k, v in record.items()))))
    return tuple(out)
