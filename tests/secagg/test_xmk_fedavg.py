"""xMK-CKKS FedAvg over the serializing in-process grid (numpy-only clients)."""

import numpy as np
import pytest
from identities import IDENTITY_DIR
from xmk_app import SHAPES, flat, initial, make_app, num_examples, plain_fedavg, run, update

from flwr_fedeval.protocol import array_bytes, bytes_array
from flwr_fedeval.protocol.xmk import XMK_CIPHERTEXT_KEY
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}
_update, _num_examples, _initial, _plain_fedavg, _flat, _run = update, num_examples, initial, plain_fedavg, flat, run


def _strategy(num_nodes, **kw):
    return XMKFedAvg(
        fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4, **kw
    )


@pytest.mark.parametrize("num_nodes", [3, 10])
def test_secure_aggregate_equals_plaintext_weighted_fedavg(num_nodes):
    grid = InProcessGrid(make_app(), num_nodes, RUN_CONFIG)
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

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=spy)
    _run(grid, _strategy(3))
    assert len(sent) == 3
    for reply in sent:
        assert "arrays" not in reply.content
        assert "num-examples" not in reply.content["metrics"]
        assert XMK_CIPHERTEXT_KEY in reply.content


def test_two_rounds_with_per_client_set_rekey_reuses_keys():
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
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


def test_timer_records_each_protocol_step_of_each_round():
    strategy = _strategy(3)
    _run(InProcessGrid(make_app(), 3, RUN_CONFIG), strategy, rounds=2)
    steps = ["step 1 (key generation)", "step 2 (sum of the encrypted updates)", "step 2b (contributor set)",
             "step 3 (partial decryption)", "step 4 (decoding)"]
    assert [name for name, _ in strategy.timer.timings] == steps * 2
    assert all(seconds > 0 for _, seconds in strategy.timer.timings)


@pytest.mark.parametrize("step", ["query.xmk_keygen", "query.xmk_reveal", "query.xmk_shares"])
def test_dropout_before_training_rekeys_without_that_client(step):
    """Before any client trained a re-key leaks nothing: the round runs with a key set of the others."""
    dropped = {}

    def fault(node, msg, reply):
        if node == dropped["node"] and msg.metadata.message_type == step:
            return None  # the node times out
        return reply

    grid = InProcessGrid(make_app(), 4, RUN_CONFIG, fault=fault)
    dropped["node"] = grid.node_ids[2]
    strategy = _strategy(4)
    result = _run(grid, strategy)
    assert strategy.aborted_attempts, "the failure must be recorded"
    _, exc = strategy.aborted_attempts[0]
    assert dropped["node"] in exc.failed
    survivors = [p for p in range(4) if p != 2]
    expected = _plain_fedavg(_initial(), survivors, 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


def test_member_lost_before_upload_is_left_out_of_the_contributor_set_without_a_retry():
    """Issue 21 done-when: node 2's ciphertext never arrives; the round completes over the other three,
    exactly, with one train request per node (no re-run on the same model)."""
    dropped = {}

    def fault(node, msg, reply):
        return None if node == dropped["node"] and msg.metadata.message_type == "train" else reply

    grid = InProcessGrid(make_app(), 4, RUN_CONFIG, fault=fault)
    dropped["node"] = grid.node_ids[2]
    strategy = _strategy(4)
    result = _run(grid, strategy)
    assert not strategy.aborted_attempts
    assert [list(f) for _, f in strategy.left_out] == [[dropped["node"]]]
    assert sorted(n for n, t, _ in grid.log if t == "train") == sorted(grid.node_ids)  # no retry
    expected = _plain_fedavg(_initial(), [0, 1, 3], 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6
    assert result.train_metrics_clientapp[1]["num-examples"] == sum(_num_examples(p) for p in [0, 1, 3])


def test_member_lost_after_upload_costs_nothing():
    """Issue 21 done-when: node 2 uploads, then is gone (no contributor signature, no decryption share):
    the other members (t = 3 of 4) decrypt the sum over all four contributors, exactly, without a retry."""
    dropped = {}

    def fault(node, msg, reply):
        if node == dropped["node"] and msg.metadata.message_type in ("query.xmk_contributors", "query.xmk_pdec"):
            grid.kill(node)
            return None
        return reply

    grid = InProcessGrid(make_app(), 4, RUN_CONFIG, fault=fault)
    dropped["node"] = grid.node_ids[2]
    strategy = _strategy(4)
    result = _run(grid, strategy)
    assert not strategy.aborted_attempts and not strategy.left_out
    assert [t for n, t, _ in grid.log if n == dropped["node"]].count("train") == 1
    expected = _plain_fedavg(_initial(), range(4), 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6
    assert result.train_metrics_clientapp[1]["num-examples"] == sum(_num_examples(p) for p in range(4))


@pytest.mark.parametrize("attempts", [2, 1])
def test_decryptor_lost_during_partial_decryption_is_replaced_without_a_retry(attempts):
    """A member of the active set A lost during the partial decryption itself (issue 21): with a = 2 active sets
    signed in T (the default) the next signer of C replaces it and the round completes with the mean over all
    four; with a = 1 (the earlier rule) the round fails and the global model stays as it was. Either way no
    client is asked to train again, and the lost member is asked for one share only."""
    victim = {}

    def fault(node, msg, reply):
        if msg.metadata.message_type == "query.xmk_pdec" and victim.setdefault("node", node) == node:
            return None
        return reply

    grid = InProcessGrid(make_app(), 4, RUN_CONFIG, fault=fault)
    strategy = _strategy(4, decryption_attempts=attempts)
    result = _run(grid, strategy)
    assert sorted(n for n, t, _ in grid.log if t == "train") == sorted(grid.node_ids)  # no retry
    assert [n for n, t, _ in grid.log if t == "query.xmk_pdec"].count(victim["node"]) == 1
    final = _flat(result.arrays.to_numpy_ndarrays()) if len(result.arrays) else _flat(_initial())
    if attempts == 1:
        (_, exc), = strategy.aborted_attempts
        assert exc.step == "partial decryption" and victim["node"] in exc.failed
        assert np.array_equal(final, _flat(_initial()))
    else:
        assert not strategy.aborted_attempts
        assert np.max(np.abs(final - _plain_fedavg(_initial(), range(4), 1))) <= 1e-6
        assert len(strategy.contributor_sets[0]["decryption_attempts"]) == 2


def test_too_many_dropouts_leave_global_model_unchanged():
    def fault(node, msg, reply):
        return None if msg.metadata.message_type == "query.xmk_pdec" and node != first["node"] else reply

    first = {}
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)
    first["node"] = grid.node_ids[0]
    strategy = _strategy(3)
    result = _run(grid, strategy)
    assert strategy.aborted_attempts
    # no round succeeded: the result keeps the initial arrays
    final = _flat(result.arrays.to_numpy_ndarrays()) if len(result.arrays) else _flat(_initial())
    assert np.array_equal(final, _flat(_initial()))


def test_corrupted_ciphertext_leaves_the_node_out_naming_it():
    bad = {}

    def fault(node, msg, reply):
        if node == bad["node"] and msg.metadata.message_type == "train" and not bad.get("done"):
            data = bytearray(array_bytes(reply.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext"))
            data = data[: len(data) // 2]  # truncated
            reply.content[XMK_CIPHERTEXT_KEY]["ciphertext"] = bytes_array(bytes(data))
            bad["done"] = True
        return reply

    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)
    bad["node"] = grid.node_ids[1]
    strategy = _strategy(3)
    result = _run(grid, strategy)
    assert not strategy.aborted_attempts
    (_, failed), = strategy.left_out
    assert list(failed) == [bad["node"]]
    assert "malformed ciphertext" in failed[bad["node"]]
    expected = _plain_fedavg(_initial(), [0, 2], 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


def test_named_arrays_keep_their_names_through_secure_aggregation():
    """A PyTorch state_dict's names (``fc1.weight`` ...) survive XMKFedAvg, round after round (issue 23.1):
    the client's train handler looks its arrays up by name, as ``load_state_dict`` does."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod

    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        got = msg.content["arrays"]
        assert list(got.keys()) == names, list(got.keys())  # a KeyError in load_state_dict otherwise
        new = {k: Array(got[k].numpy() + d) for k, d in zip(names, update(pid, rnd))}
        metrics = MetricRecord({"num-examples": num_examples(pid)})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    grid = InProcessGrid(app, 3, RUN_CONFIG)
    start = ArrayRecord({k: Array(a) for k, a in zip(names, _initial())})
    result = _strategy(3).start(grid=grid, initial_arrays=start, num_rounds=2, train_config=ConfigRecord({}))
    assert list(result.arrays.keys()) == names
    assert [a.shape for a in result.arrays.to_numpy_ndarrays()] == [tuple(s) for s in SHAPES]
    assert not [t for _, t, ok in grid.log if not ok]  # no client refused or failed in either round
