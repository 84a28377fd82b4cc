"""Pairwise zero-sum masks mod q (Bonawitz et al. 2017) for xMK-CKKS."""

import numpy as np
import pytest

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import masking as mk
from flwr_fedeval.rlwe.masking import _LimbStream
from flwr_fedeval.rlwe.params import DEFAULT_PARAMETER_SET as P

CTX = mk.mask_context(b"\x01" * 32, 3)


def _members(m):
    names = [f"node-{i}" for i in range(m)]
    keys = {name: mk.new_mask_keypair() for name in names}
    return names, keys


def _mask(names, keys, name, num_polys, context=CTX):
    peers = {other: keys[other][1] for other in names if other != name}
    return mk.client_mask(
        P, own_name=name, own_private=keys[name][0], peers=peers, context=context, num_polys=num_polys
    )


@pytest.mark.parametrize("m", [2, 3, 5])
def test_masks_of_a_key_set_sum_to_zero_mod_q(m):
    names, keys = _members(m)
    masks = [_mask(names, keys, name, 2) for name in names]
    assert all(x.shape == (2, P.limbs, P.n) and x.dtype == np.uint64 for x in masks)
    assert not P.ring.sum(np.stack(masks)).any()
    assert all(np.any(x) for x in masks)


def test_client_mask_is_the_signed_sum_of_pairwise_prgs():
    names, keys = _members(3)
    me = names[1]
    expected = P.ring.zeros((1,))
    for other in (names[0], names[2]):
        k = mk.pairwise_mask_key(keys[me][0], keys[other][1], own_name=me, peer_name=other, context=CTX)
        prg = mk.expand_mask(P, k, 1)
        expected = P.ring.add(expected, prg) if me < other else P.ring.sub(expected, prg)
    assert np.array_equal(_mask(names, keys, me, 1), expected)


def test_masked_plaintext_equals_plaintext_plus_mask():
    names, keys = _members(3)
    pt = rlwe.encode(P, np.linspace(-5, 5, P.n + 7), scale_bits=20, num_clients=3)
    me = names[0]
    peers = {o: keys[o][1] for o in names[1:]}
    got = mk.mask_plaintext(P, pt, own_name=me, own_private=keys[me][0], peers=peers, context=CTX)
    assert np.array_equal(got, mk.apply_mask(P, pt, _mask(names, keys, me, 2)))


def test_pairwise_key_is_symmetric_and_bound_to_context_and_names():
    (xa, pa), (xb, pb) = mk.new_mask_keypair(), mk.new_mask_keypair()
    kab = mk.pairwise_mask_key(xa, pb, own_name="a", peer_name="b", context=CTX)
    kba = mk.pairwise_mask_key(xb, pa, own_name="b", peer_name="a", context=CTX)
    assert kab == kba and len(kab) == 32
    other_round = mk.mask_context(b"\x01" * 32, 4)
    other_set = mk.mask_context(b"\x02" * 32, 3)
    assert mk.pairwise_mask_key(xa, pb, own_name="a", peer_name="b", context=other_round) != kab
    assert mk.pairwise_mask_key(xa, pb, own_name="a", peer_name="b", context=other_set) != kab
    assert mk.pairwise_mask_key(xa, pb, own_name="a", peer_name="c", context=CTX) != kab
    assert mk.mask_public_key(xa) == pa


def test_views_of_different_key_sets_give_masks_that_do_not_cancel():
    names, keys = _members(3)
    ctx_other = mk.mask_context(b"\x09" * 32, 3)
    masks = [_mask(names, keys, names[0], 1, ctx_other)] + [_mask(names, keys, n, 1) for n in names[1:]]
    total = P.ring.sum(np.stack(masks))
    assert np.mean(total == 0) < 0.01


def test_mask_key_errors():
    x, pub = mk.new_mask_keypair()
    with pytest.raises(mk.MaskKeyError, match="distinct"):
        mk.pairwise_mask_key(x, pub, own_name="a", peer_name="a", context=CTX)
    with pytest.raises(mk.MaskKeyError, match="32 bytes"):
        mk.pairwise_mask_key(x, pub[:31], own_name="a", peer_name="b", context=CTX)
    with pytest.raises(mk.MaskKeyError, match="32 bytes"):
        mk.pairwise_mask_key(x[:5], pub, own_name="a", peer_name="b", context=CTX)
    # a low-order point (all zero) gives the all-zero secret: refused, not a known mask
    with pytest.raises(mk.MaskKeyError, match="agreement"):
        mk.pairwise_mask_key(x, bytes(32), own_name="a", peer_name="b", context=CTX)
    with pytest.raises(mk.MaskKeyError, match="at least one"):
        mk.client_mask(P, own_name="a", own_private=x, peers={}, context=CTX, num_polys=1)
    with pytest.raises(mk.MaskKeyError, match="must not contain"):
        mk.client_mask(P, own_name="a", own_private=x, peers={"a": pub}, context=CTX, num_polys=1)
    with pytest.raises(ValueError, match="num_polys"):
        mk.expand_mask(P, b"k" * 32, 0)
    with pytest.raises(ValueError, match="32 bytes"):
        mk.expand_mask(P, b"k" * 31, 1)
    with pytest.raises(ValueError, match="round"):
        mk.mask_context(b"t", -1)
    with pytest.raises(ValueError, match="shape"):
        mk.apply_mask(P, P.ring.zeros((1,)), P.ring.zeros((2,)))


def test_expand_mask_is_deterministic_reduced_and_uniform():
    a = mk.expand_mask(P, b"k" * 32, 3)
    assert np.array_equal(a, mk.expand_mask(P, b"k" * 32, 3))
    assert not np.array_equal(a, mk.expand_mask(P, b"j" * 32, 3))
    P.ring.check(a, "mask")
    for l, p in enumerate(P.primes):
        u = a[:, l, :].ravel().astype(np.float64) / p
        # 16 equal bins, chi-square with 15 dof: 99.9 % quantile is 37.7
        counts = np.bincount(np.minimum((u * 16).astype(int), 15), minlength=16)
        expected = u.size / 16
        assert np.sum((counts - expected) ** 2 / expected) < 37.7


def _reference_stream(key, limb, p, sizes):
    """The PRG spec in plain Python: AES-256-CTR words, cut, rejected ones replaced from later words."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    enc = Cipher(algorithms.AES(key), modes.CTR(limb.to_bytes(8, "big") + bytes(8))).encryptor()
    cut = (1 << (p - 1).bit_length()) - 1

    def words(count):
        raw = enc.update(bytes(4 * count))
        return [int.from_bytes(raw[4 * i : 4 * i + 4], "little") & cut for i in range(count)]

    out = []
    for need in sizes:
        vals = words(need)
        bad = [i for i, v in enumerate(vals) if v >= p]
        pool = []
        while len(pool) < len(bad):
            pool += [v for v in words(2 * (len(bad) - len(pool)) + 16) if v < p]
        for i, v in zip(bad, pool):
            vals[i] = v
        out += vals
    return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("p", [(1 << 26) + 15, P.primes[0]])  # about half rejected; the protocol's prime
def test_rejection_sampling_matches_the_spec_and_is_uniform(p):
    sizes = [4096, 1000, 4096, 7]  # any step sizes (the protocol uses 2^16)
    s = _LimbStream(b"r" * 32, 2, p)
    got = np.concatenate([s.next(k).astype(np.uint64) for k in sizes])
    assert np.array_equal(got, _reference_stream(b"r" * 32, 2, p, sizes))
    assert got.max() < p
    assert abs(np.mean(got) / p - 0.5) < 0.015  # 9199 samples: sd of the mean 0.003
    assert np.mean(got >= p // 2) == pytest.approx(0.5, abs=0.03)
    other = _LimbStream(b"r" * 32, 3, p).next(4096)  # another limb: another stream
    assert np.mean(other == got[:4096]) < 0.01


def test_mask_accumulation_reduces_before_uint32_overflow():
    """Many subtracted terms (more than fit in 32 bits at once) still give the exact signed sum."""
    keys = [bytes([i]) * 32 for i in range(40)]
    pairs = [(k, np.subtract if i % 3 else np.add) for i, k in enumerate(keys)]
    base = P.ring.zeros((1,))
    base[0, :, :5] = 7
    got = mk._masked(P, base, pairs)
    want = base.copy()
    for k, op in pairs:
        prg = mk.expand_mask(P, k, 1)
        want = P.ring.add(want, prg) if op is np.add else P.ring.sub(want, prg)
    assert np.array_equal(got, want)


def test_masked_encryption_decrypts_to_the_same_sum_and_partial_sums_are_uniform():
    """Σ masked m_i decodes to Σ m_i (headroom unchanged); a sum missing one client does not."""
    m = 4
    names, keys = _members(m)
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    pairs = [rlwe.keygen(P, a) for _ in range(m)]
    pk = rlwe.aggregate_public_keys([b for _, b in pairs])
    k = rlwe.max_scale_bits(P, num_clients=m, max_abs_value=100.0)
    gen = np.random.default_rng(5)  # test data only
    xs = [gen.uniform(-100, 100, P.n + 50) for _ in range(m)]
    cts = []
    for name, x in zip(names, xs):
        pt = rlwe.encode(P, x, scale_bits=k, num_clients=m)
        peers = {o: keys[o][1] for o in names if o != name}
        masked = mk.mask_plaintext(P, pt, own_name=name, own_private=keys[name][0], peers=peers, context=CTX)
        cts.append(rlwe.encrypt(P, pk, a, masked))
    total = rlwe.add_ciphertexts(cts)
    shares = [rlwe.partial_decrypt(P, sk, total.c1, num_clients=m) for sk, _ in pairs]
    got = rlwe.combine_and_decode(P, total.c0, shares, xs[0].size, scale_bits=k)
    # the masks cancel exactly: same worst-case bound as without masks (headroom unchanged)
    bound = rlwe.check_noise_budget(P, num_clients=m, scale_bits=k, max_abs_value=100.0)
    fixed = np.sum([np.rint(x * 2.0**k) for x in xs], axis=0) / 2.0**k
    assert np.max(np.abs(got - fixed)) <= bound.total_noise / 2.0**k
    assert np.max(np.abs(got - np.sum(xs, axis=0))) < 1e-4

    partial = rlwe.add_ciphertexts(cts[:-1])
    shares = [rlwe.partial_decrypt(P, sk, partial.c1, num_clients=m) for sk, _ in pairs]
    raw = rlwe.combine(P, partial.c0, shares)
    # centred value / (q/2): uniform on (-1, 1) -> mean |.| ~ 1/2, uncorrelated with the true partial sum
    frac = P.ring.to_centered_float(raw, 0).ravel()[: xs[0].size] / (P.q / 2)
    assert np.mean(np.abs(frac)) == pytest.approx(0.5, abs=0.02)
    truth = np.sum(xs[:-1], axis=0)
    assert abs(np.corrcoef(frac, truth)[0, 1]) < 0.05
