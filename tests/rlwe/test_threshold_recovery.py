"""One xMK-CKKS round with both kinds of dropout recovered inside the round (issue 21, crypto level).

Key set a..e (t = 3). e is lost before its upload: its pairwise masks are
removed with its X25519 mask key rebuilt from t shares. d is lost after its
upload: a, b, c decrypt by threshold. Every contributor's self-mask is
removed with its seed rebuilt from t shares. The glue (clients/, strategies/)
runs the same steps over the network.
"""

import numpy as np

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import masking
from flwr_fedeval.rlwe.params import get_parameter_set

P = get_parameter_set("xmk-n4096-q93")
NAMES = ("a", "b", "c", "d", "e")
LENGTH = 700


def test_round_with_a_member_lost_before_and_one_after_upload_decrypts_the_sum():
    N, t = len(NAMES), rlwe.min_threshold(len(NAMES))
    points = dict(zip(NAMES, rlwe.member_points(N)))
    a = rlwe.expand_a(P, rlwe.new_public_seed())
    rlwe_keys = {name: rlwe.keygen(P, a) for name in NAMES}
    mask_keys = {name: masking.new_mask_keypair() for name in NAMES}
    pk = rlwe.aggregate_public_keys([rlwe_keys[name][1] for name in NAMES])
    context = masking.mask_context(b"transcript digest of the signed key set", 3)
    # key setup: every member shares its RLWE secret and its mask private key
    dealt = {
        name: rlwe.split_secret(P, rlwe_keys[name][0], threshold=t, points=tuple(points.values())) for name in NAMES
    }
    sk_shares = {
        name: rlwe.aggregate_shares(P, [dealt[other][points[name]] for other in NAMES]) for name in NAMES
    }
    mask_key_shares = {
        name: rlwe.split_bytes(mask_keys[name][0], threshold=t, points=tuple(points.values())) for name in NAMES
    }
    # round: e is lost before its upload; a..d upload m_i + r_i + u_i, each sharing its self-mask seed
    k = rlwe.max_scale_bits(P, num_clients=N, max_abs_value=1.0)
    gen = np.random.default_rng(21)  # test data, not key material
    contributors = ("a", "b", "c", "d")
    xs = {name: gen.uniform(-1.0, 1.0, LENGTH) for name in contributors}
    seeds = {name: rlwe.new_self_mask_seed() for name in contributors}
    seed_shares = {
        name: rlwe.split_bytes(seeds[name], threshold=t, points=tuple(points.values())) for name in contributors
    }
    uploads = []
    for name in contributors:
        pt = rlwe.encode(P, xs[name], scale_bits=k, num_clients=N)
        peers = {other: mask_keys[other][1] for other in NAMES if other != name}
        r = masking.client_mask(
            P, own_name=name, own_private=mask_keys[name][0], peers=peers, context=context, num_polys=1
        )
        masked = P.ring.add(P.ring.add(pt, r), rlwe.self_mask(P, seeds[name], 1))
        uploads.append(rlwe.encrypt(P, pk, a, masked))
    total = rlwe.add_ciphertexts(uploads)
    # d is lost after its upload: a, b, c (t of them) give threshold shares and their shares of
    # e's mask key (lost before upload) and of every contributor's self-mask seed, never both for one member
    active = tuple(points[name] for name in ("a", "b", "c"))
    d_shares = [
        rlwe.threshold_partial_decrypt(P, sk_shares[name], active, total.c1, num_clients=N) for name in ("a", "b", "c")
    ]
    e_private = rlwe.combine_bytes({x: mask_key_shares["e"][x] for x in active}, threshold=t)
    assert e_private == mask_keys["e"][0]
    r_e = masking.client_mask(
        P,
        own_name="e",
        own_private=e_private,
        peers={other: mask_keys[other][1] for other in contributors},
        context=context,
        num_polys=1,
    )
    u_sum = P.ring.sum(
        np.stack([
            rlwe.self_mask(P, rlwe.combine_bytes({x: seed_shares[name][x] for x in active}, threshold=t), 1)
            for name in contributors
        ])
    )
    masked_sum = rlwe.combine(P, total.c0, d_shares)
    got = rlwe.decode(P, P.ring.sub(P.ring.add(masked_sum, r_e), u_sum), scale_bits=k, length=LENGTH)
    fixed = np.sum([np.rint(xs[name] * 2.0**k) for name in contributors], axis=0) / 2.0**k
    assert np.max(np.abs(got - fixed)) <= rlwe.total_noise_bound(P, N) / 2.0**k
    # without removing e's pairwise masks the sum is uniform mod q
    unmasked_without_e = rlwe.decode(P, P.ring.sub(masked_sum, u_sum), scale_bits=k, length=LENGTH)
    assert np.mean(np.abs(unmasked_without_e - fixed) > 0.01) > 0.99
