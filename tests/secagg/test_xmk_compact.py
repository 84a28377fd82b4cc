"""Compact xMK-CKKS messages over the serializing grid (issue 21 item 4): c0 and the decryption share are
modulus-switched to the L' limbs signed in the key-set transcript T, c1 stays at L.

What a client uploads per round is measured on the real replies (bytes after Flower's serialization) and
compared with what :mod:`flwr_fedeval.rlwe.compact` predicts and with the uncompressed form; a deviating
server that asks for another limb count than T's is refused.
"""

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the deviating server of test_xmk_deviating_server
from identities import IDENTITY_DIR
from test_xmk_deviating_server import LENGTH, Server, _refused, _reveal_config
from xmk_app import flat, initial, make_app, plain_fedavg, run

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import array_bytes, bytes_array
from flwr_fedeval.protocol.xmk import XMK_CIPHERTEXT_KEY, XMK_CONFIG_KEY, XMK_SHARE_KEY
from flwr_fedeval.rlwe import compact
from flwr_fedeval.rlwe import serialization as ser
from flwr_fedeval.strategies.xmk_fedavg import RoundAborted, XMKFedAvg, _KeySet
from flwr_fedeval.testing import InProcessGrid

P = rlwe.DEFAULT_PARAMETER_SET


def _compact_server(num_nodes=3, limbs=None):
    server = Server(num_nodes)
    # None: the fewest the noise budget allows
    server.strategy.protocol = dataclasses.replace(server.strategy.protocol, limbs=limbs)
    return server


def _uploads(server):
    """One honest round up to the decryption shares: each member's (ciphertext bytes, share bytes), as the
    server received them through the grid, and the parsed compact ciphertexts."""
    server.keys()
    server.train()
    blobs = {n: array_bytes(r.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext")
             for n, r in server.replies.items()}
    cts = [compact.CompactCiphertext.from_bytes(b, P, server.key_set.parameters.limbs) for b in blobs.values()]
    total = compact.add_compact_ciphertexts(cts)
    shares = {}
    for node in server.nodes:
        reply = server.pdec(node, total.c1)
        assert not reply.has_error(), reply.error.reason
        shares[node] = array_bytes(reply.content[XMK_SHARE_KEY], XMK_SHARE_KEY, "share")
    return {n: (blobs[n], shares[n]) for n in server.nodes}, cts


def test_upload_per_client_is_what_compact_predicts_and_below_the_uncompressed_form():
    server = _compact_server()
    uploads, cts = _uploads(server)
    fewest = compact.compact_limbs(P, num_clients=3, scale_bits=server.strategy.protocol.scale_bits_for(3),
                                   max_abs_value=1e4)
    # the strategy asks for the fewest, and that is fewer than L
    assert server.key_set.parameters.limbs == fewest < P.limbs
    k = -(-LENGTH // P.n)
    level = compact.level_parameter_set(P, fewest)
    predicted_ct = 2 * ser.HEADER_SIZE + ser.packed_size(level, k, 1) + ser.packed_size(P, k, 1)
    predicted_share = ser.HEADER_SIZE + ser.packed_size(level, k, 1)
    assert {len(ct) for ct, _ in uploads.values()} == {predicted_ct}
    assert {len(share) for _, share in uploads.values()} == {predicted_share}
    assert all(ct.c0.shape == (k, fewest, P.n) and ct.c1.shape == (k, P.limbs, P.n) for ct in cts)
    # the shares parse strictly at L' (and not at L)
    for _, share in uploads.values():
        assert rlwe.DecryptionShare.from_bytes(share, level).d.shape == (k, fewest, P.n)
        with pytest.raises(ValueError):
            rlwe.DecryptionShare.from_bytes(share, P)

    full_server = _compact_server(limbs=P.limbs)  # the uncompressed form, same messages
    full, _ = _uploads(full_server)
    assert full_server.key_set.parameters.limbs == P.limbs
    today = (ser.HEADER_SIZE + ser.packed_size(P, k, 2)) + (ser.HEADER_SIZE + ser.packed_size(P, k, 1))
    assert {len(ct) + len(share) for ct, share in full.values()} == {today + ser.HEADER_SIZE}  # c0, c1 headers
    per_client = predicted_ct + predicted_share
    assert per_client < today
    # bits per coefficient: log2 q (c1) + 2 log2 q' (c0', D'), at bit_length(q_l) bits per residue
    bits = sum(p.bit_length() for p in P.primes) + 2 * sum(p.bit_length() for p in P.primes[:fewest])
    assert per_client == 3 * ser.HEADER_SIZE + k * P.n * bits // 8


def test_decryption_share_at_another_limb_count_than_t_is_refused_and_costs_nothing():
    server = _compact_server()
    server.keys()
    server.train()
    cts = [compact.CompactCiphertext.from_bytes(
        array_bytes(r.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext"), P,
        server.key_set.parameters.limbs)
        for r in server.replies.values()]
    c1 = compact.add_compact_ciphertexts(cts).c1
    signed = server.key_set.parameters.limbs
    node = server.nodes[0]
    for other in (signed - 1, signed + 1, P.limbs):
        if other != signed:
            _refused(server.pdec(node, c1, limbs=other), f"limbs={other}", "signed in the key-set transcript")
    reply = server.pdec(node, c1)  # the refused requests spent nothing: the honest one is answered
    assert not reply.has_error(), reply.error.reason
    level = compact.level_parameter_set(P, signed)
    assert rlwe.DecryptionShare.from_bytes(array_bytes(reply.content[XMK_SHARE_KEY], XMK_SHARE_KEY, "share"), level)


def test_limb_count_below_the_noise_budget_or_above_l_is_refused_at_the_reveal():
    server = _compact_server()
    committed = server.commit()
    fewest = compact.compact_limbs(P, num_clients=3, scale_bits=server.strategy.protocol.scale_bits_for(3),
                                   max_abs_value=1e4)
    assert fewest > 1  # at the default set and M = 3 one limb (q' < 2^24) would not hold the sum
    node = server.nodes[0]
    _refused(server.send(node, "query.xmk_reveal", _reveal_config(committed, limbs=fewest - 1)),
             f"L'={fewest - 1}", f"[{fewest}, {P.limbs}]")
    _refused(server.send(node, "query.xmk_reveal", _reveal_config(committed, limbs=P.limbs + 1)),
             f"L'={P.limbs + 1}")
    reply = server.send(node, "query.xmk_reveal", _reveal_config(committed, limbs=fewest))  # nothing spent
    assert not reply.has_error(), reply.error.reason


def test_members_shown_different_limb_counts_refuse_before_sharing_keys():
    """A per-client limb count at the reveal gives that client another T: every member refuses to share keys."""
    server = _compact_server()
    committed = server.commit()
    fewest = compact.compact_limbs(P, num_clients=3, scale_bits=server.strategy.protocol.scale_bits_for(3),
                                   max_abs_value=1e4)
    replies = {n: server.send(n, "query.xmk_reveal", _reveal_config(committed, limbs=lim))
               for n, lim in zip(server.nodes, (fewest, fewest, P.limbs))}
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


def test_strategy_refuses_a_limb_count_outside_the_parameter_set():
    for bad in (0, P.limbs + 1):
        with pytest.raises(ValueError, match="limbs"):
            XMKFedAvg(fraction_evaluate=0.0, limbs=bad)


@pytest.mark.parametrize("other", [1, P.limbs])
def test_upload_at_another_level_than_t_is_left_out_naming_the_node(other):
    """A client whose c0 is at another limb count than T's (further switched, or uncompressed) is left out of
    the contributor set by the server's strict parse; the round completes with the others' exact mean."""
    bad = {}

    def fault(node, msg, reply):
        if node == bad["node"] and msg.metadata.message_type == "train":
            data = array_bytes(reply.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext")
            ct = compact.CompactCiphertext.from_bytes(data, P, bad["limbs"])
            if other < ct.limbs:  # switched further: a valid compact ciphertext at L' = other
                c0 = compact.switch_modulus(ct.level, ct.c0, other)
            else:  # at L: the uncompressed format (c0 a full-L array, its values beside the point)
                c0 = ct.c1.copy()
            wrong = compact.CompactCiphertext(P, other, c0, ct.c1)
            reply.content[XMK_CIPHERTEXT_KEY]["ciphertext"] = bytes_array(wrong.to_bytes())
        return reply

    grid = InProcessGrid(make_app(), 3, {"fedeval-identity-dir": IDENTITY_DIR}, fault=fault)
    bad["node"] = grid.node_ids[1]
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3, max_abs_value=1e4,
                         bulk="ckks")
    bad["limbs"] = strategy.protocol.limbs_for(3, strategy.protocol.scale_bits_for(3))
    assert bad["limbs"] != other  # the level the server expects differs from the upload's
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    (_, failed), = strategy.left_out
    assert list(failed) == [bad["node"]]
    assert "malformed ciphertext" in failed[bad["node"]]
    expected = plain_fedavg(initial(), [0, 2], 1)
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


@pytest.mark.parametrize("num_nodes", [2, 5])
def test_round_over_the_grid_at_the_split_set_decodes_within_its_bound(num_nodes):
    # xmk-n4096-q109 with B = 2^16: L' = 2 (the two 31-bit primes dropped); at M = 2 the rounding 2MQ
    # exceeds B_total and condition 6 holds through the error target (rlwe.compact.ERROR_TARGET)
    params = rlwe.get_parameter_set("xmk-n4096-q109")
    grid = InProcessGrid(make_app(), num_nodes, {"fedeval-identity-dir": IDENTITY_DIR})
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=num_nodes, min_available_nodes=num_nodes, bulk="ckks",
                         max_abs_value=2.0**16, parameter_set="xmk-n4096-q109")
    scale_bits = strategy.protocol.scale_bits_for(num_nodes)
    limbs = strategy.protocol.limbs_for(num_nodes, scale_bits)
    assert limbs == 2
    rounding = 2 * num_nodes * compact.dropped_modulus(params, limbs)
    assert (rounding > rlwe.total_noise_bound(params, num_nodes)) == (num_nodes == 2)
    bound = (compact.compact_noise_bound(params, limbs, num_clients=num_nodes) + num_nodes / 2) / 2.0**scale_bits
    assert bound <= compact.ERROR_TARGET
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    expected = plain_fedavg(initial(), range(num_nodes), 1)
    # the error of the weighted mean: the sum's bound over sum n_i, plus float32 storage of the weights
    n_total = sum(10 + 7 * p for p in range(num_nodes))
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - expected)) <= bound / n_total + np.max(np.abs(expected)) * 2.0**-23
