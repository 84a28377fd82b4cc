"""xMK-CKKS against a deviating server (issue 12; DESIGN.md §7), over the serializing grid.

The server holds no roster key: it runs the honest steps of :class:`XMKFedAvg`
where it wants to and crafts every other message itself. Each test plays one
attack; the clients refuse with a clear error, or what the server can compute
is independent of the victim's update (uniform mod q, uncorrelated).
"""

import copy
import dataclasses

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from identities import IDENTITY_DIR
from xmk_app import SHAPES, make_app, plain_fedavg, run
from xmk_app import flat as _flat
from xmk_app import initial as _initial
from xmk_app import num_examples as _num_examples
from xmk_app import update as _update

from flwr_fedeval import rlwe
from flwr_fedeval.identity import NodeIdentity
from flwr_fedeval.protocol import ReplyCode, array_bytes, bytes_array, xmk
from flwr_fedeval.protocol.xmk import (
    QUERY_XMK_CONTRIBUTORS,
    QUERY_XMK_PDEC,
    QUERY_XMK_REVEAL,
    QUERY_XMK_SHARES,
    XMK_C1_KEY,
    XMK_CIPHERTEXT_KEY,
    XMK_CONFIG_KEY,
    XMK_SHARE_KEY,
)
from flwr_fedeval.rlwe import compact, keyset, masking, selfmask, threshold
from flwr_fedeval.rlwe import serialization as ser
from flwr_fedeval.strategies.base import NodeNotConfigured
from flwr_fedeval.strategies.xmk_fedavg import RoundAborted, XMKFedAvg, _KeySet, _RoundState
from flwr_fedeval.testing import InProcessGrid

RUN_CONFIG = {"fedeval-identity-dir": IDENTITY_DIR}
LENGTH = sum(int(np.prod(s)) for s in SHAPES) + 1


class Server:
    """A server that runs :class:`XMKFedAvg`'s steps one by one and may deviate between them."""

    def __init__(self, num_nodes=3, node_configs=None, bulk="ckks"):
        self.grid = InProcessGrid(make_app(), num_nodes, RUN_CONFIG, node_configs=node_configs)
        self.nodes = list(self.grid.node_ids)
        # at the full L limbs (compaction is post-processing of c0 and D: tests/secagg/test_xmk_compact.py); every
        # weight under xMK-CKKS (bulk="ckks"): these attacks craft C1 from the uploads themselves (KAHE mode, where
        # the decryptors sum the signed capsule c1 themselves: tests/secagg/test_xmk_isolation.py)
        self.strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=num_nodes,
                                  max_abs_value=1e4, limbs=rlwe.DEFAULT_PARAMETER_SET.limbs, bulk=bulk)
        self.params = self.strategy.params
        self.set_round(1)

    def set_round(self, rnd, arrays=None):
        self.arrays = ArrayRecord(_initial()) if arrays is None else arrays
        self.strategy._round = _RoundState(rnd, self.arrays, ConfigRecord({"server-round": rnd}), self.grid)
        self.signatures = None

    # --- honest steps --------------------------------------------------------
    def commit(self, nodes=None):
        return self.strategy.commit(list(nodes or self.nodes))

    def keys(self, nodes=None):
        self.key_set = self.strategy.reveal(self.commit(nodes))
        return self.use(self.key_set)

    def use(self, key_set):
        """Step 1c (the key shares) for ``key_set`` in the current round."""
        self.key_set = key_set
        self.strategy._round.key_set = key_set
        self.strategy._round.inboxes = self.strategy.share_keys(key_set)
        return key_set

    def train_messages(self):
        return self.strategy.train_messages(self.key_set)

    def train(self, messages=None):
        replies = self.grid.send_and_receive(messages or self.train_messages())
        self.replies = {r.metadata.src_node_id: r for r in replies}
        return self.replies

    def ciphertexts(self):
        """Every upload, parsed strictly as a compact ciphertext at the key set's L' (= L here)."""
        out = {}
        for n, r in self.replies.items():
            data = array_bytes(r.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext")
            ct = compact.CompactCiphertext.from_bytes(data, self.params, self.key_set.parameters.limbs)
            out[n] = rlwe.Ciphertext(self.params, ct.c0, ct.c1)
        return out

    def honest_round(self):
        self.keys()
        self.train()
        self.cts = self.ciphertexts()
        return self.cts

    def sign(self, contributors=None):
        """Step 2b: every member's signature over C (default: the whole key set)."""
        names = list(self.key_set.names) if contributors is None else contributors
        self.signatures = {}
        for node, name in zip(self.key_set.nodes, self.key_set.names):
            reply = self.send(node, QUERY_XMK_CONTRIBUTORS, {
                "key-id": self.key_set.key_id, "round": self.strategy._round.server_round,
                "model-hash": xmk.model_hash(self.arrays), "contributors": names})
            if not reply.has_error():
                self.signatures[name] = reply.content[XMK_CONFIG_KEY]["signature"]
        return self.signatures

    # --- crafted messages ------------------------------------------------------
    def send(self, node, message_type, config, extra=None):
        content = RecordDict({XMK_CONFIG_KEY: ConfigRecord(config), **(extra or {})})
        msg = Message(content=content, dst_node_id=node, message_type=message_type)
        return list(self.grid.send_and_receive([msg]))[0]

    def pdec(self, node, c1=None, *, raw=None, contributors=None, rnd=None, num_clients=None, active=None,
             signatures=None, limbs=None, attempt=None):
        """``query.xmk_pdec`` for polynomials ``c1``, or for ``raw`` (bytes, or an Array as is); signed by every
        member for the whole key set (step 2b, once per round) unless ``signatures`` says otherwise. The attempt
        index k is by default 1 + the shares this node gave in the round (as it sees an honest server's
        attempts), at most a."""
        ks = self.key_set
        rnd = self.strategy._round.server_round if rnd is None else rnd
        answered = getattr(self, "answered", {})
        if attempt is None:
            attempt = min(answered.get((ks.key_id, rnd, node), 0) + 1, ks.parameters.decryption_attempts)
        if signatures is None:
            signatures = self.signatures if self.signatures is not None else self.sign()
        names = list(ks.names) if contributors is None else contributors
        config = {"params": self.params.name, "key-id": ks.key_id, "round": rnd, "attempt": attempt,
                  "contributors": names, "num-clients": len(ks.names) if num_clients is None else num_clients,
                  "limbs": ks.parameters.limbs if limbs is None else limbs,
                  "model-hash": xmk.model_hash(self.arrays), "contributor-signers": list(signatures),
                  "contributor-signatures": list(signatures.values()),
                  "active": sorted(ks.names) if active is None else active}
        if raw is None:
            raw = rlwe.polys_to_bytes(self.params, c1)
        array = bytes_array(raw) if isinstance(raw, bytes) else raw
        reply = self.send(node, QUERY_XMK_PDEC, config, {XMK_C1_KEY: ArrayRecord({"c1": array})})
        if not reply.has_error():
            self.answered = {**answered, (ks.key_id, rnd, node): answered.get((ks.key_id, rnd, node), 0) + 1}
            self.sent_attempt = {**getattr(self, "sent_attempt", {}), id(reply): (reply, attempt)}
        return reply

    def share(self, reply):
        """The share of a reply, parsed strictly at the level of its attempt (L' for k = 1, L for a retry)."""
        assert not reply.has_error(), reply.error.reason
        self.last_replies = getattr(self, "last_replies", []) + [reply]
        limbs = threshold.share_limbs(self.params, self.key_set.parameters.limbs, self.sent_attempt[id(reply)][1])
        level = compact.level_parameter_set(self.params, limbs)
        return rlwe.DecryptionShare.from_bytes(array_bytes(reply.content[XMK_SHARE_KEY], XMK_SHARE_KEY, "share"), level)

    def without_self_masks(self, raw, replies, only=None):
        """``raw`` minus the self-masks of the contributors (those in ``only``, default all), reconstructed from
        the seed shares the decryptors gave for the signed C = the whole key set (what a server legitimately
        gets; the pairwise masks are what protects a single update)."""
        names = list(self.key_set.names)
        points = dict(zip(sorted(self.key_set.names), range(1, len(self.key_set.names) + 1)))
        seeds = {name: {} for name in names}
        for reply in replies:
            x = points[self.key_set.name_of(reply.metadata.src_node_id)]
            for name, part in zip(names, reply.content[XMK_CONFIG_KEY]["seed-shares"]):
                seeds[name][x] = part
        for name in names if only is None else only:
            seed = threshold.combine_bytes(seeds[name], threshold=self.key_set.parameters.threshold)
            raw = self.params.ring.sub(raw, selfmask.self_mask(self.params, seed, raw.shape[0]))
        return raw


def _refused(reply, *fragments):
    assert reply.has_error(), "the client must refuse"
    for fragment in fragments:
        assert fragment in reply.error.reason, reply.error.reason
    return reply.error.reason


def _train_refusals(server, messages):
    replies = server.train(messages)
    return {n: r.error.reason if r.has_error() else None for n, r in replies.items()}


def _assert_independent_of(decoded_raw, params, update):
    """The decoded vector is uniform mod q and uncorrelated with ``update``."""
    frac = params.ring.to_centered_float(decoded_raw, 0).ravel()[: update.size] / (params.q / 2)
    assert np.mean(np.abs(frac)) == pytest.approx(0.5, abs=0.05)  # uniform on (-1, 1): E|u| = 1/2
    assert np.mean(np.abs(frac) < 1e-6) < 0.01  # nowhere near a small (fixed-point) value
    assert abs(np.corrcoef(frac, update)[0, 1]) < 0.15  # 1,048 values: sd of r ~ 0.03


def _victim_update(partition_id):
    return np.append(_num_examples(partition_id) * _flat(_update(partition_id, 1)), _num_examples(partition_id))


# ---------------------------------------------------------------------------------------------
# Honest run and the canonical baseline
# ---------------------------------------------------------------------------------------------
def test_honest_steps_decrypt_the_full_sum():
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    shares = [server.share(server.pdec(n, total.c1)) for n in server.nodes]
    scale = server.strategy.protocol.scale_bits_for(3)
    raw = server.without_self_masks(rlwe.combine(server.params, total.c0, shares), server.last_replies)
    got = rlwe.decode(server.params, raw, scale_bits=scale, length=LENGTH)
    expected = np.sum([_victim_update(p) for p in range(3)], axis=0)
    assert got[-1] == pytest.approx(expected[-1], abs=1e-6)  # Σ n_i
    assert np.max(np.abs(got[:-1] / got[-1] - expected[:-1] / expected[-1])) < 1e-6  # the weighted mean
    assert sorted(server.key_set.names) == ["node-0", "node-1", "node-2"]


# ---------------------------------------------------------------------------------------------
# Key sets: signed commitments, reveal, consistency
# ---------------------------------------------------------------------------------------------
def _reveal_config(committed, **changes):
    """A reveal request of ``committed`` with valid public parameters for its size (scale, bound, t)."""
    config = {"key-id": committed.key_id, "round": committed.round, "signers": list(committed.names),
              "commitments": list(committed.commitments), "signatures": list(committed.signatures),
              "mask-degree": 0, "max-abs-value": 1e4, "bulk": "ckks", "fractional-bits": 0}
    config.update(changes)
    n = len(config["signers"])
    config.setdefault("scale-bits", rlwe.max_scale_bits(rlwe.DEFAULT_PARAMETER_SET, num_clients=n,
                                                        max_abs_value=config["max-abs-value"]))
    config.setdefault("threshold", n // 2 + 1)
    config.setdefault("limbs", rlwe.DEFAULT_PARAMETER_SET.limbs)
    config.setdefault("decryption-attempts", rlwe.MAX_DECRYPTION_ATTEMPTS)
    return config


def _rogue_commitment(committed, params):
    """A share and mask key the server controls, and their commitment."""
    a = rlwe.expand_a(params, committed.seed_a)
    _, share = rlwe.keygen(params, a)
    _, mask_public = masking.new_mask_keypair()
    return share.to_bytes(), mask_public, keyset.commitment(committed.key_id, share.to_bytes(), mask_public)


def test_rogue_share_in_place_of_a_members_commitment_is_refused():
    server = Server(3)
    committed = server.commit()
    _, _, rogue = _rogue_commitment(committed, server.params)
    hs = list(committed.commitments)
    hs[0] = rogue  # keeps node-0's signature, which is over its real commitment
    for node in server.nodes[1:]:
        _refused(server.send(node, QUERY_XMK_REVEAL, _reveal_config(committed, commitments=hs)),
                 "IdentityError", "does not verify")


def test_rogue_share_signed_with_a_key_outside_the_roster_is_refused():
    server = Server(3)
    committed = server.commit()
    _, _, rogue = _rogue_commitment(committed, server.params)
    outsider = NodeIdentity.generate(committed.names[0])  # same name, the server's own key
    sig = keyset.sign_commitment(outsider, key_id=committed.key_id, round_=committed.round, commitment_=rogue)
    hs, sigs = list(committed.commitments), list(committed.signatures)
    hs[0], sigs[0] = rogue, sig
    reason = _refused(server.send(server.nodes[1], QUERY_XMK_REVEAL,
                                  _reveal_config(committed, commitments=hs, signatures=sigs)), "does not verify")
    assert committed.names[0] in reason
    # an added member under a name the roster does not know
    stranger = NodeIdentity.generate("node-99")
    sig = keyset.sign_commitment(stranger, key_id=committed.key_id, round_=committed.round, commitment_=rogue)
    config = _reveal_config(committed, signers=list(committed.names) + ["node-99"],
                            commitments=list(committed.commitments) + [rogue],
                            signatures=list(committed.signatures) + [sig])
    _refused(server.send(server.nodes[1], QUERY_XMK_REVEAL, config), "unknown signer", "node-99")


def test_unsigned_duplicate_and_foreign_session_commitments_are_refused():
    server = Server(3)
    committed = server.commit()
    sigs = list(committed.signatures)
    sigs[2] = b""
    _refused(server.send(server.nodes[1], QUERY_XMK_REVEAL, _reveal_config(committed, signatures=sigs)), "missing")
    names = list(committed.names)
    dup = _reveal_config(committed, signers=names + [names[0]],
                         commitments=list(committed.commitments) + [committed.commitments[0]],
                         signatures=list(committed.signatures) + [committed.signatures[0]])
    _refused(server.send(server.nodes[1], QUERY_XMK_REVEAL, dup), "twice")
    # commitments of an earlier key set replayed into a new one: signed for another key-set id
    other = server.commit()
    _refused(server.send(server.nodes[2], QUERY_XMK_REVEAL,
                         _reveal_config(other, commitments=list(committed.commitments),
                                        signatures=list(committed.signatures))),
             "does not verify")


def test_key_set_without_the_client_or_below_its_floor_is_refused():
    configs = [{"partition-id": i, "num-partitions": 3, "fedeval-min-clients": 3} for i in range(3)]
    server = Server(3, node_configs=configs)
    committed = server.commit()
    # only two members (the client and one other): below the client's own floor of 3
    pair = _reveal_config(committed, signers=list(committed.names[:2]), commitments=list(committed.commitments[:2]),
                          signatures=list(committed.signatures[:2]))
    _refused(server.send(server.nodes[0], QUERY_XMK_REVEAL, pair), "KeySetError", "requires at least 3")
    # a key set that leaves the client out
    others = _reveal_config(committed, signers=list(committed.names[1:]), commitments=list(committed.commitments[1:]),
                            signatures=list(committed.signatures[1:]))
    _refused(server.send(server.nodes[0], QUERY_XMK_REVEAL, others), "does not list this member")


def test_floor_is_enforced_by_the_train_mod_too():
    server = Server(3)
    server.keys()
    for ctx in server.grid.contexts.values():
        ctx.node_config["fedeval-min-clients"] = 4  # the operator raised the floor after the reveal
    refusals = _train_refusals(server, server.train_messages())
    assert all(r and "requires at least 4" in r for r in refusals.values()), refusals


def test_share_substituted_after_commitment_is_refused_by_every_client():
    """Key substitution of b_i: the server swaps one member's revealed share for one it controls."""
    server = Server(3)
    committed = server.commit()
    server.use(server.strategy.reveal(committed))
    share, _, _ = _rogue_commitment(committed, server.params)
    messages = server.train_messages()
    for msg in messages:
        shares = list(msg.content[XMK_CONFIG_KEY]["public-shares"])
        shares[0] = share
        msg.content[XMK_CONFIG_KEY]["public-shares"] = shares
    refusals = _train_refusals(server, messages)
    assert all(r and "does not match its signed commitment" in r for r in refusals.values()), refusals


def test_mask_key_substituted_after_commitment_is_refused():
    """Key substitution of an X25519 mask key (the server would know that member's pairwise masks)."""
    server = Server(3)
    server.keys()
    server_key = X25519PrivateKey.generate().public_key().public_bytes_raw()
    messages = server.train_messages()
    for msg in messages:
        keys = list(msg.content[XMK_CONFIG_KEY]["mask-keys"])
        keys[1] = server_key
        msg.content[XMK_CONFIG_KEY]["mask-keys"] = keys
    refusals = _train_refusals(server, messages)
    assert all(r and "does not match its signed commitment" in r for r in refusals.values()), refusals


def test_share_chosen_after_seeing_the_others_is_refused():
    """A colluding member (its roster key in the test's hand) picks b_j = b' − Σ_{i≠j} b_i after the reveal."""
    server = Server(3)
    committed = server.commit()
    ks = server.use(server.strategy.reveal(committed))
    params = server.params
    a = rlwe.expand_a(params, ks.parameters.seed_a)
    server_secret, server_pk = rlwe.keygen(params, a)  # b' = -s' a + e': the joint key would be the server's
    others = [rlwe.PublicKey.from_bytes(b, params) for b in ks.shares[1:]]
    rogue_b = params.ring.sub(server_pk.b, rlwe.aggregate_public_keys(others).b)
    rogue = rlwe.PublicKey(params, rogue_b, 1).to_bytes()
    colluder = NodeIdentity.load(f"{IDENTITY_DIR}/{ks.names[0]}.key")
    mask_key = ks.mask_keys[0]
    h = keyset.commitment(ks.key_id, rogue, mask_key)
    # validly signed
    sig = keyset.sign_commitment(colluder, key_id=ks.key_id, round_=ks.parameters.round, commitment_=h)
    # (a) the honest members already revealed: a second reveal with the new commitment is refused
    hs, sigs = list(committed.commitments), list(committed.signatures)
    hs[0], sigs[0] = h, sig
    for node in server.nodes[1:]:
        _refused(server.send(node, QUERY_XMK_REVEAL, _reveal_config(committed, commitments=hs, signatures=sigs)),
                 "already revealed")
    # (b) the rogue share at the train step does not match the commitment the members stored
    messages = server.train_messages()
    for msg in messages:
        shares = list(msg.content[XMK_CONFIG_KEY]["public-shares"])
        shares[0] = rogue
        msg.content[XMK_CONFIG_KEY]["public-shares"] = shares
    refusals = _train_refusals(server, messages)
    for node in server.nodes[1:]:
        assert refusals[node] and "does not match its signed commitment" in refusals[node]
    # had the members accepted it, the joint key would be the server's: b = b' (Eq. 1)
    assert np.array_equal(params.ring.add(rogue_b, rlwe.aggregate_public_keys(others).b), server_pk.b)
    assert server_secret.s.shape == (params.n,)


def test_members_shown_different_key_sets_refuse_to_encrypt():
    """Split view: node 0 is shown {0, 1}, node 1 and 2 are shown {0, 1, 2}."""
    server = Server(3)
    committed = server.commit()
    full = _reveal_config(committed)
    pair = _reveal_config(committed, signers=list(committed.names[:2]), commitments=list(committed.commitments[:2]),
                          signatures=list(committed.signatures[:2]))
    reveals = {server.nodes[0]: server.send(server.nodes[0], QUERY_XMK_REVEAL, pair)}
    for node in server.nodes[1:]:
        reveals[node] = server.send(node, QUERY_XMK_REVEAL, full)
    recs = {n: r.content[XMK_CONFIG_KEY] for n, r in reveals.items()}
    assert recs[server.nodes[0]]["transcript"] != recs[server.nodes[1]]["transcript"]
    pair_ks = dict(names=committed.names[:2], nodes=server.nodes[:2])
    config = {"params": server.params.name, "key-id": committed.key_id, "round": 1,
              "signers": list(pair_ks["names"]),
              "public-shares": [recs[n]["public-share"] for n in pair_ks["nodes"]],
              "mask-keys": [recs[n]["mask-key"] for n in pair_ks["nodes"]],
              "transcript-signatures": [recs[n]["transcript-signature"] for n in pair_ks["nodes"]]}
    # refused at the key-shares step, before any share (or any training): T is checked first
    _refused(server.send(server.nodes[0], QUERY_XMK_SHARES, config), "did not confirm the key set",
             committed.names[1])


def test_keygen_with_a_key_id_not_derived_from_the_seed_or_reused_is_refused():
    server = Server(2)
    node = server.nodes[0]
    seed = rlwe.new_public_seed()
    base = {"params": server.params.name, "seed-a": seed, "round": 1}
    _refused(server.send(node, "query.xmk_keygen", {**base, "key-id": "0" * 32}), "is not H(params, seed-a)")
    kid = keyset.key_set_id(server.params, seed)
    assert not server.send(node, "query.xmk_keygen", {**base, "key-id": kid}).has_error()
    _refused(server.send(node, "query.xmk_keygen", {**base, "key-id": kid}), "already committed")
    weak = {"params": "no-such-set", "seed-a": seed, "round": 1, "key-id": kid}
    _refused(server.send(node, "query.xmk_keygen", weak), "unknown parameter set")


def test_client_without_identity_refuses_with_the_config_keys_to_set():
    """A configuration refusal (code NOT_CONFIGURED) is terminal, not a RoundAborted to retry (issue 23
    item 4): the error names the keys to set."""
    grid = InProcessGrid(make_app(), 2)  # no fedeval-identity-dir
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=2, max_abs_value=1e4,
                         max_attempts=1)
    strategy._round = _RoundState(1, ArrayRecord(_initial()), ConfigRecord({}), grid)
    with pytest.raises(NodeNotConfigured) as info:
        strategy.commit(list(grid.node_ids))
    assert sorted(info.value.failures) == sorted(grid.node_ids)
    assert {f.code for f in info.value.failures.values()} == {int(ReplyCode.NOT_CONFIGURED)}
    assert set(info.value.keys) == {"node config fedeval-identity-key", "node config fedeval-roster",
                                    "run config fedeval-identity-dir"}


# ---------------------------------------------------------------------------------------------
# Partial decryption: crafted C1, one decryption per key set and round, canonical encodings
# ---------------------------------------------------------------------------------------------
def _decrypt_everywhere(server, c1_for):
    """Ask every member once, each for the C1 ``c1_for(node)``; the server's combination."""
    return [server.share(server.pdec(n, c1_for(n))) for n in server.nodes]


@pytest.mark.parametrize("offset", ["constant", "monomial"])
def test_own_c1_plus_offset_yields_only_uniform_noise(offset):
    """The attack of issue 12: C1 = c1_V + 1 (or + X^k) gets the victim's share; the decryption is masked."""
    server = Server(3)
    cts = server.honest_round()
    victim = server.nodes[0]
    ct = cts[victim]
    delta = server.params.ring.zeros((ct.num_polys,))
    if offset == "constant":
        delta[:, :, 0] = 1
    else:
        delta[:, :, 17] = 1
    crafted = server.params.ring.add(ct.c1, delta)
    shares = _decrypt_everywhere(server, lambda n: crafted if n == victim else ct.c1)
    raw = server.without_self_masks(rlwe.combine(server.params, ct.c0, shares), server.last_replies,
                                    [server.key_set.name_of(victim)])
    _assert_independent_of(raw, server.params, _victim_update(0))


def test_sum_with_a_missing_contributor_is_uniform():
    """A dropped (or left-out) member's mask makes every partial sum useless."""
    server = Server(4)
    cts = server.honest_round()
    partial = rlwe.add_ciphertexts([cts[n] for n in server.nodes[:3]])
    shares = _decrypt_everywhere(server, lambda n: partial.c1)
    raw = rlwe.combine(server.params, partial.c0, shares)
    raw = server.without_self_masks(raw, server.last_replies, list(server.key_set.names[:3]))
    _assert_independent_of(raw, server.params, np.sum([_victim_update(p) for p in range(3)], axis=0))
    _assert_independent_of(raw, server.params, _victim_update(0))


def test_second_decryption_request_is_refused_whatever_c1():
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    node = server.nodes[1]
    server.share(server.pdec(node, cts[server.nodes[0]].c1))  # first request: anything
    _refused(server.pdec(node, total.c1), "already decrypted once")  # even the honest C1
    _refused(server.pdec(node, cts[server.nodes[2]].c1), "already decrypted once")
    # a replay for another round is refused too
    _refused(server.pdec(node, total.c1, rnd=0), "holds no decryption share")
    _refused(server.pdec(node, total.c1, rnd=2), "holds no decryption share")


def test_replayed_request_of_an_earlier_round_is_refused_with_reused_keys():
    """With rekey="per-client-set" the key set survives rounds; masks and the decryption budget do not."""
    server = Server(3)
    cts1 = server.honest_round()
    total1 = rlwe.add_ciphertexts(list(cts1.values()))
    for n in server.nodes:
        server.share(server.pdec(n, total1.c1))
    round2 = ArrayRecord([a + 1 for a in _initial()])  # round 2 trains on a new global model
    server.set_round(2, round2)
    server.use(server.key_set)
    server.train()
    cts2 = server.ciphertexts()
    node = server.nodes[0]
    _refused(server.pdec(node, total1.c1, rnd=1), "holds no decryption share")  # the round-1 request, replayed
    # the same round and model again (a train replay, with fresh shares or not) is refused: no retries
    signatures = server.signatures  # each member signs one contributor set per key set and round
    server.set_round(2, round2)
    server.signatures = signatures
    server.strategy._round.key_set = server.key_set
    refusals = _train_refusals(server, server.train_messages())
    assert all(r and "no retries" in r for r in refusals.values()), refusals
    # round 2 masks differ from round 1 masks: the two rounds' ciphertexts of a client are unrelated
    total2 = rlwe.add_ciphertexts(list(cts2.values()))
    server.last_replies = []
    shares = [server.share(server.pdec(n, total2.c1)) for n in server.nodes]
    raw = server.without_self_masks(rlwe.combine(server.params, total2.c0, shares), server.last_replies)
    got = rlwe.decode(server.params, raw, scale_bits=server.strategy.protocol.scale_bits_for(3), length=LENGTH)
    assert np.max(np.abs(got[-1] - sum(_num_examples(p) for p in range(3)))) < 1e-6


def _header_variant(data, **fields):
    magic, version, kind, limbs, n, count, pid, aux = ser._HEADER.unpack_from(data)
    values = dict(magic=magic, version=version, kind=kind, limbs=limbs, n=n, count=count, pid=pid, aux=aux)
    values.update(fields)
    return ser._HEADER.pack(*values.values()) + data[ser.HEADER_SIZE:]


def _unreduced(params, c1):
    """A C1 whose first residue 5 is written as 5 + q_0 (it still fits the bit width): same ring element."""
    c1 = c1.copy()
    c1[0, 0, 0] = 5
    data = bytearray(rlwe.polys_to_bytes(params, c1))
    bits = params.primes[0].bit_length()
    first = int.from_bytes(data[ser.HEADER_SIZE:ser.HEADER_SIZE + bits], "little")
    assert first & ((1 << bits) - 1) == 5 and 5 + params.primes[0] < (1 << bits)
    first = (first & ~((1 << bits) - 1)) | (5 + params.primes[0])
    data[ser.HEADER_SIZE:ser.HEADER_SIZE + bits] = first.to_bytes(bits, "little")
    return bytes(data)


@pytest.mark.parametrize(
    "variant, fragment",
    [
        ("aux", "aux is 1"),
        ("count", "count is"),
        ("params", "params_id"),
        ("version", "version"),
        ("kind", "kind"),
        ("truncated", "payload length"),
        ("padded", "payload length"),
        ("unreduced", ">= q_0"),
        ("dtype", "uint8"),
    ],
)
def test_re_encoded_c1_is_refused(variant, fragment):
    server = Server(3)
    cts = server.honest_round()
    params = server.params
    total = rlwe.add_ciphertexts(list(cts.values()))
    good = rlwe.polys_to_bytes(params, total.c1)
    raw = {
        "aux": lambda: _header_variant(good, aux=1),
        "count": lambda: rlwe.polys_to_bytes(params, np.concatenate([total.c1, total.c1[:1]])),
        "params": lambda: _header_variant(good, pid=b"xmk-n4096-q93".ljust(32, b"\0")),
        "version": lambda: _header_variant(good, version=2),
        "kind": lambda: _header_variant(good, kind=ser.KIND_DECRYPTION_SHARE),
        "truncated": lambda: good[:-1],
        "padded": lambda: good + b"\0",
        "unreduced": lambda: _unreduced(params, total.c1),
        "dtype": None,
    }[variant]
    node = server.nodes[1]
    if variant == "dtype":
        reply = server.pdec(node, raw=Array(np.frombuffer(good[: len(good) // 2 * 2], dtype=np.uint16).copy()))
    else:
        reply = server.pdec(node, raw=raw())
    _refused(reply, fragment)
    # the refusal used no decryption: the honest C1 is still served, once
    server.share(server.pdec(node, total.c1))


@pytest.mark.parametrize("contributors, fragment", [
    ("missing", "did not sign this contributor set"),
    ("added", "['node-9'] are not members"),
    ("duplicate", "duplicates"),
    ("node-ids", "not members"),
])
def test_fake_or_missing_contributors_are_refused(contributors, fragment):
    server = Server(3)
    cts = server.honest_round()
    total = rlwe.add_ciphertexts(list(cts.values()))
    names = list(server.key_set.names)
    crafted = {
        "missing": names[:2],
        "added": names + ["node-9"],
        "duplicate": names + [names[0]],
        "node-ids": [str(n) for n in server.nodes],
    }[contributors]
    _refused(server.pdec(server.nodes[0], total.c1, contributors=crafted), fragment)
    _refused(server.pdec(server.nodes[0], total.c1, num_clients=2), "num-clients")
    server.share(server.pdec(server.nodes[0], total.c1))  # nothing was spent on the refused requests


def test_own_c1_is_refused():
    server = Server(3)
    cts = server.honest_round()
    _refused(server.pdec(server.nodes[0], cts[server.nodes[0]].c1), "own c1")


def test_decryption_for_an_unknown_key_set_is_refused():
    server = Server(3)
    server.honest_round()
    total = rlwe.add_ciphertexts(list(server.cts.values()))
    forged = copy.copy(server.key_set.parameters)  # the request names a key set no member holds
    object.__setattr__(forged, "key_id", "f" * 32)
    server.key_set = dataclasses.replace(server.key_set, parameters=forged)
    _refused(server.pdec(server.nodes[0], total.c1), "no key for key set")


def test_strategy_names_the_node_whose_opening_does_not_match_and_reruns_without_it():
    """An honest server aborts early, naming a member whose reveal breaks its commitment."""
    def fault(node, msg, reply):
        if node == bad["node"] and msg.metadata.message_type == QUERY_XMK_REVEAL and not reply.has_error():
            reply.content[XMK_CONFIG_KEY]["mask-key"] = bytes(32)
        return reply

    bad = {}
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG, fault=fault)
    bad["node"] = grid.node_ids[1]
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=3, max_abs_value=1e4)
    result = run(grid, strategy)
    _, exc = strategy.aborted_attempts[0]
    assert exc.step == "key reveal" and list(exc.failed) == [bad["node"]]
    assert "does not match the node's commitment" in exc.failed[bad["node"]]
    expected = plain_fedavg(_initial(), [0, 2], 1)
    assert np.max(np.abs(_flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6


def _own_c1_to_the_others(server, victim):
    """The attack threshold decryption allows: A = t members without the victim, each sent C1 = c1_V (they
    cannot tell it from a sum), for the contributor set every member signed; the server then removes the
    self-masks of C from the seed shares it is given. What is left of m_V is its pairwise mask r_V."""
    cts = server.honest_round()
    ct = cts[victim]
    others = sorted(set(server.key_set.names) - {server.key_set.name_of(victim)})
    active = others[: server.key_set.parameters.threshold]
    server.last_replies = []
    shares = [server.share(server.pdec(server.key_set.node_of(name), ct.c1, active=active)) for name in active]
    return server.without_self_masks(rlwe.combine(server.params, ct.c0, shares), server.last_replies,
                                     [server.key_set.name_of(victim)])


def test_c1_of_one_client_decrypted_by_the_others_is_uniform():
    server = Server(3)
    raw = _own_c1_to_the_others(server, server.nodes[0])
    _assert_independent_of(raw, server.params, _victim_update(0))


def test_control_without_masks_the_own_c1_attack_recovers_the_update(monkeypatch):
    """The power of the test above: with the pairwise masks switched off, the same requests decrypt the
    victim's update."""
    import flwr_fedeval.secagg.member as member_module

    monkeypatch.setattr(member_module.masking, "mask_plaintext", lambda params, plaintext, **kw: plaintext)
    server = Server(3)
    raw = _own_c1_to_the_others(server, server.nodes[0])
    got = rlwe.decode(server.params, raw, scale_bits=server.strategy.protocol.scale_bits_for(3), length=LENGTH)
    assert np.max(np.abs(got - _victim_update(0))) < 1e-4
    with pytest.raises(AssertionError):
        _assert_independent_of(raw, server.params, _victim_update(0))


# ---------------------------------------------------------------------------------------------
# Mask graph of degree k (SecAgg+): the server cannot lower k below a client's floor or choose it per client
# ---------------------------------------------------------------------------------------------
def _configs(num_nodes, **extra):
    return [{"partition-id": i, "num-partitions": num_nodes, **extra} for i in range(num_nodes)]


def test_honest_sparse_graph_round_equals_weighted_fedavg():
    grid = InProcessGrid(make_app(), 7, RUN_CONFIG, node_configs=_configs(7, **{"fedeval-xmk-mask-degree": 2}))
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=7, max_abs_value=1e4,
                         mask_degree=2)
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    got = _flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - plain_fedavg(_initial(), range(7), 1))) <= 1e-6


def test_degree_below_the_client_floor_is_refused():
    server = Server(6)  # clients' floor: the default xmk-mask-degree (4)
    server.strategy.protocol = dataclasses.replace(server.strategy.protocol, mask_degree=2)
    committed = server.commit()
    _refused(server.send(server.nodes[0], QUERY_XMK_REVEAL, _reveal_config(committed, **{"mask-degree": 2})),
             "MaskKeyError", "requires at least 4")
    assert not server.send(server.nodes[1], QUERY_XMK_REVEAL,
                           _reveal_config(committed, **{"mask-degree": 4})).has_error()
    for bad in (-1, 2.5, "4"):
        _refused(server.send(server.nodes[2], QUERY_XMK_REVEAL, _reveal_config(committed, **{"mask-degree": bad})),
                 "integer")
    missing = _reveal_config(committed)
    del missing["mask-degree"]
    _refused(server.send(server.nodes[3], QUERY_XMK_REVEAL, missing), "mask-degree")
    # an operator who demands the complete graph (node config 0) refuses any sparse one
    server = Server(6, node_configs=_configs(6, **{"fedeval-xmk-mask-degree": 0}))
    committed = server.commit()
    _refused(server.send(server.nodes[0], QUERY_XMK_REVEAL, _reveal_config(committed, **{"mask-degree": 4})),
             "requires at least 5")
    assert not server.send(server.nodes[0], QUERY_XMK_REVEAL,
                           _reveal_config(committed, **{"mask-degree": 0})).has_error()


def test_different_degrees_for_different_clients_are_refused_at_train():
    """The degree is in the signed transcript: a client shown another degree confirms another key set."""
    server = Server(6)
    committed = server.commit()
    # the server shows the last client degree 5, the others 4: every reveal passes its floor of 4
    replies = {n: server.send(n, QUERY_XMK_REVEAL, _reveal_config(committed, **{"mask-degree": d}))
               for n, d in zip(server.nodes, [4, 4, 4, 4, 4, 5])}
    assert not any(r.has_error() for r in replies.values())
    recs = [replies[n].content[XMK_CONFIG_KEY] for n in server.nodes]
    assert len({bytes(r["transcript"]) for r in recs}) == 2
    server.key_set = _KeySet(server.strategy.protocol.key_set_parameters(len(server.nodes), key_id=committed.key_id,
                      seed_a=committed.seed_a, round_=committed.round), tuple(server.nodes), committed.names,
                             tuple(bytes(r["public-share"]) for r in recs),
                             tuple(bytes(r["mask-key"]) for r in recs),
                             tuple(bytes(r["transcript-signature"]) for r in recs))
    server.strategy._round.key_set = server.key_set
    with pytest.raises(RoundAborted) as info:  # refused at the key-shares step: T is checked first
        server.strategy.share_keys(server.key_set)
    assert set(info.value.failed) == set(server.nodes)
    assert all("did not confirm the key set" in reason for reason in info.value.failed.values()), info.value.failed


def test_partial_sum_over_a_closed_neighbourhood_is_uniform():
    """Sparse graph (M = 6, k = 2): the victim and all its neighbours still miss masks of edges leaving the set."""
    server = Server(6, node_configs=_configs(6, **{"fedeval-xmk-mask-degree": 2}))
    server.strategy.protocol = dataclasses.replace(server.strategy.protocol, mask_degree=2)
    committed = server.commit()
    server.use(server.strategy.reveal(committed))
    server.train()
    cts = server.ciphertexts()
    graph = masking.mask_neighbours(committed.names, 2, server.key_set.transcript)
    node_of = dict(zip(committed.names, server.nodes))
    victim = committed.names[0]
    closed = [victim, *graph[victim]]
    assert len(closed) == 3
    partial = rlwe.add_ciphertexts([cts[node_of[n]] for n in closed])
    shares = _decrypt_everywhere(server, lambda n: partial.c1)
    raw = server.without_self_masks(rlwe.combine(server.params, partial.c0, shares), server.last_replies, closed)
    pids = [int(n.split("-")[1]) for n in closed]  # identities node-p belong to partition p
    _assert_independent_of(raw, server.params, np.sum([_victim_update(p) for p in pids], axis=0))
