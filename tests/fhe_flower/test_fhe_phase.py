"""FHE AUC phase over the serializing in-process grid (issue 5, Flower wiring).

The model is the untrained MLP of the main job on the embedded breast-cancer
data (continuous scores); N is small to keep the suite fast. Each phase run
makes a fresh key set (TenSEAL: ~38 MB public context through the grid).
The CKKS engine is ``FHE_BACKEND`` (``tenseal``; ``openfhe`` in the Python
3.10 CI leg, scripts/test-openfhe.sh).
"""

import math

import numpy as np
import pytest
from client_scores import client_scores
from flwr.app import ArrayRecord
from identities import IDENTITY_DIR, node_configs
from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

from flwr_fedeval import keyshare
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.clients import fhe_handlers
from flwr_fedeval.fhe.backend import NoSecretKeyError, default_backend, load_context, pack_blobs, unpack_blobs
from flwr_fedeval.protocol import array_bytes
from flwr_fedeval.strategies.auc_phase import PlaintextAUCPhase
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase, FHEPhaseFailedError, TamperingReportedError
from flwr_fedeval.testing import InProcessGrid

N = 30
BACKEND = default_backend()
THRESHOLD = 0.5


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


@pytest.fixture(scope="module")
def grid():
    # several phases evaluate the same global model on these nodes: their policy allows it
    return InProcessGrid(client_app, 3, {"share-auc-with-server": True, "identity-dir": IDENTITY_DIR},
                         node_configs=node_configs(3, fedeval_evaluations_per_model=20))


@pytest.fixture(scope="module")
def scores(grid, arrays):
    return client_scores(grid, arrays)


@pytest.fixture(scope="module")
def plain_auc(grid, arrays):
    return PlaintextAUCPhase(N).run(grid, arrays).auc


def _assert_no_fhe_state(grid):
    for ctx in grid.contexts.values():
        for key in (fhe_handlers.STATE_KEYPAIR, fhe_handlers.STATE_SECRET, fhe_handlers.STATE_SESSION):
            assert key not in ctx.state


def test_semi_honest_auc_and_threshold_metrics_equal_plaintext_server_holds_no_secret_key(
        grid, arrays, scores, plain_auc):
    phase = FHEAUCPhase(N, backend=BACKEND, protocol="semi-honest", share_auc_with_server=True,
                        metrics_threshold=THRESHOLD)
    result = phase.run(grid, arrays)
    assert abs(result.auc - plain_auc) <= 1e-6
    assert result.contributors == sorted(grid.node_ids) and result.failed == {}
    assert result.label == f"fhe[semi-honest, {BACKEND}]"
    assert result.details["auc_known_to"] == "clients and server"
    assert result.details["reported_by"] == sorted(grid.node_ids)
    # private accuracy/precision/recall/F1 = sklearn on the pooled predictions
    y = np.concatenate([scores[n][0] for n in sorted(scores)])
    pred = (np.concatenate([scores[n][1] for n in sorted(scores)]) >= THRESHOLD).astype(int)
    expected = {
        "accuracy": accuracy_score(y, pred),
        "precision": precision_score(y, pred, zero_division=np.nan),
        "recall": recall_score(y, pred),
        "f1": f1_score(y, pred),
    }
    got = result.details["threshold_metrics"]
    for k, v in expected.items():
        assert abs(got[k] - v) <= 1e-6 or (math.isnan(v) and math.isnan(got[k])), k
    assert result.details["threshold_metrics_verified"] is True
    _assert_no_fhe_state(grid)  # secrets dropped after the phase
    # the server-side phase object holds the public context only
    held = [v for v in vars(phase).values() if isinstance(v, (bytes, bytearray))]
    assert held == [phase.public_context_bytes]
    ctx = load_context(phase.public_context_bytes)
    assert not ctx.is_private
    with pytest.raises(NoSecretKeyError):
        ctx.decrypt(ctx.encrypt([1.0, 2.0]))


def test_malicious_auc_equals_plaintext_and_metrics_are_not_reported(grid, arrays, plain_auc):
    phase = FHEAUCPhase(N, backend=BACKEND, protocol="malicious", n_splits=4, share_auc_with_server=True,
                        metrics_threshold=THRESHOLD)
    result = phase.run(grid, arrays)
    assert abs(result.auc - plain_auc) <= 1e-6
    assert result.label == f"fhe[malicious, {BACKEND}]"
    assert result.details["n_splits"] == 4
    assert result.details["participants"] == ["node-0", "node-1", "node-2"]  # the signed list
    # semi-honest aggregation only: clients keep them (logged as unverified)
    assert result.details["threshold_metrics_verified"] is False
    assert "threshold_metrics" not in result.details


def test_sealed_bundles_are_opaque_to_the_server(arrays):
    seen = {}

    def spy(node, msg, reply):
        if msg.metadata.message_type == "query.fhe_keygen":
            bundles = reply.content["fhe-bundles"]
            seen["bundles"] = {k: array_bytes(bundles, "fhe-bundles", k) for k in bundles}
            seen["public"] = array_bytes(reply.content["fhe-context"], "fhe-context", "public")
        return reply

    grid = InProcessGrid(client_app, 3, {"identity-dir": IDENTITY_DIR}, fault=spy)
    FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True).run(grid, arrays)
    assert len(seen["bundles"]) == 2
    server = keyshare.generate_keypair()
    for sealed in seen["bundles"].values():
        with pytest.raises(keyshare.KeyShareError):
            keyshare.open_bundle(sealed, recipient=server, sender_public=sealed[5:37])
    assert not load_context(seen["public"]).is_private


class _TamperingPhase(FHEAUCPhase):
    """A malicious aggregator: alters the aggregate before sending it to the clients."""

    def __init__(self, how, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.how = how

    def aggregate(self, ctx, messages, config):
        if self.how == "swap-runs":
            blobs = unpack_blobs(super().aggregate(ctx, messages, config), expected=6)
            return pack_blobs([*blobs[3:], *blobs[:3]])
        # "add-constant": a fresh encryption (public key) added to client 0's X of run 0
        blobs = unpack_blobs(messages[0], expected=6)
        ct = ctx.add_many([ctx.deserialize_ciphertext(blobs[0]), ctx.encrypt([0.5] * ctx.slot_count)])
        altered = pack_blobs([ctx.serialize_ciphertext(ct), *blobs[1:]])
        return super().aggregate(ctx, [altered, *messages[1:]], config)


@pytest.mark.parametrize("how", ["swap-runs", "add-constant"])
def test_tampering_aggregator_is_detected_by_every_client(grid, arrays, how):
    phase = _TamperingPhase(how, N, backend=BACKEND, protocol="malicious", share_auc_with_server=True)
    with pytest.raises(TamperingReportedError, match="detected tampering") as info:
        phase.run(grid, arrays)
    assert set(info.value.reports) == set(grid.node_ids)
    # a client that shares its AUC replies one code and reason whichever check failed (no oracle)
    assert all(fhe_handlers.RESULT_REJECTED_REASON in r for r in info.value.reports.values())
    _assert_no_fhe_state(grid)


def test_failing_client_is_named_and_the_phase_fails_without_a_rerun(arrays):
    """A participant whose counts fail the checks at step 4: the phase fails (issue 22: no re-run over
    another subset, which gave the difference of two evaluations), naming the node and its reason."""
    bad = {}

    def corrupt(node, msg, reply):
        if msg.metadata.message_type == "evaluate.fhe_counts" and node == bad["node"]:
            rec = reply.content["fhe-counts"]
            data = bytearray(array_bytes(rec, "fhe-counts", "auc"))
            data[-10] ^= 0xFF
            from flwr_fedeval.protocol import bytes_array

            rec["auc"] = bytes_array(bytes(data))
        return reply

    grid = InProcessGrid(client_app, 3, {"identity-dir": IDENTITY_DIR}, fault=corrupt)
    bad["node"] = grid.node_ids[1]
    with pytest.raises(FHEPhaseFailedError) as info:
        FHEAUCPhase(N, backend=BACKEND, protocol="malicious", share_auc_with_server=True).run(grid, arrays)
    assert info.value.lost == [bad["node"]]
    assert "corrupted ciphertext" in info.value.failed[bad["node"]]
    sent = [t for _, t, _ in grid.log]
    assert sent.count("evaluate.fhe_counts") == 3 and "query.fhe_result" not in sent  # once; nothing decrypted
    with pytest.raises(RuntimeError, match="at least 3"):
        FHEAUCPhase(N, backend=BACKEND, protocol="semi-honest", min_nodes=3).run(
            InProcessGrid(client_app, 2, {"identity-dir": IDENTITY_DIR}), arrays)


def test_without_sharing_only_the_clients_learn_the_auc(arrays):
    grid = InProcessGrid(client_app, 2, {"share-auc-with-server": False, "identity-dir": IDENTITY_DIR})
    result = FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True, metrics_threshold=THRESHOLD).run(grid, arrays)
    assert math.isnan(result.auc)
    assert result.details["auc_known_to"] == "clients"
    assert result.details["decrypted_by"] == sorted(grid.node_ids)
    assert "threshold_metrics" not in result.details


def test_client_defaults_match_job_config_and_bad_fhe_config_is_refused():
    from flwr_fedeval.app.task import library_run_config

    defaults = library_run_config(JobConfig().as_dict())
    for key, value in fhe_handlers.CLIENT_FHE_DEFAULTS.items():
        assert defaults[key] == value
    try:
        import openfhe  # noqa: F401
    except ImportError:  # refused with the Python and the extra it needs
        with pytest.raises(ValueError, match=r"\[openfhe\] extra.*CPython 3\.10"):
            JobConfig.from_run_config({"auc-method": "fhe", "fhe-backend": "openfhe"})
    else:
        assert JobConfig.from_run_config({"auc-method": "fhe", "fhe-backend": "openfhe"}).fhe_backend == "openfhe"
    with pytest.raises(ValueError, match="fhe-splits"):
        JobConfig.from_run_config({"auc-method": "fhe", "fhe-auc": "malicious", "num-decision-points": 1000,
                                   "fhe-splits": 5})
    with pytest.raises(ValueError, match="share-auc-with-server"):
        JobConfig.from_run_config({"share-auc-with-server": 1})
    with pytest.raises(ValueError, match="slots"):
        FHEAUCPhase(2000, protocol="malicious")
