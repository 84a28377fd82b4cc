"""The server folds, unmasks and decodes a range of polynomials at a time (issue 21 item 3: server memory).

The ranges change where the bytes live, never a result or a check: the chunked fold is bit-identical
to the whole one, a malformed reply adds nothing, and the masks rebuilt by range are the clients'.
"""

import numpy as np
import pytest
import xmk_app
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import array_bytes, bytes_array
from flwr_fedeval.protocol.xmk import XMK_CIPHERTEXT_KEY
from flwr_fedeval.rlwe import compact, masking, selfmask
from flwr_fedeval.secagg.server import RunningSum, add_ranges
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid

PARAMS = rlwe.DEFAULT_PARAMETER_SET
LIMBS = 2  # L' of the default set at M = 10 (c0 and the shares), c1 at L = 4
K = 5  # polynomials per ciphertext


def _ciphertexts(count, k=K):
    """``count`` real compact ciphertexts' bytes of k polynomials under one key."""
    a = rlwe.expand_a(PARAMS, rlwe.new_public_seed())
    _, public = rlwe.keygen(PARAMS, a)
    scale_bits = rlwe.max_scale_bits(PARAMS, num_clients=10, max_abs_value=1.0)
    rng = np.random.default_rng(3)  # test data, not key material
    out = []
    for _ in range(count):
        x = rng.uniform(-1, 1, k * PARAMS.n - 3)
        ct = rlwe.encrypt(PARAMS, public, a, rlwe.encode(PARAMS, x, scale_bits=scale_bits, num_clients=10))
        out.append(compact.compress_ciphertext(ct, LIMBS).to_bytes())
    return out


def _bad_last_residue(data):
    """The ciphertext with its last residue (c1, last limb, last polynomial) set to 2^b - 1 >= q_{L-1}."""
    bad = bytearray(data)
    bad[-8:] = b"\xff" * 8
    return bytes(bad)


def test_chunked_fold_is_bit_identical_to_the_whole_and_to_the_parsed_sum():
    cts = _ciphertexts(3)
    sums = {}
    for chunk in (1, 2, K, 64):
        running = RunningSum(PARAMS, LIMBS, K, chunk_polys=chunk)
        for node, data in enumerate(cts):
            running.add(node, memoryview(data))
        total = running.total(range(len(cts)))
        sums[chunk] = (total.c0, total.c1)
    reference = compact.add_compact_ciphertexts([compact.CompactCiphertext.from_bytes(d, PARAMS, LIMBS) for d in cts])
    assert sums[1][0].dtype == np.uint32  # residues < 2^31: the running sum keeps half the bytes
    for c0, c1 in sums.values():
        assert np.array_equal(c0, reference.c0)
        assert c1 == rlwe.polys_to_bytes(PARAMS, reference.c1)


@pytest.mark.parametrize("chunk", [1, 2, K])
def test_a_bad_residue_in_the_last_range_is_refused_and_the_sum_is_unchanged(chunk):
    good, other = _ciphertexts(2)
    running = RunningSum(PARAMS, LIMBS, K, chunk_polys=chunk)
    running.add(1, good)
    before = running.c0.copy(), running.c1.copy()
    with pytest.raises(ValueError, match=f"c1 limb {PARAMS.limbs - 1} has values >= q_{PARAMS.limbs - 1}"):
        running.add(2, _bad_last_residue(other))  # the ranges before the last were added, then taken back
    assert np.array_equal(running.c0, before[0]) and np.array_equal(running.c1, before[1])
    assert set(running.folded) == {1}
    running.add(2, other)  # the well-formed one is still accepted, and the sum is the exact one
    reference = compact.add_compact_ciphertexts([compact.CompactCiphertext.from_bytes(d, PARAMS, LIMBS)
                                                 for d in (good, other)])
    assert np.array_equal(running.total([1, 2]).c0, reference.c0)


def test_a_malformed_first_reply_leaves_no_sum_and_every_check_of_from_bytes_is_made():
    (data,) = _ciphertexts(1)
    running = RunningSum(PARAMS, LIMBS, K, chunk_polys=1)
    with pytest.raises(ValueError, match="has values >="):
        running.add(1, _bad_last_residue(data))
    assert running.c0 is None and running.c1 is None and not running.folded
    for bad, match in ((data[:-1], "payload length"), (data + b"\0", "payload length"),
                       (data[:40], "too short"), (b"XXXX" + data[4:], "magic")):
        with pytest.raises(ValueError, match=match):
            running.add(1, bad)
        with pytest.raises(ValueError, match=match):
            compact.CompactCiphertext.from_bytes(bad, PARAMS, LIMBS)
    with pytest.raises(ValueError, match="polynomials, expected"):
        RunningSum(PARAMS, LIMBS, K + 1).add(1, data)
    with pytest.raises(ValueError, match="params_id"):  # c0 at another level
        RunningSum(PARAMS, LIMBS + 1, K).add(1, data)


def test_a_share_with_a_bad_residue_in_the_last_range_adds_nothing():
    a = rlwe.expand_a(PARAMS, rlwe.new_public_seed())
    secret, _ = rlwe.keygen(PARAMS, a)
    c1 = compact.CompactCiphertext.from_bytes(_ciphertexts(1)[0], PARAMS, LIMBS).c1
    share = compact.compress_decryption_share(PARAMS, rlwe.partial_decrypt(PARAMS, secret, c1, num_clients=2),
                                              LIMBS).to_bytes()
    level = compact.level_parameter_set(PARAMS, LIMBS)
    acc = level.ring.sum(np.stack([c1[:, :LIMBS, :]]))  # any reduced accumulator
    before = acc.copy()
    with pytest.raises(ValueError, match=f"d limb {LIMBS - 1} has values"):
        add_ranges(((acc, level.ring.q_col),),
                    lambda: compact.share_rows(_bad_last_residue(share), PARAMS, LIMBS, chunk_polys=1))
    assert np.array_equal(acc, before)
    add_ranges(((acc, level.ring.q_col),), lambda: compact.share_rows(share, PARAMS, LIMBS, chunk_polys=2))
    whole = rlwe.DecryptionShare.from_bytes(share, level).d
    assert np.array_equal(acc, level.ring.add(before, whole))


def test_masks_rebuilt_by_range_are_bit_identical_to_the_clients_masks():
    """The server's correction, −Σ u_i and the pairwise masks of a member left out, expanded in ranges of
    PRG steps (``MaskSum``), equals what the clients add, expanded whole (``self_mask``, ``mask_plaintext``)."""
    k = 2 * max(masking.MaskSum(PARAMS, [], 1).rows, 1) + 3  # two whole steps and a short one
    seeds = [selfmask.new_self_mask_seed() for _ in range(3)]
    private, _ = masking.new_mask_keypair()
    peers = {f"peer-{i}": masking.new_mask_keypair()[1] for i in range(2)}
    context = masking.mask_context(b"t" * 32, 3)
    whole = np.zeros((k, PARAMS.limbs, PARAMS.n), dtype=np.uint64)
    for seed in seeds:
        whole = PARAMS.ring.sub(whole, selfmask.self_mask(PARAMS, seed, k))
    whole = masking.mask_plaintext(PARAMS, whole, own_name="dropped", own_private=private, peers=peers,
                                   context=context)
    pairs = [(selfmask.self_mask_key(s), np.subtract) for s in seeds]
    pairs += masking.mask_pairs(own_name="dropped", own_private=private, peers=peers, context=context)
    masks = masking.MaskSum(PARAMS, pairs, k)
    zero = np.zeros((masks.rows, PARAMS.limbs, PARAMS.n), dtype=np.uint64)
    parts = [masks.next_rows(zero[: min(masks.rows, k - s)]) for s in range(0, k, masks.rows)]
    assert np.array_equal(np.concatenate(parts), whole)
    with pytest.raises(ValueError, match="left"):
        masks.next_rows(zero[:1])  # all k were expanded


def test_a_range_that_splits_a_prg_step_is_refused():
    masks = masking.MaskSum(PARAMS, [(bytes(32), np.add)], 40)
    with pytest.raises(ValueError, match="steps of"):
        masks.next_rows(np.zeros((masks.rows + 1, PARAMS.limbs, PARAMS.n), dtype=np.uint64))


def test_round_in_ranges_of_one_polynomial_refuses_a_bad_last_residue_and_gets_the_exact_mean(monkeypatch):
    """Over the grid, a model of 20 polynomials, ranges of one: the fold, the masks of a member left out
    (two PRG steps), the shares and the decoding all go range by range; the member whose ciphertext has a
    bad residue in its last range is left out and the others' exact mean comes out (a half-added
    ciphertext would not decode)."""
    monkeypatch.setattr(xmk_app, "SHAPES", [(20 * 4096 - 300,), (299,)])  # + n_i: 20 polynomials
    bad = {}

    def fault(node, msg, reply):
        if node == bad["node"] and msg.metadata.message_type == "train":
            data = array_bytes(reply.content[XMK_CIPHERTEXT_KEY], XMK_CIPHERTEXT_KEY, "ciphertext")
            reply.content[XMK_CIPHERTEXT_KEY]["ciphertext"] = bytes_array(_bad_last_residue(data))
        return reply

    grid = InProcessGrid(make_app(), 4, RUN_CONFIG, fault=fault)
    bad["node"] = grid.node_ids[-1]  # the last to reply: the others are in the sum already
    strategy = XMKFedAvg(fraction_evaluate=0.0, min_train_nodes=4, min_available_nodes=4, max_abs_value=1e4,
                         bulk="ckks")  # a model of 20 polynomials, every weight under xMK-CKKS
    strategy.chunk_polys = 1
    result = run(grid, strategy)
    assert not strategy.aborted_attempts
    ((_, failed),) = strategy.left_out
    assert list(failed) == [bad["node"]] and "has values >=" in failed[bad["node"]]
    expected = plain_fedavg(initial(), [0, 1, 2], 1)
    assert np.max(np.abs(flat(result.arrays.to_numpy_ndarrays()) - expected)) <= 1e-6
