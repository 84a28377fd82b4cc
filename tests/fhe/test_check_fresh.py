"""CKKSContext.check_fresh: the server's check of a received ciphertext (issue 12, item 4)."""

import pytest

from flwr_fedeval.fhe.backend import CKKSParams, SerializationError, create_context, load_context


@pytest.fixture(scope="module")
def contexts():
    secret = create_context(params=CKKSParams.for_slots(101, "tenseal"))
    return secret, load_context(secret.public_bytes())


def _received(contexts, ct):
    secret, public = contexts
    return public.deserialize_ciphertext(secret.serialize_ciphertext(ct))


def test_fresh_ciphertexts_and_their_sums_pass(contexts):
    secret, public = contexts
    a, b = secret.encrypt([1.0, 2.0]), secret.encrypt([3.0])
    assert public.check_fresh(_received(contexts, a)) is not None
    assert public.check_fresh(public.add_many([_received(contexts, a), _received(contexts, b)])) is not None
    assert public.fresh_layout() == (public.slot_count, 3, 2.0 ** 49, 2)


def test_other_slot_count_level_or_scale_is_refused(contexts):
    import tenseal as ts

    secret, public = contexts
    raw = secret._ctx
    cases = {
        "slot count 2": ts.ckks_vector(raw, [1.0, 2.0]),
        "level 2": secret.multiply_plain(secret.encrypt([1.0]), [1.0]),
        "scale 1099511627776": ts.ckks_vector(raw, [0.0] * secret.slot_count, scale=2.0 ** 40),
    }
    for match, ct in cases.items():
        with pytest.raises(SerializationError, match=match):
            public.check_fresh(_received(contexts, ct))
