"""The SecSV phase over Flower messages (serializing in-process grid, numpy clients, no TensorFlow).

Three data clients train a logistic regression with Flower's FedAvg for two
rounds; a fourth node is the auxiliary server A. The FSVs of the phase must
equal the plaintext FSVs of the same recorded local models.
"""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from identities import IDENTITY_DIR

from flwr_fedeval.clients.shapley_handlers import (
    linear_model_matrix,
    recorded_models,
    register_shapley_handlers,
    shapley_record_mod,
)
from flwr_fedeval.shapley.fsv import federated_shapley
from flwr_fedeval.shapley.secsv import quantize_weights
from flwr_fedeval.strategies.shapley_phase import (
    NodeSubsetGrid,
    SecSVPhase,
    ShapleyPhaseError,
    discover_roles,
)
from flwr_fedeval.testing import InProcessGrid

D = 5
W_TRUE = np.array([2.0, -1.5, 1.0, 0.5, -2.0])


def client_data(pid: int):
    """Client ``pid``'s own synthetic (train, test) split; sizes differ per client."""
    r = np.random.default_rng(100 + pid)
    n_train, n_test = 80 + 40 * pid, 30 + 10 * pid
    X = r.uniform(0, 1, (n_train + n_test, D))
    y = ((X - 0.5) @ W_TRUE + r.normal(scale=0.6 + 0.4 * pid, size=len(X)) > 0).astype(np.int64)
    return X[:n_train], y[:n_train], X[n_train:], y[n_train:]


app = ClientApp()


@app.train(mods=[shapley_record_mod])
def train(msg: Message, context: Context) -> Message:
    kernel, bias = msg.content["arrays"].to_numpy_ndarrays()
    X, y, _, _ = client_data(int(context.node_config["partition-id"]))
    w, b = kernel[:, 0].astype(np.float64), float(bias[0])
    for _ in range(20):                                 # full-batch gradient descent
        p = 1 / (1 + np.exp(-(X @ w + b)))
        w -= 1.0 * X.T @ (p - y) / len(y)
        b -= 1.0 * float(np.mean(p - y))
    arrays = ArrayRecord([w[:, None].astype(np.float32), np.array([b], dtype=np.float32)])
    metrics = MetricRecord({"num-examples": len(y)})
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


register_shapley_handlers(app, test_set=lambda c: client_data(int(c.node_config["partition-id"]))[2:])


TRUST = {"fedeval-secsv-trust-principal": True}   # every node accepts an honest-but-curious P


def make_grid(fault=None, trust=TRUST):
    configs = [{"partition-id": i, "num-partitions": 3, **trust} for i in range(3)] + [
        {"fedeval-role": "shapley-aux", "partition-id": 3, **trust}]      # partition-id 3: its key node-3.key
    return InProcessGrid(app, 4, {"fedeval-identity-dir": IDENTITY_DIR}, node_configs=configs, fault=fault)


def train_two_rounds(grid):
    roles = discover_roles(grid)
    aux = [n for n, r in roles.items() if r == "shapley-aux"]
    assert len(aux) == 1 and sum(r == "client" for r in roles.values()) == 3
    init = ArrayRecord([np.zeros((D, 1), np.float32), np.zeros(1, np.float32)])
    FedAvg(fraction_evaluate=0.0, min_available_nodes=3, min_train_nodes=3).start(
        grid=NodeSubsetGrid(grid, aux), initial_arrays=init, num_rounds=2)
    return aux[0]


def plaintext_reference(grid, aux, frac_bits=None):
    """Plaintext FSVs of the recorded models; with ``frac_bits``, of the fixed-point
    models and features the secure protocol computes on (θ and x rounded to 2^-f)."""
    q = (lambda a: np.rint(a * 2.0**frac_bits) / 2.0**frac_bits) if frac_bits else (lambda a: a)
    clients = sorted(n for n in grid.node_ids if n != aux)
    models = {n: {t: q(m) for t, m in recorded_models(grid.contexts[n]).items()} for n in clients}
    rounds = [{n: models[n][t] for n in clients} for t in (1, 2)]
    sizes = {n: len(client_data(grid.contexts[n].node_config["partition-id"])[1]) for n in clients}
    w = quantize_weights(sizes, bits=8)
    test = [client_data(grid.contexts[n].node_config["partition-id"]) for n in clients]
    X = q(np.vstack([t[2] for t in test]))
    y = np.concatenate([t[3] for t in test])
    return federated_shapley(rounds, w, X, y, n_classes=2), clients, w


@pytest.fixture
def trained():
    """A new run per test: the auxiliary server zero-tests each (round, coalition, sample) of a run's
    models once (its node ledger), so a second SecSV phase over one run's models is refused."""
    grid = make_grid()
    aux = train_two_rounds(grid)
    return grid, aux


@pytest.mark.parametrize("sample_skip", [True, False])
def test_phase_fsv_equals_plaintext_fsv(trained, sample_skip):
    grid, aux = trained
    ref, clients, w = plaintext_reference(grid, aux, frac_bits=10)   # what the protocol computes on
    res = SecSVPhase(sample_skip=sample_skip).run(grid)
    assert res.clients == clients and res.aux_node == aux and res.weights == w
    got = np.array([res.fsv[n] for n in clients])
    assert np.abs(got - ref.fsv).max() < 1e-3
    for u_ref, u_got in zip(ref.utilities, res.utilities):   # every coalition, exactly
        assert {tuple(sorted(S)): v for S, v in u_ref.items()} == pytest.approx(u_got, abs=1e-12)
    # Against the float models: only samples within ~2^-10·d of the decision boundary can flip.
    ref_float, _, _ = plaintext_reference(grid, aux)
    assert np.abs(got - ref_float.fsv).max() < 0.01
    # efficiency: Σ FSV = v(I^T) − 1/2
    assert sum(res.fsv.values()) == pytest.approx(res.utilities[-1][tuple(clients)] - 0.5, abs=1e-12)
    assert (res.stats["skipped_samples"] > 0) == sample_skip
    assert res.stats["bytes_sent"] > 0 and res.stats["bytes_received"] > 0


def test_auxiliary_server_never_trains_and_never_gets_a_secret_key(trained):
    grid, aux = trained
    SecSVPhase(sample_skip=True).run(grid)
    types = [t for n, t, ok in grid.log if n == aux]
    assert "train" not in types
    assert "query.shapley_aux_setup" in types and "query.shapley_keygen" not in types
    assert "shapley.secret" not in grid.contexts[aux].state


def test_failing_helper_is_replaced_and_nothing_changes(trained):
    grid, aux = trained
    ref, clients, _ = plaintext_reference(grid, aux, frac_bits=10)
    bad = clients[0]
    original = grid.fault

    def drop_helper(node, msg, reply):
        if node == bad and msg.metadata.message_type == "query.shapley_helper":
            return None
        return reply

    grid.fault = drop_helper
    try:
        res = SecSVPhase(sample_skip=True).run(grid)
    finally:
        grid.fault = original
    assert res.stats["helper_replacements"] > 0
    assert np.abs(np.array([res.fsv[n] for n in clients]) - ref.fsv).max() < 1e-3


def test_auxiliary_server_failure_aborts_with_its_name(trained):
    grid, aux = trained

    def drop_aux(node, msg, reply):
        return None if msg.metadata.message_type == "query.shapley_aux_eval" else reply

    original = grid.fault
    grid.fault = drop_aux
    try:
        with pytest.raises(ShapleyPhaseError) as info:
            SecSVPhase().run(grid)
    finally:
        grid.fault = original
    assert set(info.value.failed) == {aux} and "aux products" in info.value.step


def test_clients_refuse_models_above_the_public_bound(trained):
    grid, _ = trained
    with pytest.raises(ShapleyPhaseError) as info:
        SecSVPhase(model_bound=1e-3).run(grid)
    assert info.value.step == "share"       # before any model is encrypted
    assert all("model_bound" in why and "round 1" in why for why in info.value.failed.values())


def test_clients_refuse_features_above_the_public_bound(trained):
    grid, _ = trained
    with pytest.raises(ShapleyPhaseError) as info:
        SecSVPhase(feature_bound=0.5).run(grid)
    assert info.value.step == "share" and all("feature_bound" in why for why in info.value.failed.values())


def test_phase_needs_an_auxiliary_server():
    grid = InProcessGrid(app, 3, {})
    with pytest.raises(ShapleyPhaseError, match="shapley-aux"):
        SecSVPhase().run(grid)


def test_linear_model_matrix_accepts_dense_layers_only():
    theta = linear_model_matrix([np.ones((4, 1)), np.array([0.5])])
    np.testing.assert_array_equal(theta, [[0, 0, 0, 0, 0], [1, 1, 1, 1, 0.5]])
    soft = linear_model_matrix([np.arange(8.0).reshape(4, 2), np.array([1.0, 2.0])])
    assert soft.shape == (2, 5) and soft[1, -1] == 2.0
    with pytest.raises(ValueError, match="linear classifier"):
        linear_model_matrix([np.ones((4, 8)), np.ones(8), np.ones((8, 2)), np.ones(2)])
    with pytest.raises(ValueError, match="NaN"):
        linear_model_matrix([np.full((4, 1), np.nan), np.zeros(1)])


def _ask(grid, node, message_type, request):
    msg = Message(content=RecordDict({"shapley": ConfigRecord(request)}), dst_node_id=node,
                  message_type=message_type)
    (reply,) = grid.send_and_receive([msg])
    return reply


def test_nodes_refuse_other_sessions_and_other_roles(trained):
    grid, aux = trained
    SecSVPhase().run(grid)                                   # leaves a session at every node
    client = next(n for n in grid.node_ids if n != aux)
    reply = _ask(grid, client, "query.shapley_models", {"session": "not-this-one", "round": 1})
    assert reply.has_error() and "session" in reply.error.reason
    reply = _ask(grid, aux, "query.shapley_helper", {"session": "x"})
    assert reply.has_error() and "not a data client" in reply.error.reason
    reply = _ask(grid, client, "query.shapley_aux_eval", {"session": "x"})
    assert reply.has_error() and "not the auxiliary server" in reply.error.reason


def test_auxiliary_server_refuses_a_context_with_other_ckks_parameters(trained):
    from flwr.app import ArrayRecord as AR

    from flwr_fedeval.fhe.backend import CKKSParams, create_context
    from flwr_fedeval.protocol import bytes_array
    from flwr_fedeval.shapley.secsv import SecSVParams

    grid, aux = trained
    SecSVPhase().run(grid)                                   # leaves a session at every node
    session = grid.contexts[aux].state["shapley.keypair"]["session"]
    weak = create_context(params=CKKSParams(coeff_mod_bit_sizes=(60, 40, 40, 60), scale_bits=40))
    msg = Message(content=RecordDict({
        "shapley": ConfigRecord({"session": session, "order": [],
                                 **{k.replace("_", "-"): v for k, v in SecSVParams.for_bounds(
                                     n_features=D, max_clients=3).to_config().items()}}),
        "shapley-context": AR({"public": bytes_array(weak.public_bytes(rotation_keys=False))}),
    }), dst_node_id=aux, message_type="query.shapley_aux_setup")
    (reply,) = grid.send_and_receive([msg])
    assert reply.has_error() and "not the Shapley set" in reply.error.reason
