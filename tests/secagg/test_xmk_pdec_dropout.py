"""Issue 21: a decryptor lost *during* the partial decryption (step 3), over the serializing grid with the real
client handlers and roster identities.

* honest: a member of the active set A dies at step 3; the server asks A' = the first t signers still listed,
  the round completes with the weighted mean over C (within the stated bound), nobody trains twice;
* the shares of an incomplete attempt are masked pairwise over A: its t - 1 shares with C0 decode to noise,
  while the complete A' decodes exactly; two completed attempts (<= a) decode the same sum;
* a deviating server: the same A twice, an (a + 1)-th A, an A outside the signers of C: refused
  (tests/secagg/test_xmk_no_retries.py pins the first two on a single member);
* the attempt index k (issue 21, simulatable retries): attempt 1 is sent switched to L' limbs, every retry at the
  full L limbs (switched by the server on arrival); a member gives one share per k, only k in 1..a; the server
  parses each attempt's shares strictly at that attempt's level; one A answered under different k is noise.
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

sys.path.insert(0, str(Path(__file__).parent))  # the deviating server of test_xmk_deviating_server
from test_xmk_deviating_server import LENGTH, Server, _assert_independent_of, _refused, _victim_update

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import ReplyCode, array_bytes, bytes_array, xmk
from flwr_fedeval.protocol.xmk import QUERY_XMK_PDEC, XMK_CIPHERTEXT_KEY, XMK_SHARE_KEY
from flwr_fedeval.rlwe import compact, threshold
from flwr_fedeval.secagg.member import MemberState
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid


def _strategy(num_nodes, **kw):
    return XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes, max_abs_value=1e4, **kw)


def _mean_bound(strategy, num_clients, partitions):
    """The stated worst-case error of the decoded mean: (compact_noise_bound + M/2) / Δ / Σ n_i."""
    from xmk_app import num_examples

    scale = strategy.protocol.scale_bits_for(num_clients)
    limbs = strategy.protocol.limbs_for(num_clients, scale)
    bound = (compact.compact_noise_bound(strategy.params, limbs, num_clients=num_clients) + num_clients / 2)
    return bound / 2.0**scale / sum(num_examples(p) for p in partitions)


def _killing_decryptor(victim_index, then=None):
    """A fault that kills the node of ``victim_index`` when its first partial-decryption request arrives; every
    other partial decryption is recorded in ``grid.pdecs`` as (node, request, reply), after ``then(node, request,
    reply)`` (if given) has had its say on the reply."""
    state = {}

    def fault(node, msg, reply):
        if msg.metadata.message_type != QUERY_XMK_PDEC:
            return reply
        if node == state.get("victim"):
            state["grid"].kill(node)
            return None
        request = xmk.PdecRequest.from_record(msg.content)
        reply = reply if then is None else then(node, request, reply)
        state["grid"].pdecs.append((node, request, xmk.PdecReply.from_record(reply.content)))
        return reply

    grid = InProcessGrid(make_app(), 5, RUN_CONFIG, fault=fault)
    grid.pdecs = []
    state.update(grid=grid, victim=grid.node_ids[victim_index])
    return grid, state["victim"]


def _level_of(share, limbs):
    """True iff the share's bytes parse strictly as a decryption share at ``limbs`` limbs."""
    try:
        compact.share_count(share, P, limbs)
    except ValueError:
        return False
    return True


P = rlwe.DEFAULT_PARAMETER_SET


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
    # attempt 1 switched to L' limbs, the retry at the full L (switched by the server on arrival)
    limbs = strategy.protocol.limbs_for(5, strategy.protocol.scale_bits_for(5))
    assert limbs < P.limbs
    assert [(grid.node_ids.index(n), r.attempt) for n, r, _ in grid.pdecs] == [(0, 1), (2, 1), (0, 2), (2, 2),
                                                                            (3, 2)]
    for _, request, reply in grid.pdecs:
        sent_at = limbs if request.attempt == 1 else P.limbs
        assert _level_of(reply.share, sent_at) and not _level_of(reply.share, P.limbs + limbs - sent_at)


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
    return rlwe.decode(server.params, raw, scale_bits=server.strategy.protocol.scale_bits_for(len(server.nodes)),
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
    complete = [server.share(server.pdec(node(n), total.c1, active=second, attempt=2)) for n in second]
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
        state = MemberState.from_config(server.grid.contexts[node(name)].state["xmk-state"])
        sk = threshold.SecretShare.from_bytes(state.sk_share, server.params)
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
    for k, active in enumerate((names[:3], [names[0], names[1], names[3]]), start=1):
        shares = [server.share(server.pdec(node(n), total.c1, active=active, attempt=k)) for n in active]
        sums.append(_decode(server, total.c0, shares, server.last_replies[-3:])[0])
    expected = np.sum([_victim_update(p) for p in range(4)], axis=0)
    for got in sums:
        assert got[-1] == pytest.approx(expected[-1], abs=1e-6)  # Σ n_i
        assert np.max(np.abs(got[:-1] / got[-1] - expected[:-1] / expected[-1])) < 1e-6
    # the same Σ m: each within B_total(M) / Δ of it (fresh smudging each: not the same noise)
    bound = (rlwe.total_noise_bound(server.params, 4) + 2) / 2.0**server.strategy.protocol.scale_bits_for(4)
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


def test_a_retry_share_at_another_level_than_its_attempt_is_refused_by_the_server():
    """The server parses an attempt's shares strictly at its level (L for a retry). A share of attempt 2 sent at
    L' (switched, as attempt 1 would be) is malformed to it: that member fails the retry, the a = 2 attempts
    are used up, and the round fails at the partial decryption rather than decoding a wrong sum."""
    state = {}

    def switched(node, request, reply):
        if request.attempt == 2 and node == state["grid"].node_ids[2]:
            full = rlwe.DecryptionShare.from_bytes(array_bytes(reply.content[XMK_SHARE_KEY], XMK_SHARE_KEY, "share"), P)
            wrong = compact.compress_decryption_share(P, full, request.limbs)  # a valid share, at L'
            reply.content[XMK_SHARE_KEY]["share"] = bytes_array(wrong.to_bytes())
        return reply

    grid, victim = _killing_decryptor(1, then=switched)
    state["grid"] = grid
    strategy = _strategy(5)
    run(grid, strategy)
    (_, exc), = strategy.aborted_attempts
    assert exc.step == "partial decryption"
    assert set(exc.failed) == {victim, grid.node_ids[2]}
    assert "malformed decryption share" in exc.failed[grid.node_ids[2]]
    assert not strategy.contributor_sets[0]["completed"]


def _compact_server(num_nodes):
    """A key set at the fewest L' the noise budget allows (< L), trained once; returns (server, C1)."""
    server = Server(num_nodes)
    server.strategy.protocol = dataclasses.replace(server.strategy.protocol, limbs=None)
    server.keys()
    server.train()
    assert server.key_set.parameters.limbs < P.limbs
    cts = [compact.CompactCiphertext.from_bytes(
        array_bytes(r.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext"), P,
        server.key_set.parameters.limbs)
        for r in server.replies.values()]
    return server, compact.add_compact_ciphertexts(cts).c1


def test_a_member_gives_one_share_per_attempt_index_switched_for_k_1_only():
    """N = 5, t = 3, L' < L. A member answers each k once: a second k = 1 share (for another A) is refused, so it
    gives at most one share switched to L' per round; a repeated k = 2 is refused as well. A k = 1 share is at
    L' limbs, a k = 2 share at L (each refused by a parser at the other level)."""
    server, c1 = _compact_server(5)
    names = sorted(server.key_set.names)
    node = server.key_set.node_of
    a1, a2 = names[:3], [names[0], names[1], names[3]]  # A2 passes over node-2, as a retry does
    first = server.pdec(node(names[0]), c1, active=a1, attempt=1)
    reply = server.pdec(node(names[0]), c1, active=a2, attempt=1)
    _refused(reply, "as attempt k=1", "one share per attempt index")
    assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED
    retry = server.pdec(node(names[0]), c1, active=a2, attempt=2)  # the refusal spent nothing
    for reply, limbs in ((first, server.key_set.parameters.limbs), (retry, P.limbs)):
        share = array_bytes(reply.content[XMK_SHARE_KEY], XMK_SHARE_KEY, "share")
        assert _level_of(share, limbs) and not _level_of(share, P.limbs + server.key_set.parameters.limbs - limbs)
    # another member, the other order: k = 2 first, then k = 2 again (refused), then k = 1 (its one switched share)
    server.share(server.pdec(node(names[1]), c1, active=a1, attempt=2))
    reply = server.pdec(node(names[1]), c1, active=a2, attempt=2)
    _refused(reply, "as attempt k=2")
    assert reply.error.code == ReplyCode.ALREADY_CONTRIBUTED
    server.share(server.pdec(node(names[1]), c1, active=a2, attempt=1))


def test_an_attempt_index_outside_1_to_a_is_refused():
    """k must be in 1..a (a = 2 signed in T); k < 1 is a malformed request. Nothing is spent on the refusals."""
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    node = server.key_set.node_of(sorted(server.key_set.names)[0])
    _refused(server.pdec(node, total.c1, attempt=3), "attempt k=3 must be in [1, 2]", "signed in the key-set")
    for bad in (0, -1):
        reply = server.pdec(node, total.c1, attempt=bad)
        _refused(reply, "attempt", "below 1")
        assert reply.error.code == ReplyCode.REFUSED
    server.share(server.pdec(node, total.c1, attempt=2))


def test_one_active_set_answered_under_different_attempt_indices_decodes_to_noise():
    """A deviating server asks the members of one A under different k (k = 1 of some, k = 2 of the others): the
    pairwise masks bind k, so they do not cancel and the decryption is uniform mod q."""
    server = Server(4)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = sorted(server.key_set.names)
    active = names[:3]
    shares = [server.share(server.pdec(server.key_set.node_of(n), total.c1, active=active, attempt=k))
              for n, k in zip(active, (1, 1, 2))]
    expected = np.sum([_victim_update(p) for p in range(4)], axis=0)
    _, raw = _decode(server, total.c0, shares, server.last_replies[-3:])
    _assert_independent_of(raw, server.params, expected)
