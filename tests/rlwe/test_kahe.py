"""KAHE: key-additive RLWE encryption of the update (flwr_fedeval.rlwe.kahe)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import kahe
from flwr_fedeval.rlwe.kahe import (
    KaheCiphertext,
    KaheError,
    KaheParameters,
    KaheSum,
    encrypt,
    kahe_parameters,
    public_polynomials,
    public_seed,
    round_key_sum,
    sample_key,
)
from flwr_fedeval.rlwe.ring import Ring, find_ntt_primes, is_prime, schoolbook_negacyclic

# test data only (not key material): the keys and errors come from the module's CSPRNG
DATA = np.random.default_rng(20250730)


def _q_min(M: int, bound: float, F: int) -> int:
    """The sizing formula, restated: Q >= 2 (2 (2 eb + 1) pb + eb) + 1."""
    pb = M * math.ceil(bound * 2.0**F)
    eb = M * math.ceil(kahe.KAHE_TAIL * kahe.KAHE_SIGMA_ERROR)
    return 2 * (2 * (2 * eb + 1) * pb + eb) + 1


def _round(params: KaheParameters, M: int, m: int, *, seed: bytes | None = None, scale: float = 1.0):
    seed = seed or public_seed(b"transcript", 1)
    vals = [DATA.uniform(-scale, scale, m) for _ in range(M)]
    ints = [DATA.integers(-1000, 1000, params.integer_slots) for _ in range(M)]
    keys = [sample_key(params) for _ in range(M)]
    cts = [encrypt(params, seed, k, v, i) for k, v, i in zip(keys, vals, ints)]
    return seed, vals, ints, keys, cts


def test_exported_from_rlwe():
    assert rlwe.KaheSum is KaheSum and rlwe.kahe_parameters is kahe_parameters


@pytest.mark.parametrize("M", [1, 2, 5, 10])
def test_round_trip(M):
    p = kahe_parameters(M)
    m = 3 * p.n + 17  # several blocks, last one partly padding
    seed, vals, ints, keys, cts = _round(p, M, m, scale=3.0)
    S = KaheSum(p, seed, m, chunk_blocks=2)
    for ct in cts:
        S.add(ct.to_bytes())
    assert S.count == M
    sums, isum = S.decode(round_key_sum(np.sum(keys, axis=0).astype(np.float64) + 0.1))
    ref = np.sum(vals, axis=0)
    assert sums.shape == (m,) and sums.dtype == np.float64
    assert np.max(np.abs(sums - ref)) <= p.max_sum_error
    # exactly the sum of the quantised values
    q = np.sum([np.rint(v * 2.0**p.fractional_bits) for v in vals], axis=0) / 2.0**p.fractional_bits
    np.testing.assert_array_equal(sums, q)
    np.testing.assert_array_equal(isum, np.sum(ints, axis=0))


def test_clipping_counted_and_sum_of_clipped():
    p = kahe_parameters(2, bound=4.0)
    seed = public_seed(b"T", 0)
    v0 = np.array([1.5, 4.0, -4.0, 5.0, -100.0, 7.25, 0.0])
    v1 = np.array([0.5, 0.5, 0.5, 0.5, 0.5, -9.0, 3.0])
    keys = [sample_key(p) for _ in range(2)]
    cts = [
        encrypt(p, seed, keys[0], v0, np.array([kahe.count_clipped(p, v0), 1])),
        encrypt(p, seed, keys[1], v1, np.array([kahe.count_clipped(p, v1), 2])),
    ]
    assert (cts[0].clipped, cts[1].clipped) == (3, 1)
    S = KaheSum(p, seed, v0.size)
    for ct in cts:
        S.add(ct.to_bytes())
    sums, ints = S.decode(keys[0] + keys[1])
    ref = np.clip(v0, -4, 4) + np.clip(v1, -4, 4)
    assert np.max(np.abs(sums - ref)) <= p.max_sum_error
    np.testing.assert_array_equal(ints, [4, 3])


def test_wrong_key_sum_refused():
    p = kahe_parameters(3)
    seed, _, _, keys, cts = _round(p, 3, 2 * p.n)
    S = KaheSum(p, seed, 2 * p.n)
    for ct in cts:
        S.add(ct.to_bytes())
    K = np.sum(keys, axis=0)
    before = S.residues.tobytes()
    for bad in (K + np.eye(p.n, dtype=np.int64)[5], K - keys[2], np.roll(K, 1)):
        with pytest.raises(KaheError, match="not exact"):
            S.decode(bad)
    assert S.residues.tobytes() == before
    sums, _ = S.decode(K)  # the right key still decodes
    assert sums.shape == (2 * p.n,)
    # a successful decoding releases the sum: nothing can be added or decoded again
    for again in (lambda: S.decode(K), lambda: S.add(cts[0].to_bytes()), lambda: S.residues):
        with pytest.raises(KaheError, match="decoded already"):
            again()


def test_key_sum_out_of_range_and_too_many_contributors():
    p = kahe_parameters(2)
    seed, _, _, keys, cts = _round(p, 3, 100)
    S = KaheSum(p, seed, 100)
    S.add(cts[0].to_bytes())
    with pytest.raises(KaheError, match="beyond"):
        S.decode(np.full(p.n, p.key_cut + 1, dtype=np.int64))
    S.add(cts[1].to_bytes())
    S.add(cts[2].to_bytes())
    with pytest.raises(KaheError, match="max_contributors"):
        S.decode(np.sum(keys, axis=0))
    with pytest.raises(KaheError, match="nothing to decode"):
        KaheSum(p, seed, 100).decode(keys[0])


def test_round_key_sum():
    K = DATA.integers(-300, 300, 4096)
    approx = K + DATA.uniform(-0.2, 0.2, K.size)
    approx[17] = K[17] + 0.2
    np.testing.assert_array_equal(round_key_sum(approx), K)
    approx[17] = K[17] + 0.3
    with pytest.raises(KaheError, match="1/4"):
        round_key_sum(approx)
    approx[17] = K[17] - 0.3
    with pytest.raises(KaheError):
        round_key_sum(approx)
    approx[17] = np.nan
    with pytest.raises(KaheError):
        round_key_sum(approx)


def _corrupt_residue(data: bytes, p: KaheParameters, limb: int, block: int) -> bytes:
    """Set the first packed residue of (limb, block) to all ones: 2^b - 1 >= q."""
    nb = KaheCiphertext.read_header(data, p)[1]
    pos = kahe.HEADER_SIZE + sum(nb * p.n * q.bit_length() // 8 for q in p.primes[:limb])
    b = p.primes[limb].bit_length()
    off = pos + block * p.n * b // 8
    out = bytearray(data)
    out[off : off + b] = b"\xff" * b  # eight residues of b bits
    return bytes(out)


def test_refused_reply_leaves_sum_unchanged():
    p = kahe_parameters(5)
    m = 5 * p.n
    seed, _, _, keys, cts = _round(p, 3, m)
    S = KaheSum(p, seed, m, chunk_blocks=1)
    S.add(cts[0].to_bytes())
    before, count = S.residues.tobytes(), S.count
    good = cts[1].to_bytes()
    other_seed = encrypt(p, public_seed(b"transcript", 2), keys[1], np.zeros(m), np.zeros(2, np.int64)).to_bytes()
    other_m = encrypt(p, seed, keys[1], np.zeros(m - p.n), np.zeros(2, np.int64)).to_bytes()
    other_p = encrypt(kahe_parameters(6), seed, keys[1], np.zeros(m), np.zeros(2, np.int64)).to_bytes()
    bad = {
        "short": good[:-1],
        "long": good + b"\0",
        "header only": good[: kahe.HEADER_SIZE],
        "magic": b"XXXX" + good[4:],
        "last block limb 1": _corrupt_residue(good, p, 1, 5),
        "first block limb 0": _corrupt_residue(good, p, 0, 0),
        "middle block limb 0": _corrupt_residue(good, p, 0, 3),
        "other seed": other_seed,
        "other num_values": other_m,
        "other params": other_p,
    }
    for name, data in bad.items():
        with pytest.raises(KaheError):
            S.add(data)
        assert S.residues.tobytes() == before, name
        assert S.count == count, name
    S.add(good)
    sums, _ = S.decode(keys[0] + keys[1])
    assert sums.shape == (m,)


def test_streaming_decode_equals_one_shot_reference():
    p = kahe_parameters(3, bound=2.0**4, fractional_bits=10, n=2048)
    m = 3 * p.n + 5
    seed, vals, ints, keys, cts = _round(p, 3, m, scale=20.0)
    K = np.sum(keys, axis=0)
    outs = []
    for chunk in (1, 2, 100):
        S = KaheSum(p, seed, m, chunk_blocks=chunk)
        for ct in cts:
            S.add(ct.to_bytes())
        outs.append(S.decode(K))
    # one-shot reference with Python integers: the whole sum parsed, a_j K by the schoolbook product
    ring = p.ring
    total = sum(KaheCiphertext.from_bytes(ct.to_bytes(), p).residues.astype(object) for ct in cts)
    a = public_polynomials(p, seed, 0, p.num_blocks(m))
    ref = []
    for j in range(a.shape[0]):
        aK = np.stack([rlwe.schoolbook_negacyclic(a[j, i], K, q) for i, q in enumerate(p.primes)])
        y = ring.to_int(
            np.stack([(total[j, i] - aK[i].astype(object)) % q for i, q in enumerate(p.primes)]).astype(np.uint64)
        )
        ref.extend(int(v) for v in y)
    ref = np.array(ref, dtype=object)
    x = (ref + p.delta // 2) // p.delta
    assert max(abs(int(r)) for r in ref - x * p.delta) <= p.error_bound
    x = x.astype(np.int64)
    for sums, isum in outs:
        np.testing.assert_array_equal(sums, x[:m] / 2.0**p.fractional_bits)
        np.testing.assert_array_equal(isum, x[m : m + 2])
    np.testing.assert_array_equal(outs[0][1], np.sum(ints, axis=0))


def test_encrypt_matches_slow_reference():
    """c - a k - Δ x, all in Python integers with a naive negacyclic product, is a tail-cut error."""
    p = kahe_parameters(1, bound=1.0, fractional_bits=8, integer_slots=1, n=1024)
    assert p.limbs == 1 and p.modulus.bit_length() <= 27
    seed = public_seed(b"slow", 7)
    k = sample_key(p)
    v = DATA.uniform(-1.5, 1.5, p.n + 3)
    ct = encrypt(p, seed, k, v, np.array([-200]))
    a = public_polynomials(p, seed, 0, ct.num_blocks)
    Q, n = p.modulus, p.n
    x = [int(t) for t in np.rint(np.clip(v, -1.0, 1.0) * 256.0)] + [-200]
    x += [0] * (ct.num_blocks * n - len(x))
    kk = [int(t) for t in k]
    for j in range(ct.num_blocks):
        aj = [int(t) for t in a[j, 0]]
        prod = [0] * n
        for s in range(n):
            if kk[s]:
                for t in range(n):
                    if s + t < n:
                        prod[s + t] += aj[t] * kk[s]
                    else:
                        prod[s + t - n] -= aj[t] * kk[s]
        for i in range(n):
            e = (int(ct.residues[j, 0, i]) - prod[i] - p.delta * x[j * n + i]) % Q
            e = e - Q if e > Q // 2 else e
            assert abs(e) <= p.error_cut


def test_encrypt_refuses_bad_input():
    p = kahe_parameters(2)
    seed, k = public_seed(b"T", 1), sample_key(p)
    with pytest.raises(KaheError, match="integer slot"):
        encrypt(p, seed, k, np.zeros(10), np.array([p.value_bound + 1, 0]))
    with pytest.raises(KaheError, match="finite"):
        encrypt(p, seed, k, np.array([0.0, np.nan]), np.zeros(2, np.int64))
    with pytest.raises(KaheError, match="shape"):
        encrypt(p, seed, k, np.zeros(10), np.zeros(3, np.int64))
    with pytest.raises(KaheError, match="tail cut"):
        encrypt(p, seed, np.full(p.n, p.key_cut + 1), np.zeros(10), np.zeros(2, np.int64))
    with pytest.raises(KaheError, match="seed"):
        encrypt(p, b"short", k, np.zeros(10), np.zeros(2, np.int64))
    ct = encrypt(p, seed, k, np.zeros(10), np.array([p.value_bound, -p.value_bound]))
    assert ct.num_values == 10


def test_sample_key_distribution():
    p = kahe_parameters(2)
    k = np.concatenate([sample_key(p) for _ in range(8)])
    assert k.dtype == np.int64 and np.abs(k).max() <= p.key_cut
    assert abs(k.std() - p.sigma_key) < 0.3  # 32768 samples: the std error of the std is ~0.02
    assert len(np.unique(k)) > 9  # not ternary


def _fields(p: KaheParameters) -> dict:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.init}


def test_parameter_validation():
    p = kahe_parameters(10)
    base = _fields(p)
    with pytest.raises(KaheError, match="too small"):  # Q for 10 clients but 1000 declared
        KaheParameters(**{**base, "max_contributors": 1000})
    with pytest.raises(KaheError, match="too small"):  # delta below 2 (2 eb + 1)
        KaheParameters(**{**base, "primes": find_ntt_primes(4096, 27, 1)})
    with pytest.raises(KaheError, match="HE-Standard"):  # 54 bits at n = 1024 (bound 27)
        KaheParameters(**{**base, "n": 1024, "primes": find_ntt_primes(1024, 27, 2)})
    with pytest.raises(KaheError, match="HE-Standard"):
        KaheParameters(**{**base, "primes": find_ntt_primes(4096, 30, 4)})  # 120 > 109
    with pytest.raises(KaheError, match="primes"):
        KaheParameters(**{**base, "primes": (p.primes[0], p.primes[0])})
    with pytest.raises(KaheError, match="primes"):
        KaheParameters(**{**base, "primes": (p.primes[0] + 2,)})
    with pytest.raises(KaheError, match="sigma_key"):
        KaheParameters(**{**base, "sigma_key": 3.2})
    with pytest.raises(KaheError, match="sigma_error"):
        KaheParameters(**{**base, "sigma_error": 1.0})
    with pytest.raises(KaheError, match="tail"):
        KaheParameters(**{**base, "tail": 3.0})
    with pytest.raises(KaheError, match="bound"):
        KaheParameters(**{**base, "bound": float("nan")})
    with pytest.raises(KaheError, match="n ="):
        KaheParameters(**{**base, "n": 4000})
    with pytest.raises(KaheError):
        kahe_parameters(10**6, n=4096, bound=2.0**40)  # needs more than 109 bits
    assert isinstance(KaheError("x"), ValueError)


def test_parameter_bytes():
    p = kahe_parameters(10)
    data = p.to_bytes()
    assert KaheParameters.from_bytes(data) == p and KaheParameters.from_bytes(data).to_bytes() == data
    assert kahe_parameters(10).to_bytes() == data  # deterministic
    changes = {
        "n": 8192,
        "primes": find_ntt_primes(8192, 27, 2),
        "sigma_key": 5.0,
        "sigma_error": 7.0,
        "tail": 9.0,
        "bound": 2.0**15,
        "fractional_bits": 20,
        "max_contributors": 9,
        "integer_slots": 3,
    }
    base = _fields(p)
    for name, value in changes.items():
        fields = {**base, name: value}
        if name == "n":
            fields["primes"] = changes["primes"]
        other = KaheParameters(**fields)
        assert other.to_bytes() != data, name
        assert other.digest != p.digest, name
    with pytest.raises(KaheError):
        KaheParameters.from_bytes(data[:-1])
    with pytest.raises(KaheError):
        KaheParameters.from_bytes(b"XXXX" + data[4:])


def test_modulus_grows_with_m_and_b_as_the_formula_says():
    prev_by_b: dict[float, int] = {}
    for M in (1, 2, 3, 5, 10, 16, 50, 100):
        prev = 0
        for B in (2.0**4, 2.0**10, 2.0**16, 2.0**20):
            p = kahe_parameters(M, bound=B)
            q_min = _q_min(M, B, 21)
            bits = p.modulus.bit_length()
            assert p.modulus >= q_min
            assert bits <= q_min.bit_length() + 1  # at most one bit above the floor
            assert bits >= prev  # grows with B
            assert bits >= prev_by_b.get(B, 0)  # grows with M
            assert p.limbs == -(-p.bits_per_coefficient // 31)
            prev = prev_by_b[B] = bits
    assert kahe_parameters(10).bits_per_coefficient == 53  # 2 + log2(10 B 2^F) + log2(2 eb + 1) = 52.3
    assert kahe_parameters(100).bits_per_coefficient == 59


def test_public_polynomials():
    p = kahe_parameters(5)
    s1, s2 = public_seed(b"T", 1), public_seed(b"T", 2)
    a = public_polynomials(p, s1, 0, 5)
    assert a.shape == (5, p.limbs, p.n) and a.dtype == np.uint64
    np.testing.assert_array_equal(a, public_polynomials(p, s1, 0, 5))
    np.testing.assert_array_equal(a[2:4], public_polynomials(p, s1, 2, 2))
    assert not np.array_equal(a, public_polynomials(p, s2, 0, 5))
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(a, public_polynomials(kahe_parameters(6), s1, 0, 5))
    for i, q in enumerate(p.primes):
        assert a[:, i].max() < q
        # uniform mod q_i: the mean of 20480 residues is within 5 standard errors of (q - 1)/2
        assert abs(a[:, i].astype(np.float64).mean() / q - 0.5) < 5 * (1 / math.sqrt(12 * a[:, i].size))
    assert public_seed(b"T", 1) != public_seed(b"T2", 1) and len(s1) == 32
    with pytest.raises(KaheError):
        public_polynomials(p, b"x" * 31, 0, 1)


def _reference_block(params: KaheParameters, seed: bytes, j: int, i: int) -> list[int]:
    """a_j mod q_i as public_polynomials' docstring defines it, word by word with Python integers: block j's
    W words read from prime i's keystream at block counter j W / 16 (a stream of its own here), rejected
    words replaced in order by the accepted pool words, then by the accepted words of the overflow stream."""
    import hashlib

    n, q = params.n, params.primes[i]
    mask = (1 << q.bit_length()) - 1
    key = hashlib.sha256(kahe._A_DOMAIN + params.digest + seed).digest()
    W = kahe._draw_words(n, q)

    def words(nonce: bytes, count: int) -> list[int]:
        ks = Cipher(algorithms.ChaCha20(key, nonce), mode=None).encryptor().update(bytes(4 * count))
        return [int.from_bytes(ks[4 * t : 4 * t + 4], "little") & mask for t in range(count)]

    main = words((j * W // 16).to_bytes(4, "little") + i.to_bytes(4, "little") + bytes(8), W)
    spare = [w for w in main[n:] if w < q]
    overflow = bytes(4) + i.to_bytes(4, "little") + (1).to_bytes(4, "little") + j.to_bytes(4, "little")
    spare += [w for w in words(overflow, 4 * n) if w < q]  # far more than any test needs
    out = []
    for w in main[:n]:
        if w < q:
            out.append(w)
        else:
            out.append(spare.pop(0))
    return out


def test_public_polynomials_match_the_word_by_word_reference():
    p = kahe_parameters(5)
    seed = public_seed(b"reference", 3)
    got = public_polynomials(p, seed, 3, 4)  # a range not at block 0, read as one keystream per prime
    for j in range(4):
        for i in range(p.limbs):
            assert got[j, i].tolist() == _reference_block(p, seed, 3 + j, i), (j, i)


def test_public_polynomials_rejections_pool_and_overflow(monkeypatch):
    """Primes just above 2^26 (half of the 27-bit words rejected) and a pool of 16 words per block: nearly
    every block runs out of pool words and reads its overflow stream; the result still matches the
    reference and is uniform."""
    n = 2048
    primes, q = [], 2**26 + 1
    while len(primes) < 2:
        if is_prime(q):
            primes.append(q)
        q += 2 * n
    p = KaheParameters(n, tuple(primes), 4.5, 4.5 * math.sqrt(2.0), 8.0, 1.0, 0, 1, 0)
    monkeypatch.setattr(kahe, "_draw_words", lambda n_, q_: n_ + 16)
    seed = public_seed(b"overflow", 1)
    got = public_polynomials(p, seed, 1, 2)
    for j in range(2):
        for i in range(p.limbs):
            assert got[j, i].tolist() == _reference_block(p, seed, 1 + j, i), (j, i)
    np.testing.assert_array_equal(got[1], public_polynomials(p, seed, 2, 1)[0])
    for i, q in enumerate(primes):
        assert got[:, i].max() < q
        assert abs(got[:, i].astype(np.float64).mean() / q - 0.5) < 5 * (1 / math.sqrt(12 * got[:, i].size))


def test_public_polynomials_range_beyond_the_counter_refused():
    p = kahe_parameters(2)
    words = max(kahe._draw_words(p.n, q) for q in p.primes)
    with pytest.raises(KaheError, match="2\\^32"):
        public_polynomials(p, public_seed(b"T", 1), 2**32 * 16 // words, 1)


def test_ciphertext_bytes():
    p = kahe_parameters(4)
    seed, _, _, _, cts = _round(p, 1, p.n + 10)
    ct = cts[0]
    data = ct.to_bytes()
    assert len(data) == kahe.HEADER_SIZE + ct.num_blocks * p.n * p.bits_per_coefficient // 8
    back = KaheCiphertext.from_bytes(data, p)
    np.testing.assert_array_equal(back.residues, ct.residues)
    assert back.num_values == ct.num_values and back.to_bytes() == data
    np.testing.assert_array_equal(KaheCiphertext.rows(data, p, 1, 1), ct.residues[1:2])
    with pytest.raises(KaheError):
        KaheCiphertext.rows(data, p, 1, 2)


def test_encrypt_in_ranges_of_one_block(monkeypatch):
    """Encrypting and packing a range of blocks at a time gives a reply that decodes exactly."""
    monkeypatch.setattr(kahe, "_ENCRYPT_BLOCKS", 1)
    p = kahe_parameters(2)
    m = 3 * p.n + 1
    seed, vals, ints, keys, cts = _round(p, 2, m)
    S = KaheSum(p, seed, m, chunk_blocks=3)
    for ct in cts:
        data = ct.to_bytes()
        np.testing.assert_array_equal(KaheCiphertext.from_bytes(data, p).residues, ct.residues)
        S.add(data)
    sums, isum = S.decode(keys[0] + keys[1])
    assert np.max(np.abs(sums - (vals[0] + vals[1]))) <= p.max_sum_error
    np.testing.assert_array_equal(isum, ints[0] + ints[1])


@pytest.mark.parametrize("limbs", [1, 2, 3])
def test_block_product_equals_the_ring_product_and_the_schoolbook(limbs):
    """The buffered FFT product of encrypt and decode, bit for bit against the ring's product and (for two
    blocks) the schoolbook negacyclic product with Python-integer reduction; ranges shorter than the buffers,
    largest residues, both addend shapes, and an s wide enough to need the ring's 16-bit pieces."""
    n = 1024
    primes = (
        tuple(find_ntt_primes(n, 27, 3)[:limbs])
        if limbs < 3
        else (*find_ntt_primes(n, 20, 2), find_ntt_primes(n, 31, 1)[0])
    )
    ring = Ring(n, primes)
    words = DATA.integers(0, 2**31, (5, limbs, n), dtype=np.uint64) % np.array(primes, dtype=np.uint64)[:, None]
    words[0] = np.array(primes, dtype=np.uint64)[:, None] - np.uint64(1)  # largest residues
    params = _FakeParams(n, primes, ring)
    for small, addend in (
        (DATA.integers(-36, 37, n), None),
        (DATA.integers(-36, 37, n), DATA.integers(-(2**60), 2**60, (5, 1, n))),
        (np.full(n, -36), DATA.integers(-(2**61), 2**61, (5, limbs, n))),
        (DATA.integers(-3000, 3001, n), DATA.integers(-(2**40), 2**40, (5, 1, n))),  # wide: 16-bit pieces
    ):
        product = kahe._BlockProduct(params, small, 3)
        got = np.empty_like(words)
        for lo in range(0, 5, 3):  # ranges of 3 and 2 blocks through buffers of 3
            hi = min(5, lo + 3)
            product(words[lo:hi], None if addend is None else addend[lo:hi], got[lo:hi])
        spec = ring.fft_small(small)
        norm = float(np.sqrt(np.sum(small.astype(np.float64) ** 2)))
        np.testing.assert_array_equal(got, ring.mul_small_spectrum(spec, norm, words, addend=addend))
        for j in (0, 4):
            for i, q in enumerate(primes):
                ref = schoolbook_negacyclic(words[j, i], small, q).astype(object)
                if addend is not None:
                    ref = (ref + addend[j, i if addend.shape[1] > 1 else 0].astype(object)) % q
                assert got[j, i].tolist() == [int(v) for v in ref], (j, i)


@dataclasses.dataclass
class _FakeParams:
    """What _BlockProduct reads of a KaheParameters (any primes: the product is the ring's)."""

    n: int
    primes: tuple[int, ...]
    ring: object


@pytest.mark.parametrize("blocks", [1, 32])
def test_encrypt_bytes_is_encrypt_then_to_bytes(monkeypatch, blocks):
    """encrypt_bytes packs each range as it is encrypted: byte for byte encrypt(...).to_bytes() under the same
    error stream (a fixed test key for the stream here), in ranges of one block and of 32, with a clipped
    value; and the reply folds and decodes."""
    monkeypatch.setattr(kahe, "_ENCRYPT_BLOCKS", blocks)
    p = kahe_parameters(3)
    m = 3 * p.n + 5
    seed, k = public_seed(b"bytes", 4), sample_key(p)
    v = DATA.uniform(-2.0, 2.0, m)
    v[7] = 3.0 * p.bound
    ints = np.array([12, -3])
    stream = kahe.RandomStream
    monkeypatch.setattr(kahe, "RandomStream", lambda: stream(bytes(32)))  # the same error stream each call
    data = kahe.encrypt_bytes(p, seed, k, v, ints)
    ct = encrypt(p, seed, k, v, ints)
    assert ct.clipped == 1
    assert isinstance(data, memoryview) and data.readonly and bytes(data) == ct.to_bytes()
    S = KaheSum(p, seed, m)
    S.add(data)
    sums, isum = S.decode(k)
    assert np.max(np.abs(sums - np.clip(v, -p.bound, p.bound))) <= p.max_sum_error
    np.testing.assert_array_equal(isum, ints)


def test_encrypt_bytes_refuses_bad_input():
    p = kahe_parameters(2)
    seed, k = public_seed(b"T", 1), sample_key(p)
    with pytest.raises(KaheError, match="seed"):
        kahe.encrypt_bytes(p, b"short", k, np.zeros(10), np.zeros(2, np.int64))
    with pytest.raises(KaheError, match="finite"):
        kahe.encrypt_bytes(p, seed, k, np.array([0.0, np.inf]), np.zeros(2, np.int64))
    with pytest.raises(KaheError, match="tail cut"):
        kahe.encrypt_bytes(p, seed, np.full(p.n, p.key_cut + 1), np.zeros(10), np.zeros(2, np.int64))


@pytest.mark.parametrize("scale", [1.0, 7, 13.5])
def test_encrypt_bytes_scale_is_encrypting_the_scaled_values(monkeypatch, scale):
    """encrypt_bytes(values, scale=s) is encrypt(s·values) byte for byte (same error stream), clipped values
    included: the client's clip(n_i·Δw, ±B) without a scaled copy; a scale that is not finite and > 0 is
    refused."""
    p = kahe_parameters(2)
    m = 2 * p.n + 9
    seed, k = public_seed(b"scale", 2), sample_key(p)
    v = DATA.uniform(-1.0, 1.0, m) * p.bound / 20
    v[[3, m - 1]] = p.bound / 2, -p.bound / 3  # clipped at s >= 3
    stream = kahe.RandomStream
    monkeypatch.setattr(kahe, "RandomStream", lambda: stream(bytes(32)))
    ints = np.array([5, 0])
    expected = encrypt(p, seed, k, scale * v, ints)
    assert expected.clipped == (2 if scale > 3 else 0)
    assert bytes(kahe.encrypt_bytes(p, seed, k, v, ints, scale=scale)) == expected.to_bytes()
    for bad in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(KaheError, match="scale"):
            kahe.encrypt_bytes(p, seed, k, v, ints, scale=bad)
