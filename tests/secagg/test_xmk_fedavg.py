"""xMK-CKKS FedAvg over the serializing in-process grid (numpy-only clients)."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr_fedeval.testing import InProcessGrid

from flwr_fedeval import rlwe
from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.messages import QUERY_XMK_PDEC, XMK_C1_KEY, XMK_CIPHERTEXT_KEY, XMK_CONFIG_KEY, array_to_bytes, bytes_to_array
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg

SHAPES = [(30, 20), (20,), (20, 7), (7,)]  # 1,047 weights: one n=4096 polynomial


def _update(partition_id, round_):
    rng = np.random.default_rng(1000 * partition_id + round_)
    return [rng.uniform(-1, 1, s).astype(np.float32) for s in SHAPES]


def _num_examples(partition_id):
    return 10 + 7 * partition_id


def make_app():
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        w = msg.content["arrays"].to_numpy_ndarrays()
        new = [a + d for a, d in zip(w, _update(pid, rnd))]
        metrics = MetricRecord({"train-loss": float(pid), "num-examples": _num_examples(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


def _initial():
    rng = np.random.default_rng(7)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def _plain_fedavg(weights, partitions, round_):
    """Plaintext weighted FedAvg of the weights the clients actually return."""
    n = np.array([_num_examples(p) for p in partitions], dtype=np.float64)
    client_weights = [_flat([w + d for w, d in zip(weights, _update(p, round_))]) for p in partitions]
    return np.sum([ni * w for ni, w in zip(n, client_weights)], axis=0) / n.sum()


def _flat(arrays):
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


def _run(grid, strategy, rounds=1):
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(_initial()),
        num_rounds=rounds,
        train_config=ConfigRecord({}),
    )


def _strategy(num_nodes, **kw):
    return XMKFedAvg(
        fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4, **kw
    )


@pytest.mark.parametrize("num_nodes", [3, 10])
def test_secure_aggregate_equals_plaintext_weighted_fedavg(num_nodes):
    grid = InProcessGrid(make_app(), num_nodes)
    result = _run(grid, _strategy(num_nodes))
    expected = _plain_fedavg(_initial(), range(num_nodes), 1)
    got = _flat(result.arrays.to_numpy_ndarrays())
    # float32 storage of the new weights limits agreement to float32 rounding
    assert np.max(np.abs(got - expected)) <= 1e-6
    metrics = result.train_metrics_clientapp[1]
    assert metrics["num-examples"] == sum(_num_examples(p) for p in range(num_nodes))


def test_num_examples_never_sent_in_clear():
    sent = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            sent.append(reply)
        return reply

    grid = InProcessGrid(make_app(), 3, fault=spy)
    _run(grid, _strategy(3))
    assert len(sent) == 3
    for reply in sent:
        assert "arrays" not in reply.content
        assert "num-examples" not in reply.content["metrics"]
        assert XMK_CIPHERTEXT_KEY in reply.content


def test_two_rounds_with_per_client_set_rekey_reuses_keys():
    grid = InProcessGrid(make_app(), 3)
    result = _run(grid, _strategy(3, rekey="per-client-set"), rounds=2)
    keygens = [t for _, t, _ in grid.log if t == "query.xmk_keygen"]
    assert len(keygens) == 3  # one key set for both rounds
    w1 = _plain_fedavg(_initial(), range(3), 1)
    shapes_init = _initial()
    offs = np.cumsum([0] + [int(np.prod(s)) for s in SHAPES])
    w1_arrays = [w1[offs[i]:offs[i + 1]].reshape(SHAPES[i]).astype(np.float32) for i in range(len(SHAPES))]
    expected = _plain_fedavg(w1_arrays, range(3), 2)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 2e-6
    assert shapes_init  # initial weights untouched


def test_step_times_record_every_configure_and_aggregate_call():
    strategy = _strategy(3)
    _run(InProcessGrid(make_app(), 3), strategy, rounds=2)
    assert [(t.server_round, t.step) for t in strategy.step_times] == [
        (1, "configure_train"), (1, "aggregate_train"), (2, "configure_train"), (2, "aggregate_train")]
    assert all(t.wall_s > 0 and t.cpu_s >= 0 for t in strategy.step_times)


@pytest.mark.parametrize("step", ["query.xmk_keygen", "train", "query.xmk_pdec"])
def test_dropout_at_each_step_aborts_then_succeeds_without_that_client(step):
    dropped = {}

    def fault(node, msg, reply):
        if node == dropped["node"] and msg.metadata.message_type == step:
            return None  # the node times out
        return reply

    grid = InProcessGrid(make_app(), 4, fault=fault)
    dropped["node"] = grid.node_ids[2]
    strategy = _strategy(4)
    result = _run(grid, strategy)
    assert strategy.aborted_attempts, "the failure must be recorded"
    _, exc = strategy.aborted_attempts[0]
    assert dropped["node"] in exc.failed
    survivors = [p for p in range(4) if p != 2]
    expected = _plain_fedavg(_initial(), survivors, 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


def test_too_many_dropouts_leave_global_model_unchanged():
    def fault(node, msg, reply):
        return None if msg.metadata.message_type == "query.xmk_pdec" and node != first["node"] else reply

    first = {}
    grid = InProcessGrid(make_app(), 3, fault=fault)
    first["node"] = grid.node_ids[0]
    strategy = _strategy(3)
    result = _run(grid, strategy)
    assert strategy.aborted_attempts
    # no round succeeded: the result keeps the initial arrays
    assert np.array_equal(_flat(result.arrays.to_numpy_ndarrays()) if len(result.arrays) else _flat(_initial()), _flat(_initial()))


def test_corrupted_ciphertext_aborts_cleanly_naming_the_node():
    bad = {}

    def fault(node, msg, reply):
        if node == bad["node"] and msg.metadata.message_type == "train" and not bad.get("done"):
            data = bytearray(array_to_bytes(reply.content[XMK_CIPHERTEXT_KEY]["ciphertext"]))
            data = data[: len(data) // 2]  # truncated
            reply.content[XMK_CIPHERTEXT_KEY]["ciphertext"] = bytes_to_array(bytes(data))
            bad["done"] = True
        return reply

    grid = InProcessGrid(make_app(), 3, fault=fault)
    bad["node"] = grid.node_ids[1]
    strategy = _strategy(3)
    result = _run(grid, strategy)
    _, exc = strategy.aborted_attempts[0]
    assert exc.step == "encrypted training"
    assert list(exc.failed) == [bad["node"]]
    assert "malformed ciphertext" in exc.failed[bad["node"]]
    assert str(bad["node"]) in str(exc)
    expected = _plain_fedavg(_initial(), [0, 2], 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


class CuriousServer:
    """Runs key generation and training honestly, then misbehaves at step 3."""

    def __init__(self, num_nodes=3):
        self.captured = {}

        def spy(node, msg, reply):
            if msg.metadata.message_type == "train" and not reply.has_error():
                self.captured[node] = array_to_bytes(reply.content[XMK_CIPHERTEXT_KEY]["ciphertext"])
            return reply

        self.grid = InProcessGrid(make_app(), num_nodes, fault=spy)
        self.strategy = _strategy(num_nodes)
        _run(self.grid, self.strategy)
        self.key_set = self.strategy._round.key_set
        self.params = self.strategy.params

    def request_pdec(self, target, c1, contributors):
        content = RecordDict(
            {
                XMK_CONFIG_KEY: ConfigRecord(
                    {
                        "params": self.params.name,
                        "key-id": self.key_set.key_id,
                        "contributors": [str(n) for n in contributors],
                        "num-clients": len(contributors),
                    }
                ),
                XMK_C1_KEY: ArrayRecord({"c1": bytes_to_array(rlwe.polys_to_bytes(self.params, c1))}),
            }
        )
        msg = Message(content=content, dst_node_id=target, message_type=QUERY_XMK_PDEC)
        return list(self.grid.send_and_receive([msg]))[0]


def test_curious_server_cannot_get_a_single_clients_update_decrypted():
    server = CuriousServer(3)
    nodes = server.grid.node_ids
    victim = nodes[0]
    c1_victim = rlwe.Ciphertext.from_bytes(server.captured[victim], server.params).c1
    # The victim refuses to decrypt its own c1, whatever the contributor list says.
    reply = server.request_pdec(victim, c1_victim, nodes)
    assert reply.has_error() and "own c1" in reply.error.reason
    # Without the victim's share no combination of the others' shares decrypts c1.
    # Contributor lists that exclude the target or are too small are refused too.
    reply = server.request_pdec(nodes[1], c1_victim, [nodes[0], nodes[2]])
    assert reply.has_error() and "not among the contributors" in reply.error.reason
    reply = server.request_pdec(nodes[1], c1_victim, [nodes[1]])
    assert reply.has_error() and "at least 2" in reply.error.reason
    reply = server.request_pdec(nodes[1], c1_victim, [nodes[1], nodes[1]])
    assert reply.has_error() and "duplicates" in reply.error.reason


def test_shares_of_others_do_not_decrypt_a_single_ciphertext():
    """Even if the other clients decrypt the victim's c1, the victim's own share is missing."""
    server = CuriousServer(3)
    nodes = server.grid.node_ids
    victim = nodes[0]
    ct = rlwe.Ciphertext.from_bytes(server.captured[victim], server.params)
    shares = []
    for other in nodes[1:]:
        reply = server.request_pdec(other, ct.c1, nodes)
        assert not reply.has_error()
        from flwr_fedeval.messages import XMK_SHARE_KEY
        shares.append(rlwe.DecryptionShare.from_bytes(array_to_bytes(reply.content[XMK_SHARE_KEY]["share"]), server.params))
    length = sum(int(np.prod(s)) for s in SHAPES) + 1
    scale = server.strategy.scale_bits_for(3)
    garbage = rlwe.combine_and_decode(server.params, ct.c0, shares, length, scale_bits=scale)
    true_update = _num_examples(0) * _flat(_update(0, 1))
    # without s_victim·c1 the "decryption" is uniformly random, nowhere near the update
    assert np.median(np.abs(garbage[:-1] - true_update)) > 1e3


def test_client_refuses_to_encrypt_under_a_key_set_without_its_own_share():
    """A server that swaps in a key it controls gets error replies, no ciphertext."""

    class KeySwappingStrategy(XMKFedAvg):
        def _start_attempt(self, nodes):
            messages = super()._start_attempt(nodes)
            params = self.params
            a = rlwe.expand_a(params, self._round.key_set.seed_a)
            _, server_share = rlwe.keygen(params, a)
            for msg in messages:
                shares = list(msg.content[XMK_CONFIG_KEY]["public-shares"])
                shares[0] = server_share.to_bytes()  # replace one client's b_i by the server's
                msg.content[XMK_CONFIG_KEY]["public-shares"] = shares
            return messages

    grid = InProcessGrid(make_app(), 3)
    strategy = KeySwappingStrategy(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3,
                                   max_abs_value=1e4, max_attempts=1)
    result = _run(grid, strategy)
    _, exc = strategy.aborted_attempts[0]
    assert exc.step == "encrypted training"
    victims = [n for n, reason in exc.failed.items() if "does not contain this client's public share" in reason]
    assert len(victims) == 1
    assert len(result.arrays) == 0  # no round succeeded: the global model was never replaced
