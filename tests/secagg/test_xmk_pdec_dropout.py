"""Issue 21: a decryptor lost *during* the partial decryption (step 3), over the serializing grid with the real
client handlers and roster identities.

* honest: a member of the active set A dies at step 3; the server asks A' = the first t signers still listed,
  the round completes with the weighted mean over C (within the stated bound), nobody trains twice;
* the shares of an incomplete attempt are masked pairwise over A: its t - 1 shares with C0 decode to noise,
  while the complete A' decodes exactly; two completed attempts (<= a) decode the same sum;
* a deviating server: the same A twice, an (a + 1)-th A, an A outside the signers of C: refused
  (tests/secagg/test_xmk_no_retries.py pins the first two on a single member).
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

sys.path.insert(0, str(Path(__file__).parent))  # the deviating server of test_xmk_deviating_server
from test_xmk_deviating_server import LENGTH, Server, _assert_independent_of, _refused, _victim_update

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.protocol.xmk import QUERY_XMK_PDEC
from flwr_fedeval.rlwe import compact, threshold
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid


def _strategy(num_nodes, **kw):
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4, **kw)


def _mean_bound(strategy, num_clients, partitions):
    """The stated worst-case error of the decoded mean: (compact_noise_bound + M/2) / Δ / Σ n_i."""
    from xmk_app import num_examples

    scale = strategy.scale_bits_for(num_clients)
    limbs = strategy.limbs_for(num_clients, scale)
    bound = (compact.compact_noise_bound(strategy.params, limbs, num_clients=num_clients) + num_clients / 2)
    return bound / 2.0**scale / sum(num_examples(p) for p in partitions)


def _killing_decryptor(victim_index):
    """A fault that kills the node of ``victim_index`` when its first partial-decryption request arrives."""
    state = {}

    def fault(node, msg, reply):
        if node == state.get("victim") and msg.metadata.message_type == QUERY_XMK_PDEC:
            state["grid"].kill(node)
            return None
        return reply

    grid = InProcessGrid(make_app(), 5, RUN_CONFIG, fault=fault)
    state.update(grid=grid, victim=grid.node_ids[victim_index])
    return grid, state["victim"]


def test_a_decryptor_lost_during_step_3_is_replaced_and_the_round_completes():
    """5 clients, t = 3, A = node-0..2; node-1 dies when asked for its share. The server asks A' = node-0, 2, 3:
    the weighted mean over all 5 contributors, within the stated bound, and nobody trained twice."""
    grid, victim = _killing_decryptor(1)
    strategy = _strategy(5)
    result = run(grid, strategy)
    got = flat(result.arrays.to_numpy_ndarrays())
    expected = plain_fedavg(initial(), range(5), 1)
    tol = _mean_bound(strategy, 5, range(5)) + 2.0**-23 * np.max(np.abs(expected))  # + float32 rounding
    assert np.max(np.abs(got - expected)) <= tol
    assert result.train_metrics_clientapp[1]["num-clients"] == 5
    assert not strategy.aborted_attempts
    record = strategy.contributor_sets[0]
    assert record["completed"] and record["num_contributors"] == 5
    assert record["decryption_attempts"] == [["node-0", "node-1", "node-2"], ["node-0", "node-2", "node-3"]]
    assert record["decryptors"] == ["node-0", "node-2", "node-3"]
    trains = [n for n, kind, _ in grid.log if kind == "train"]
    assert sorted(trains) == sorted(grid.node_ids)  # one train request per node: no retraining
    pdecs = [n for n, kind, _ in grid.log if kind == QUERY_XMK_PDEC]
    assert pdecs.count(victim) == 1 and len(pdecs) == 6  # 3 + 3 requests, the victim asked once


def test_with_one_attempt_signed_a_lost_decryptor_still_fails_the_round():
    """a = 1 (the old rule): no second active set; the round fails at the partial decryption."""
    grid, victim = _killing_decryptor(1)
    strategy = _strategy(5, decryption_attempts=1)
    run(grid, strategy)
    (rnd, exc), = strategy.aborted_attempts
    assert exc.step == "partial decryption" and set(exc.failed) == {victim}
    record = strategy.contributor_sets[0]
    assert not record["completed"] and record["decryption_attempts"] == [["node-0", "node-1", "node-2"]]
    with pytest.raises(ValueError, match="decryption_attempts"):
        _strategy(5, decryption_attempts=3)  # the smudging is sized for at most 2


def _decode(server, c0, shares, replies):
    raw = server.without_self_masks(rlwe.combine(server.params, c0, shares), replies)
    return rlwe.decode(server.params, raw, scale_bits=server.strategy.scale_bits_for(len(server.nodes)),
                       length=LENGTH), raw


def test_an_incomplete_attempt_decodes_to_noise_and_the_complete_one_exactly():
    """N = 4, t = 3. Attempt A = node-0..2 loses node-2: the t - 1 shares it got, with C0, are uniform mod q
    (masked by node-2's pairwise keys). A' = node-0, 1, 3 decrypts the sum exactly; a second complete attempt
    (a = 2) decrypts the same sum within the bound."""
    server = Server(4)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    node = server.key_set.node_of
    first = names[:3]
    incomplete = [server.share(server.pdec(node(n), total.c1, active=first)) for n in first[:2]]
    second = [names[0], names[1], names[3]]
    complete = [server.share(server.pdec(node(n), total.c1, active=second)) for n in second]
    replies = server.last_replies[2:]  # the seed shares of the complete attempt (the same Shamir shares)
    expected = np.sum([_victim_update(p) for p in range(4)], axis=0)

    got, _ = _decode(server, total.c0, complete, replies)
    assert got[-1] == pytest.approx(expected[-1], abs=1e-6)  # Σ n_i
    assert np.max(np.abs(got[:-1] / got[-1] - expected[:-1] / expected[-1])) < 1e-6  # the weighted mean
    _, raw = _decode(server, total.c0, incomplete, replies)
    _assert_independent_of(raw, server.params, expected)
    _assert_independent_of(raw, server.params, _victim_update(0))
    # each share of the incomplete attempt is D_j = λ_j F(x_j) C1 + e*_j plus a uniform mask: without the mask
    # D_j - λ_j F(x_j) C1 would be the small smudging noise (<= B_smudge), the start of the lattice attack
    ring, points = server.params.ring, {n: i + 1 for i, n in enumerate(names)}
    for name, share in zip(first[:2], incomplete):
        state = server.grid.contexts[node(name)].state["xmk-state"]
        sk = threshold.SecretShare.from_bytes(bytes(state["sk-share"]), server.params)
        lam = threshold.lagrange_at_zero(server.params, [points[n] for n in first])[points[name]]
        exact = ring.mul(total.c1, (sk.value * lam[:, None] % ring.q_col)[None])
        left = [abs(int(v)) for v in ring.to_int(ring.sub(share.d, exact)).ravel()]
        assert np.mean([v > rlwe.smudging_bound(server.params, 4) for v in left]) > 0.99  # not e*_j: masked

    # a third attempt is the a + 1-th active set for node-0 and node-1, but a first one for node-2: refused
    # by the members that already gave two, so a deviating server completes it only without them
    third = [names[0], names[2], names[3]]
    reply = server.pdec(node(names[0]), total.c1, active=third)
    _refused(reply, "already decrypted for 2 active sets", "at most a = 2")
    assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED


def test_two_completed_attempts_decrypt_the_same_sum():
    """Two complete active sets (a = 2): both decode the same Σ m, within twice the stated bound of each other."""
    server = Server(4)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    node = server.key_set.node_of
    sums = []
    for active in (names[:3], [names[0], names[1], names[3]]):
        shares = [server.share(server.pdec(node(n), total.c1, active=active)) for n in active]
        sums.append(_decode(server, total.c0, shares, server.last_replies[-3:])[0])
    expected = np.sum([_victim_update(p) for p in range(4)], axis=0)
    for got in sums:
        assert got[-1] == pytest.approx(expected[-1], abs=1e-6)  # Σ n_i
        assert np.max(np.abs(got[:-1] / got[-1] - expected[:-1] / expected[-1])) < 1e-6
    # the same Σ m: each within B_total(M) / Δ of it (fresh smudging each: not the same noise)
    bound = (rlwe.total_noise_bound(server.params, 4) + 2) / 2.0**server.strategy.scale_bits_for(4)
    assert 0 < np.max(np.abs(sums[0] - sums[1])) <= 2 * bound


def test_an_active_set_outside_the_signers_of_c_is_refused():
    """A must be within the contributors that signed C: a member whose signature is not in the request (or a
    member outside C) cannot be made a decryptor."""
    server = Server(4)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    sigs = server.sign()
    three = {n: sigs[n] for n in names[:3]}  # t = 3 valid signatures, node-3's left out
    reply = server.pdec(server.key_set.node_of(names[0]), total.c1, signatures=three,
                        active=[names[0], names[1], names[3]])
    _refused(reply, "['node-3'] are not contributors that signed C")
    # nothing was spent on the refusal: the same member answers a valid A
    server.share(server.pdec(server.key_set.node_of(names[0]), total.c1, signatures=three, active=names[:3]))


def test_three_attempts_that_would_corner_two_honest_members_are_refused():
    """N = 5, t = 3, colluders S = {node-0, node-1} (t - 1). Three complete attempts A1 = S + node-2, A2 = S + node-3,
    A3 = {node-1, node-2, node-3} would give the server (which subtracts the colluders' shares) three linear
    equations in the two honest shares λ F(x_2) C1, λ F(x_3) C1 with small errors, each honest member answering
    only two active sets (a = 2). The passed-over rule stops it: node-3 passed over node-2 in A2, and A3 passes
    over node-0 instead, so node-3 refuses A3 (and A2 after A3)."""
    server = Server(5)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    node = server.key_set.node_of
    a1, a2, a3 = names[:3], [names[0], names[1], names[3]], [names[1], names[2], names[3]]
    server.share(server.pdec(node(names[2]), total.c1, active=a1))
    server.share(server.pdec(node(names[2]), total.c1, active=a3))  # node-2: passed over {} then {node-0}
    server.share(server.pdec(node(names[3]), total.c1, active=a2))  # node-3: passed over {node-2}
    reply = server.pdec(node(names[3]), total.c1, active=a3)  # ... then {node-0}: node-2 is back
    _refused(reply, "members lost stay lost")
    assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED


def test_a_signer_that_left_the_node_list_is_passed_over_before_it_is_asked():
    """node-0 (node-1 if node-0 signs last) leaves the SuperLink's node list once all five have signed C: the
    first active set already skips it, so the round completes in one attempt (even with a = 1) and it is never
    asked for a share."""
    signed = []

    def fault(node, msg, reply):
        if msg.metadata.message_type == "query.xmk_contributors":
            signed.append(node)
            if len(signed) == 5:  # every signature is in; one of the first t names leaves
                signed.insert(0, grid.node_ids[0] if node != grid.node_ids[0] else grid.node_ids[1])
                grid.kill(signed[0])
        return reply

    grid = InProcessGrid(make_app(), 5, RUN_CONFIG, fault=fault)
    strategy = _strategy(5, decryption_attempts=1)
    result = run(grid, strategy)
    assert not strategy.aborted_attempts and result.train_metrics_clientapp[1]["num-clients"] == 5
    victim = f"node-{grid.node_ids.index(signed[0])}"
    record = strategy.contributor_sets[0]
    expected = [n for n in sorted(record["signers"]) if n != victim][:3]
    assert victim in ("node-0", "node-1") and victim in record["signers"]
    assert record["decryption_attempts"] == [expected]
    assert signed[0] not in [n for n, kind, _ in grid.log if kind == QUERY_XMK_PDEC]
