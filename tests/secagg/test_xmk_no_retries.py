"""Issue 21: the deviating server of each new rule, over the serializing grid with the real client handlers.

* the fake-dropout re-run (the same global model over K minus {i}) recovers nothing: every client refuses;
* the value bound is the signed one: varying it per request gets no refusal and changes nothing;
* one contributor set and one decryption share per (key set, round); disjoint survivor groups cannot
  both decrypt (t > N/2).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message

sys.path.insert(0, str(Path(__file__).parent))  # the deviating server of test_xmk_deviating_server
from test_xmk_deviating_server import LENGTH, Server, _refused, _reveal_config
from xmk_app import RUN_CONFIG, flat, initial, make_app, num_examples, plain_fedavg, run

from flwr_fedeval import rlwe
from flwr_fedeval.ledger import NodeLedger
from flwr_fedeval.protocol import ReplyCode, xmk
from flwr_fedeval.protocol.xmk import QUERY_XMK_CONTRIBUTORS, QUERY_XMK_PDEC, QUERY_XMK_SHARES, XMK_CONFIG_KEY
from flwr_fedeval.secagg.member import MemberLedger
from flwr_fedeval.strategies.xmk_fedavg import RoundAborted, XMKFedAvg, _KeySet, _RoundState
from flwr_fedeval.testing import InProcessGrid


def _strategy(num_nodes, **kw):
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4, **kw)


# ---------------------------------------------------------------------------------------------
# The fake-dropout re-run of issue 21 (attack 1)
# ---------------------------------------------------------------------------------------------
def test_fake_dropout_rerun_of_the_same_round_is_refused_by_every_client():
    """Round 1 runs honestly over 4 clients. The server then claims node i dropped and re-runs round 1 on the
    same global model over K minus {i}, for each i: every client refuses before it shares a key (the round
    does not increase), so the server gets no second sum to difference."""
    grid = InProcessGrid(make_app(), 4, RUN_CONFIG)
    strategy = _strategy(4)
    first = run(grid, strategy)
    assert np.max(np.abs(flat(first.arrays.to_numpy_ndarrays()) - plain_fedavg(initial(), range(4), 1))) <= 1e-6
    for dropped in grid.node_ids:
        others = [n for n in grid.node_ids if n != dropped]
        strategy._round = _RoundState(1, ArrayRecord(initial()), ConfigRecord({"server-round": 1}), grid)
        with pytest.raises(RoundAborted) as info:
            strategy.share_keys(strategy.reveal(strategy.commit(others)))
        assert set(info.value.failed) == set(others)
        assert all("no retries" in r and f"code {int(ReplyCode.ALREADY_CONTRIBUTED)}" in r
                   for r in info.value.failed.values()), info.value.failed


def test_fake_dropout_rerun_under_a_new_round_number_is_refused_at_train():
    """The same attack with the round number bumped: the key shares pass, but no client trains again on a
    global model it already trained on (the model hash), whatever the key set."""
    grid = InProcessGrid(make_app(), 4, RUN_CONFIG)
    strategy = _strategy(4)
    run(grid, strategy)
    server = Server.__new__(Server)  # the deviating server's steps over this grid and strategy
    server.grid, server.nodes, server.strategy, server.params = grid, list(grid.node_ids), strategy, strategy.params
    server.set_round(2)  # the round-1 global model again
    server.keys(server.nodes[1:])
    replies = server.train()
    assert len(replies) == 3
    for reply in replies.values():
        _refused(reply, "no retries", "already trained on global model")
        assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED


# ---------------------------------------------------------------------------------------------
# The bound oracle of issue 21 (attack 2): the bound is the signed one, values are clipped
# ---------------------------------------------------------------------------------------------
def test_bound_varied_per_train_request_is_ignored_and_never_refused():
    """The server writes a tiny max-abs-value (and scale) into each train request: no client refuses, none
    clips, and the decrypted sum is the honest one: the bound comes from T only."""
    server = Server(3)
    server.keys()
    messages = server.train_messages()
    for msg, bound in zip(messages, (1.0, 12.0, 16.0)):  # below, between and above the clients' n_i
        msg.content[XMK_CONFIG_KEY]["max-abs-value"] = bound
        msg.content[XMK_CONFIG_KEY]["scale-bits"] = 1
    replies = server.train(messages)
    assert not any(r.has_error() for r in replies.values())
    assert all(MemberLedger.from_config(c.state["xmk-ledger"]).clipped_last == 0 for c in server.grid.contexts.values())
    cts = server.ciphertexts()
    total = rlwe.add_ciphertexts(list(cts.values()))
    shares = [server.share(server.pdec(n, total.c1)) for n in server.nodes]
    raw = server.without_self_masks(rlwe.combine(server.params, total.c0, shares), server.last_replies)
    got = rlwe.decode(server.params, raw, scale_bits=server.key_set.parameters.scale_bits, length=LENGTH)
    assert got[-1] == pytest.approx(sum(num_examples(p) for p in range(3)), abs=1e-6)


def test_a_signed_bound_below_the_data_clips_and_the_server_learns_no_refusal():
    """A key set whose signed bound (12) is below some n_i (10, 17, 24): no refusal (the refusal was the
    oracle); each value is clipped to [-12, 12] and the count stays on the node (ledger), not in the reply.
    CKKS mode, where n_i is a value of the update (KAHE mode carries n_i and the clipped count in integer
    slots: tests/secagg/test_xmk_kahe.py)."""
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3, max_abs_value=12.0,
                         bulk="ckks")
    sent = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            sent.append(reply)
        return reply

    grid.fault = spy
    result = run(grid, strategy)
    assert len(sent) == 3 and not any(r.has_error() for r in sent)
    assert all("clipped" not in k for r in sent for k in r.content["metrics"])
    clipped = {int(c.node_config["partition-id"]): MemberLedger.from_config(c.state["xmk-ledger"]).clipped_last
               for c in grid.contexts.values()}
    assert clipped[0] == 0 and clipped[1] >= 1 and clipped[2] >= 1  # n_1 = 17 and n_2 = 24 clipped at least
    assert result.train_metrics_clientapp[1]["num-examples"] == 10 + 12 + 12  # Σ min(n_i, B)


def test_members_shown_different_bounds_refuse_before_sharing_keys():
    """A per-client bound at the reveal gives that client another T: every member refuses to share keys."""
    server = Server(3)
    committed = server.commit()
    replies = {n: server.send(n, "query.xmk_reveal", _reveal_config(committed, **{"max-abs-value": b}))
               for n, b in zip(server.nodes, (1e4, 1e4, 16.0))}
    assert not any(r.has_error() for r in replies.values())
    recs = [replies[n].content[XMK_CONFIG_KEY] for n in server.nodes]
    assert len({bytes(r["transcript"]) for r in recs}) == 2
    key_set = _KeySet(server.strategy.protocol.key_set_parameters(len(server.nodes), key_id=committed.key_id,
                      seed_a=committed.seed_a, round_=committed.round), tuple(server.nodes), committed.names,
                      tuple(bytes(r["public-share"]) for r in recs), tuple(bytes(r["mask-key"]) for r in recs),
                      tuple(bytes(r["transcript-signature"]) for r in recs))
    with pytest.raises(RoundAborted) as info:
        server.strategy.share_keys(key_set)
    assert set(info.value.failed) == set(server.nodes)
    assert all("did not confirm the key set" in r for r in info.value.failed.values()), info.value.failed


# ---------------------------------------------------------------------------------------------
# One contributor set and one share per (key set, round); t > N/2
# ---------------------------------------------------------------------------------------------
def _contributors(server, node, names):
    return server.send(node, QUERY_XMK_CONTRIBUTORS, {
        "key-id": server.key_set.key_id, "round": server.strategy._round.server_round,
        "model-hash": xmk.model_hash(server.arrays), "contributors": list(names)})


def test_second_contributor_set_for_one_key_set_and_round_is_refused():
    server = Server(4)
    server.honest_round()
    names = list(server.key_set.names)
    node = server.nodes[0]
    assert not _contributors(server, node, names).has_error()
    for other in (names, names[:3] if server.key_set.name_of(node) in names[:3] else names[1:]):
        reply = _contributors(server, node, other)
        _refused(reply, "already signed a contributor set")
        assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED


def test_contributor_set_that_lies_about_an_upload_is_refused():
    """A member that uploaded refuses a C without it; C below t or with a non-member is refused too."""
    server = Server(4)
    server.honest_round()
    names = list(server.key_set.names)
    node = server.nodes[0]
    me = server.key_set.name_of(node)
    _refused(_contributors(server, node, [n for n in names if n != me]), "leaves out this client")
    _refused(_contributors(server, node, [me, names[1] if names[1] != me else names[2]]),
             "requires at least 3")  # t = 3 of 4
    _refused(_contributors(server, node, names + ["node-9"]), "['node-9'] are not members")


def test_disjoint_survivor_groups_cannot_both_decrypt():
    """N = 4, t = 3. The server splits the members into {a, b} and {c, d}, each signing its own C (every
    member honestly signs once): neither group reaches t signatures, so no member gives a decryption share;
    signatures of two different C do not add up either."""
    server = Server(4)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = list(server.key_set.names)
    groups = [names[:2], names[2:]]
    sigs = {}
    for group, c_set in zip(groups, (names, names)):  # the same C, but each group on its own side
        for name in group:
            reply = _contributors(server, server.key_set.node_of(name), c_set)
            assert not reply.has_error()
            sigs[name] = reply.content[XMK_CONFIG_KEY]["signature"]
    for group in groups:
        only = {name: sigs[name] for name in group}
        for name in group:
            reply = server.pdec(server.key_set.node_of(name), total.c1, signatures=only, active=group)
            _refused(reply, "2 members signed the contributor set, the threshold is 3")


def test_signatures_over_another_contributor_set_do_not_count():
    server = Server(4)
    cts = server.honest_round()
    names = list(server.key_set.names)
    sigs = server.sign()  # every member signed C = K
    partial = rlwe.add_ciphertexts([cts[server.key_set.node_of(n)] for n in names[:3]])
    # the server claims C = the first three, reusing the signatures over C = K
    node = server.key_set.node_of(names[0])
    _refused(server.pdec(node, partial.c1, contributors=names[:3], signatures=sigs),
             "did not sign this contributor set")


def test_decryption_share_once_per_active_set_and_at_most_a_active_sets():
    """Issue 21 (a decryptor lost during step 3): a member answers each active set A once, at most a = 2 (signed
    in T) distinct A per key set and round, all for one C1 (was: one share per key set and round)."""
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    node = server.key_set.node_of(names[0])
    server.share(server.pdec(node, total.c1, active=names[:2]))
    reply = server.pdec(node, total.c1, active=names[:2])  # the same A again
    _refused(reply, "already decrypted once", "for the active set")
    assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED
    other = rlwe.add_ciphertexts([cts[n] for n in server.nodes[:2]]).c1
    _refused(server.pdec(node, other, active=names), "already decrypted once", "another C1")  # new A, other C1
    reply = server.pdec(node, total.c1, active=names)  # passes over nobody, as the first A did
    _refused(reply, "must pass over every member it passed over", "members lost stay lost")
    server.share(server.pdec(node, total.c1, active=[names[0], names[2]]))  # names[1] lost: a = 2 allows it
    for active in (names, [names[0], names[2]], names[:2]):  # a third A, or either earlier one
        reply = server.pdec(node, total.c1, active=active)
        _refused(reply, "already decrypted")
        assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED
    assert "at most a = 2" in server.pdec(node, total.c1, active=names).error.reason


def test_active_set_without_the_member_or_below_t_is_refused():
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    node = server.key_set.node_of(names[0])
    _refused(server.pdec(node, total.c1, active=names[1:]), "including this one")
    _refused(server.pdec(node, total.c1, active=names[:1]), ">= 2 distinct members")
    server.share(server.pdec(node, total.c1, active=names[:2]))  # nothing was spent on the refusals


def test_key_shares_requested_twice_are_refused():
    server = Server(3)
    server.keys()
    request = xmk.SharesRequest(server.params.name, server.key_set.key_id, 1, server.key_set.names,
                                server.key_set.shares, server.key_set.mask_keys,
                                server.key_set.transcript_signatures).to_record()
    reply = list(server.grid.send_and_receive([Message(request, dst_node_id=server.nodes[0],
                                                       message_type=QUERY_XMK_SHARES)]))[0]
    _refused(reply, "already shared its keys")
    assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED


def test_the_server_never_gets_both_the_seed_and_the_mask_key_of_one_member():
    """A second decryption under another C within a per-client-set key set: a member whose self-mask seed
    share it gave (i in C) will not give its mask-key share (i outside C) for the same key set."""
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    for n in server.nodes:
        server.share(server.pdec(n, total.c1))  # seeds of all three revealed
    server.set_round(2, ArrayRecord([a + 1 for a in initial()]))
    server.use(server.key_set)
    names = list(server.key_set.names)
    victim = server.key_set.node_of(names[0])
    messages = [m for m in server.train_messages() if int(m.metadata.dst_node_id) != victim]
    server.train(messages)  # names[0] "drops" before its upload in round 2
    cts2 = server.ciphertexts()
    partial = rlwe.add_ciphertexts(list(cts2.values()))
    server.sign(names[1:])
    reply = server.pdec(server.key_set.node_of(names[1]), partial.c1, contributors=names[1:], active=names[1:])
    _refused(reply, "would reveal both", names[0])


def test_round_completes_with_the_exact_mean_of_the_signed_contributors():
    """The honest strategy over 5 clients, one lost before its upload and one after: C has 4 members, the
    mean is over exactly those 4 (weighted), decrypted by t = 3 of the survivors."""
    lost = {}

    def fault(node, msg, reply):
        kind = msg.metadata.message_type
        if node == lost["before"] and kind == "train":
            return None
        if node == lost["after"] and kind in ("query.xmk_contributors", "query.xmk_pdec"):
            grid.kill(node)
            return None
        return reply

    grid = InProcessGrid(make_app(), 5, RUN_CONFIG, fault=fault)
    lost.update(before=grid.node_ids[1], after=grid.node_ids[3])
    strategy = _strategy(5)
    result = run(grid, strategy)
    expected = plain_fedavg(initial(), [0, 2, 3, 4], 1)
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6
    assert result.train_metrics_clientapp[1]["num-clients"] == 4
    assert not strategy.aborted_attempts
    assert set(strategy.left_out[0][1]) == {lost["before"]} and set(strategy.lost_after_upload[0][1]) == {lost["after"]}
    pdec_nodes = [n for n, t, _ in grid.log if t == QUERY_XMK_PDEC]
    assert len(pdec_nodes) == 3 and lost["after"] not in pdec_nodes  # t = 3 decryptors, all survivors


def test_a_new_run_refuses_a_model_trained_on_in_an_earlier_run(tmp_path):
    """A new run starts a new context.state (a resume-from, or a server that simply starts another run): the
    nodes' privacy ledgers (the same nodes: one ledger folder) refuse the same global model in the new run,
    before training; new nodes (fresh ledgers) train on it."""
    run(InProcessGrid(make_app(), 3, RUN_CONFIG, ledgers=tmp_path), _strategy(3))
    assert all(NodeLedger(tmp_path / f"node-{p}.ledger.sqlite").summary().trained == {"train": 1} for p in range(3))
    codes = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            codes.append(reply.error.code if reply.has_error() else None)
        return reply

    second = InProcessGrid(make_app(), 3, RUN_CONFIG, ledgers=tmp_path, fault=spy)  # a new run: new states
    result = run(second, _strategy(3))
    assert codes == [int(ReplyCode.ALREADY_CONTRIBUTED)] * 3
    assert not len(result.arrays) or np.array_equal(flat(result.arrays.to_numpy_ndarrays()), flat(initial()))
    # other nodes (their own, fresh ledgers) have not trained on it
    codes.clear()
    run(InProcessGrid(make_app(), 3, RUN_CONFIG, fault=spy), _strategy(3))
    assert codes == [None] * 3


def test_300_filler_models_then_the_first_model_again_is_refused_over_the_grid(tmp_path):
    """The no-retry ledger never forgets: every node trains on the initial model in one run, then 300
    cheap filler models are recorded on every node (what 300 filler rounds record, through the same
    interface the member calls), then a new run offers the initial model again: every node refuses it
    (a 256-entry ledger would have forgotten it and given the update over another key set)."""
    import hashlib

    from flwr_fedeval.clients.ledger import record_training

    run(InProcessGrid(make_app(), 3, RUN_CONFIG, ledgers=tmp_path), _strategy(3))
    fill = InProcessGrid(make_app(), 3, RUN_CONFIG, ledgers=tmp_path)
    for node in fill.node_ids:
        for k in range(300):
            record_training(fill.contexts[node], hashlib.sha256(f"filler {k}".encode()).digest())
    assert all(NodeLedger(tmp_path / f"node-{p}.ledger.sqlite").summary().trained == {"train": 301} for p in range(3))
    codes = []

    def spy(node, msg, reply):
        if msg.metadata.message_type == "train":
            codes.append(reply.error.code if reply.has_error() else None)
        return reply

    result = run(InProcessGrid(make_app(), 3, RUN_CONFIG, ledgers=tmp_path, fault=spy), _strategy(3))
    assert codes == [int(ReplyCode.ALREADY_CONTRIBUTED)] * 3
    assert not len(result.arrays) or np.array_equal(flat(result.arrays.to_numpy_ndarrays()), flat(initial()))


def test_sparse_mask_graph_member_lost_before_upload_is_unmasked_exactly():
    """M = 7, mask degree 2: the lost member's pairwise masks with its two neighbours in C are rebuilt from
    its reconstructed mask key; the mean over the six contributors is exact."""
    lost = {}
    grid = InProcessGrid(make_app(), 7, RUN_CONFIG,
                         node_configs=[{"partition-id": i, "num-partitions": 7, "fedeval-xmk-mask-degree": 2}
                                       for i in range(7)],
                         fault=lambda n, m, r: None if n == lost["node"] and m.metadata.message_type == "train" else r)
    lost["node"] = grid.node_ids[4]
    strategy = _strategy(7, mask_degree=2)
    result = run(grid, strategy)
    assert not strategy.aborted_attempts and set(strategy.left_out[0][1]) == {lost["node"]}
    expected = plain_fedavg(initial(), [0, 1, 2, 3, 5, 6], 1)
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6
