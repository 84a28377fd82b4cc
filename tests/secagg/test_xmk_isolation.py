"""The isolation attack on the dropout recovery, and the other deviations of the KAHE bulk mode, over the
serializing grid with the real client handlers and roster identities.

Every XMKFedAvg default (N = 9 members, mask degree 4, t = 5, a = 2). The server computes the victim's 4
neighbours in the mask graph from the signed transcript T, sends them no train request, has the other 5 sign C
and asks A = C to decrypt 2·c1_v. The recovery shares it is *supposed* to get (the mask keys of K∖C, the seeds
of C) then strip the victim's pairwise and self masks. Each decryptor now refuses unless the mask graph induced
on C is connected (both modes), and in KAHE mode computes C1 = Σ_{i∈C} c1_i itself from the contributors'
signed capsule c1.
"""

import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

sys.path.insert(0, str(Path(__file__).parent))  # the deviating server of test_xmk_deviating_server
from identities import IDENTITY_DIR
from test_xmk_deviating_server import Server, _refused, _victim_update
from xmk_app import RUN_CONFIG, flat, initial, make_app, num_examples, plain_fedavg, run, update

import flwr_fedeval.secagg.member as member_module
from flwr_fedeval import rlwe
from flwr_fedeval.identity import NodeIdentity
from flwr_fedeval.protocol import array_bytes, xmk
from flwr_fedeval.protocol.xmk import QUERY_XMK_PDEC, XMK_CAPSULE_KEY, XMK_CIPHERTEXT_KEY, XMK_CONFIG_KEY
from flwr_fedeval.rlwe import compact, kahe, keyset, masking, selfmask, threshold
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid

P = rlwe.DEFAULT_PARAMETER_SET


def _pid(name):
    return int(name.split("-")[1])  # identity node-p belongs to partition p


def _isolating_round(bulk):
    """Keys for 9 members; only the victim and its 4 non-neighbours get a train request and sign C."""
    server = Server(9, bulk=bulk)
    ks = server.keys()
    assert ks.parameters.threshold == 5 and ks.parameters.mask_degree == 4 and ks.parameters.decryption_attempts == 2
    graph = masking.mask_neighbours(ks.names, 4, ks.transcript)
    victim = sorted(ks.names)[0]
    contributors = sorted(set(ks.names) - set(graph[victim]))
    assert len(contributors) == 5 and victim in contributors
    server.train([m for m in server.train_messages() if ks.name_of(m.metadata.dst_node_id) in contributors])
    server.sign(contributors)
    return server, victim, contributors, graph


def _capsules(server):
    """Each uploader's capsule (parsed strictly), its c1's canonical bytes and its signature."""
    out = {}
    for node, reply in server.replies.items():
        data = array_bytes(reply.content[XMK_CAPSULE_KEY], XMK_CAPSULE_KEY, "capsule")
        ct = compact.CompactCiphertext.from_bytes(data, P, server.key_set.parameters.limbs)
        out[server.key_set.name_of(node)] = (ct, rlwe.polys_to_bytes(P, ct.c1),
                                             bytes(reply.content[XMK_CONFIG_KEY]["capsule-signature"]))
    return out


def _pdec_capsules(server, node, contributors, c1s, signatures, *, active=None, attempt=1, c1=None):
    """``query.xmk_pdec`` in KAHE mode: each contributor's capsule c1 and signature (or a C1, ``c1``)."""
    ks = server.key_set
    config = {"params": P.name, "key-id": ks.key_id, "round": server.strategy._round.server_round,
              "attempt": attempt, "contributors": list(contributors), "num-clients": len(ks.names),
              "limbs": ks.parameters.limbs, "model-hash": xmk.model_hash(server.arrays),
              "contributor-signers": list(server.signatures),
              "contributor-signatures": list(server.signatures.values()),
              "active": list(contributors if active is None else active)}
    extra = {}
    if c1 is None:
        config.update({"capsule-c1s": list(c1s), "capsule-signatures": list(signatures)})
    else:
        from flwr_fedeval.protocol import bytes_array
        from flwr_fedeval.protocol.xmk import XMK_C1_KEY

        extra = {XMK_C1_KEY: ArrayRecord({"c1": bytes_array(c1)})}
    content = RecordDict({XMK_CONFIG_KEY: ConfigRecord(config), **extra})
    return list(server.grid.send_and_receive([Message(content=content, dst_node_id=node,
                                                      message_type=QUERY_XMK_PDEC)]))[0]


def _unmask_isolated(server, replies, raw, victim, contributors, graph, factor):
    """``raw`` + factor·(−u_v + the victim's neighbours' edge masks with it): the masks the recovery shares
    (seeds of C, mask keys of K∖C) let the server strip when every neighbour of v is outside C."""
    ks = server.key_set
    names = sorted(ks.names)
    points = dict(zip(names, threshold.member_points(len(names), params=P)))
    dropped = [n for n in names if n not in contributors]
    seeds, keys = {}, {n: {} for n in dropped}
    for reply in replies:
        x = points[ks.name_of(reply.metadata.src_node_id)]
        rec = reply.content[XMK_CONFIG_KEY]
        seeds[x] = rec["seed-shares"][list(contributors).index(victim)]
        for name, part in zip(dropped, rec["mask-shares"]):
            keys[name][x] = part
    pairs = [(selfmask.self_mask_key(threshold.combine_bytes(seeds, threshold=ks.parameters.threshold)), np.subtract)]
    mask_keys = dict(zip(ks.names, ks.mask_keys))
    context = masking.mask_context(ks.transcript, server.strategy._round.server_round)
    for name in graph[victim]:
        private = threshold.combine_bytes(keys[name], threshold=ks.parameters.threshold)
        pairs += masking.mask_pairs(own_name=name, own_private=private, peers={victim: mask_keys[victim]},
                                    context=context)
    correction = masking.MaskSum(P, pairs, raw.shape[0]).next_rows(np.zeros_like(raw))
    for _ in range(factor):
        raw = P.ring.add(raw, correction)
    return raw


# ---------------------------------------------------------------------------------------------
# The isolation attack: refused in both modes
# ---------------------------------------------------------------------------------------------
def test_isolation_of_one_member_is_refused_in_ckks_mode():
    server, victim, contributors, _ = _isolating_round("ckks")
    ct = server.ciphertexts()[server.key_set.node_of(victim)]
    for name in contributors:
        _refused(server.pdec(server.key_set.node_of(name), P.ring.add(ct.c1, ct.c1), contributors=contributors,
                             active=contributors), "not connected")


def test_control_without_the_graph_check_the_isolation_recovers_the_update_in_ckks_mode(monkeypatch):
    """The power of the test above: the same requests, with the decryptors' graph check switched off, give the
    victim's exact update (what the attack got before the check)."""
    monkeypatch.setattr(member_module.masking, "check_contributors_connected", lambda *a, **k: None)
    server, victim, contributors, graph = _isolating_round("ckks")
    ct = server.ciphertexts()[server.key_set.node_of(victim)]
    replies = [server.pdec(server.key_set.node_of(n), P.ring.add(ct.c1, ct.c1), contributors=contributors,
                           active=contributors) for n in contributors]
    shares = [server.share(r) for r in replies]
    raw = rlwe.combine(P, P.ring.add(ct.c0, ct.c0), shares)
    raw = _unmask_isolated(server, replies, raw, victim, contributors, graph, factor=2)
    got = rlwe.decode(P, raw, scale_bits=server.key_set.parameters.scale_bits, length=_victim_update(0).size) / 2
    assert np.max(np.abs(got - _victim_update(_pid(victim)))) < 1e-4


def test_isolation_of_one_member_is_refused_in_kahe_mode():
    server, victim, contributors, _ = _isolating_round("kahe")
    caps = _capsules(server)
    c1s = [caps[n][1] for n in contributors]
    sigs = [caps[n][2] for n in contributors]
    doubled = rlwe.polys_to_bytes(P, P.ring.add(caps[victim][0].c1, caps[victim][0].c1))
    v = contributors.index(victim)
    for name in contributors:
        node = server.key_set.node_of(name)
        # 2·c1_v in the victim's place (its signature is over c1_v): the signature check refuses it
        forged = c1s[:v] + [doubled] + c1s[v + 1:]
        _refused(_pdec_capsules(server, node, contributors, forged, sigs), "did not sign this key capsule")
        # the server's own C1 instead of the capsules: refused
        _refused(_pdec_capsules(server, node, contributors, (), (), c1=doubled), "sums the contributors' signed")
        # the honest capsules of this C: the induced mask graph isolates the victim, refused
        _refused(_pdec_capsules(server, node, contributors, c1s, sigs), "not connected")


@pytest.mark.parametrize("bulk", ["kahe", "ckks"])
def test_same_number_of_dropouts_in_an_honest_round_completes(bulk):
    """Four members lost before their upload, the other 5 sign C (= t): the round completes with the exact mean
    whenever the graph induced on C stays connected, in both modes."""
    lost = set()
    grid = InProcessGrid(make_app(), 9, RUN_CONFIG,
                         fault=lambda n, m, r: None if n in lost and m.metadata.message_type == "train" else r)
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=9, max_abs_value=1e4,
                         bulk=bulk)
    # the lost members: 4 that leave C connected (the key set's graph is drawn from T: pick them afterwards)
    original = strategy.train_messages

    def pick(key_set, original=original):
        graph = masking.mask_neighbours(key_set.names, 4, key_set.transcript)
        for start in range(9):
            out = [sorted(key_set.names)[(start + i) % 9] for i in range(4)]
            rest = sorted(set(key_set.names) - set(out))
            if len(masking.induced_components(graph, rest)) == 1:
                break
        lost.update(key_set.node_of(n) for n in out)
        return original(key_set)

    strategy.train_messages = pick
    result = run(grid, strategy)
    assert not strategy.aborted_attempts, strategy.aborted_attempts
    kept = [int(grid.contexts[n].node_config["partition-id"]) for n in grid.node_ids if n not in lost]
    assert len(kept) == 5
    expected = plain_fedavg(initial(), kept, 1)
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


def test_honest_server_aborts_when_c_isolates_a_member():
    """The same dropouts as the attack, honestly lost (every neighbour of one member): the members would refuse
    C, so the server aborts the round at the contributor set, model unchanged (an availability cost: a mask
    graph of degree k survives any k - 1 losses, not the loss of all k neighbours of one member)."""
    lost = set()
    grid = InProcessGrid(make_app(), 9, RUN_CONFIG,
                         fault=lambda n, m, r: None if n in lost and m.metadata.message_type == "train" else r)
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=9, max_abs_value=1e4)
    original = strategy.train_messages

    def isolate(key_set):
        graph = masking.mask_neighbours(key_set.names, 4, key_set.transcript)
        lost.update(key_set.node_of(n) for n in graph[sorted(key_set.names)[0]])
        return original(key_set)

    strategy.train_messages = isolate
    result = run(grid, strategy)
    ((_, exc),) = strategy.aborted_attempts
    assert exc.step == "contributor set" and all("not connected" in r for r in exc.failed.values())
    # Flower's result holds no arrays when no round produced any: the global model is the initial one
    assert not len(result.arrays) or np.array_equal(flat(result.arrays.to_numpy_ndarrays()), flat(initial()))


# ---------------------------------------------------------------------------------------------
# KAHE mode: C1 bound to the contributors, correlated capsules, replays, a key sum that does not round
# ---------------------------------------------------------------------------------------------
def _kahe_round(num_nodes=5, node_configs=None):
    server = Server(num_nodes, node_configs=node_configs, bulk="kahe")
    server.keys()
    server.train()
    server.sign()
    return server


def test_capsule_c1_list_not_the_signed_contributors_is_refused():
    server = _kahe_round(3)
    caps = _capsules(server)
    names = sorted(server.key_set.names)
    c1s, sigs = [caps[n][1] for n in names], [caps[n][2] for n in names]
    node = server.key_set.node_of(names[0])
    # one contributor's c1 left out, or two c1s swapped (each signature is over its own member's c1)
    _refused(_pdec_capsules(server, node, names, c1s[:2], sigs[:2]), "one capsule c1 per contributor")
    _refused(_pdec_capsules(server, node, names, [c1s[1], c1s[0], c1s[2]], [sigs[1], sigs[0], sigs[2]]),
             "did not sign this key capsule")
    # a non-canonical c1 (an extra polynomial) under a valid-looking signature is refused as well
    bad = rlwe.polys_to_bytes(P, np.concatenate([caps[names[1]][0].c1] * 2))
    _refused(_pdec_capsules(server, node, names, [c1s[0], bad, c1s[2]], sigs), "did not sign")
    # nothing was spent on the refusals: the honest request is served, once
    assert not _pdec_capsules(server, node, names, c1s, sigs).has_error()


def _correlated_capsule(server, victim, colluder):
    """The colluder's capsule replaced by −Σ_{i∈C∖{v,j}} capsule_i and re-signed with its roster key: the
    decryptors' C1 = Σ_{i∈C} c1_i is then c1_v, and the server's C0 is c0_v."""
    caps = _capsules(server)
    names = sorted(server.key_set.names)
    others = [n for n in names if n not in (victim, colluder)]
    level = compact.level_parameter_set(P, server.key_set.parameters.limbs)
    c0 = level.ring.neg(level.ring.sum(np.stack([caps[n][0].c0 for n in others])))
    c1 = P.ring.neg(P.ring.sum(np.stack([caps[n][0].c1 for n in others])))
    c1_bytes = rlwe.polys_to_bytes(P, c1)
    identity = NodeIdentity.load(f"{IDENTITY_DIR}/{colluder}.key")
    signature = keyset.sign_capsule(identity, key_id=server.key_set.key_id, transcript=server.key_set.transcript,
                                    round_=server.strategy._round.server_round,
                                    model_hash=xmk.model_hash(server.arrays), c1=c1_bytes)
    c1s = {n: caps[n][1] for n in names} | {colluder: c1_bytes}
    sigs = {n: caps[n][2] for n in names} | {colluder: signature}
    total_c0 = level.ring.add(c0, level.ring.sum(np.stack([caps[n][0].c0 for n in names if n != colluder])))
    return names, [c1s[n] for n in names], [sigs[n] for n in names], total_c0, caps


def _decrypt_capsule_sum(server, names, c1s, sigs, c0, active):
    replies = [_pdec_capsules(server, server.key_set.node_of(n), names, c1s, sigs, active=active) for n in active]
    for reply in replies:
        assert not reply.has_error(), reply.error.reason
    server.sent_attempt = {id(r): (r, 1) for r in replies}
    shares = [server.share(r) for r in replies]
    level = compact.level_parameter_set(P, server.key_set.parameters.limbs)
    raw = rlwe.combine(level, c0, shares)
    return replies, raw, level


def _strip_self_mask(server, replies, raw, level, victim, names):
    points = dict(zip(sorted(server.key_set.names), threshold.member_points(len(names), params=P)))
    seeds = {points[server.key_set.name_of(r.metadata.src_node_id)]:
             r.content[XMK_CONFIG_KEY]["seed-shares"][names.index(victim)] for r in replies}
    seed = threshold.combine_bytes(seeds, threshold=server.key_set.parameters.threshold)
    u = compact.switch_modulus(P, selfmask.self_mask(P, seed, 1), server.key_set.parameters.limbs)
    return level.ring.sub(raw, u)


def test_correlated_capsule_from_a_colluding_client_recovers_nothing():
    """Server + one colluding contributor (its roster key in the test's hand): the colluder's capsule cancels
    every other contributor's but the victim's. The victim's pairwise masks with its honest neighbours in C do
    not cancel: the decrypted key is uniform, and it does not round."""
    server = _kahe_round(5)
    names = sorted(server.key_set.names)
    victim, colluder = names[0], names[1]
    names, c1s, sigs, c0, _ = _correlated_capsule(server, victim, colluder)
    active = [n for n in names if n != colluder][: server.key_set.parameters.threshold]
    replies, raw, level = _decrypt_capsule_sum(server, names, c1s, sigs, c0, active)
    raw = _strip_self_mask(server, replies, raw, level, victim, names)
    approx = rlwe.decode(level, raw, scale_bits=server.key_set.parameters.scale_bits, length=P.n) * float(
        compact.dropped_modulus(P, server.key_set.parameters.limbs))
    with pytest.raises(kahe.KaheError):
        kahe.round_key_sum(approx)
    frac = np.abs(approx - np.rint(approx))
    assert 0.2 < np.mean(frac) < 0.3  # uniform fractional parts (E = 1/4): not a key of small integers


def test_control_without_pairwise_masks_the_correlated_capsule_recovers_the_key(monkeypatch):
    """The power of the test above: with the pairwise masks switched off, the same capsule gives k_v, which
    decrypts the victim's KAHE ciphertext."""
    monkeypatch.setattr(member_module.masking, "mask_plaintext", lambda params, plaintext, **kw: plaintext)
    server = _kahe_round(5)
    names = sorted(server.key_set.names)
    victim, colluder = names[0], names[1]
    names, c1s, sigs, c0, _ = _correlated_capsule(server, victim, colluder)
    active = [n for n in names if n != colluder][: server.key_set.parameters.threshold]
    replies, raw, level = _decrypt_capsule_sum(server, names, c1s, sigs, c0, active)
    raw = _strip_self_mask(server, replies, raw, level, victim, names)
    approx = rlwe.decode(level, raw, scale_bits=server.key_set.parameters.scale_bits, length=P.n) * float(
        compact.dropped_modulus(P, server.key_set.parameters.limbs))
    key = kahe.round_key_sum(approx)
    seed = kahe.public_seed(server.key_set.transcript, 1)
    total = kahe.KaheSum(server.key_set.parameters.kahe, seed, _victim_update(0).size - 1)
    reply = server.replies[server.key_set.node_of(victim)]
    total.add(array_bytes(reply.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext"))
    values, integers = total.decode(key)
    pid = _pid(victim)
    assert np.max(np.abs(values - num_examples(pid) * flat(update(pid, 1)))) < 1e-5
    assert int(integers[0]) == num_examples(pid)


def test_replayed_earlier_round_capsule_is_refused_and_ciphertext_decodes_to_noise():
    """Round 2 of a key set reused across rounds: the victim's round-1 capsule c1 and signature in place of its
    round-2 one is refused (signed for round 1); its round-1 KAHE ciphertext is refused by the round-2 sum (its
    seed tag), and with the tag rewritten it does not decode (fresh key, fresh a_j: the decoding's residual
    check fails) -- nothing of either round's update comes out."""
    server = _kahe_round(3)
    names = sorted(server.key_set.names)
    victim = names[0]
    node = server.key_set.node_of(victim)
    old_caps = _capsules(server)
    old_ct = array_bytes(server.replies[node].content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext")
    server.set_round(2, ArrayRecord([a + 1 for a in initial()]))
    server.use(server.key_set)
    server.train()
    server.sign()
    caps = _capsules(server)
    c1s = [old_caps[victim][1]] + [caps[n][1] for n in names[1:]]
    sigs = [old_caps[victim][2]] + [caps[n][2] for n in names[1:]]
    _refused(_pdec_capsules(server, server.key_set.node_of(names[1]), names, c1s, sigs), "did not sign")
    # the honest round-2 capsules decrypt K_C; the sum with the victim's round-1 KAHE ciphertext is noise
    level = compact.level_parameter_set(P, server.key_set.parameters.limbs)
    c0 = level.ring.sum(np.stack([caps[n][0].c0 for n in names]))
    replies, raw, level = _decrypt_capsule_sum(server, names, [caps[n][1] for n in names],
                                               [caps[n][2] for n in names], c0,
                                               names[: server.key_set.parameters.threshold])
    for name in names:
        raw = _strip_self_mask(server, replies, raw, level, name, names)
    approx = rlwe.decode(level, raw, scale_bits=server.key_set.parameters.scale_bits, length=P.n) * float(
        compact.dropped_modulus(P, server.key_set.parameters.limbs))
    key_sum = kahe.round_key_sum(approx)
    length = _victim_update(0).size - 1
    kp = server.key_set.parameters.kahe
    seed1, seed2 = (kahe.public_seed(server.key_set.transcript, r) for r in (1, 2))
    replayed = kahe.KaheSum(kp, seed2, length)
    with pytest.raises(kahe.KaheError, match="seed tag"):
        replayed.add(old_ct)
    assert replayed.count == 0
    old_tag, new_tag = kahe._seed_tag(kp, seed1), kahe._seed_tag(kp, seed2)
    assert old_ct.count(old_tag) == 1
    replayed.add(old_ct.replace(old_tag, new_tag))  # the server rewrites the public header
    for name in names[1:]:
        reply = server.replies[server.key_set.node_of(name)]
        replayed.add(array_bytes(reply.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext"))
    with pytest.raises(kahe.KaheError):
        replayed.decode(key_sum)
    # the control: the victim's round-2 ciphertext in its place decodes the round-2 sum exactly
    honest = kahe.KaheSum(kp, seed2, length)
    for name in names:
        reply = server.replies[server.key_set.node_of(name)]
        honest.add(array_bytes(reply.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext"))
    values, integers = honest.decode(key_sum)
    expected = sum(num_examples(_pid(n)) * flat(update(_pid(n), 2)) for n in names)
    assert np.max(np.abs(values - expected)) < 1e-5
    assert int(integers[0]) == sum(num_examples(_pid(n)) for n in names)


def test_key_sum_that_does_not_round_aborts_the_round_and_leaves_the_model(monkeypatch):
    """Capsules whose keys are off by 1/2 (a deviating client's, or a wrong decryption): K_C is not within 1/4
    of an integer, the server refuses to decode, and the model is unchanged."""
    real = member_module._capsule_plaintext

    def off_by_half(params, key, *, scale_bits, num_clients, kahe_params):
        return rlwe.encode(params, key.astype(np.float64) + 0.5, scale_bits=scale_bits, num_clients=num_clients)

    monkeypatch.setattr(member_module, "_capsule_plaintext", off_by_half)
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3, max_abs_value=1e4)
    result = run(grid, strategy)
    ((_, exc),) = strategy.aborted_attempts
    assert exc.step == "decoding" and all("from an integer" in r for r in exc.failed.values())
    # Flower's result holds no arrays when no round produced any: the global model is the initial one
    assert not len(result.arrays) or np.array_equal(flat(result.arrays.to_numpy_ndarrays()), flat(initial()))
    assert real is not off_by_half
