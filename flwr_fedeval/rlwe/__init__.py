"""RLWE ring and xMK-CKKS multi-key secure aggregation (pure numpy).

Imports neither flwr nor TensorFlow. See :mod:`flwr_fedeval.rlwe.xmkckks` for
the protocol (Walskaar et al. 2023, Eqs. 1-11), :mod:`~flwr_fedeval.rlwe.params`
for the parameter sets, the HE-Standard security check and the worst-case
noise budget.

Typical use (one round, M clients)::

    from flwr_fedeval import rlwe
    P = rlwe.DEFAULT_PARAMETER_SET
    seed = rlwe.new_public_seed(); a = rlwe.expand_a(P, seed)
    keys = [rlwe.keygen(P, a) for _ in range(M)]                     # clients
    pk = rlwe.aggregate_public_keys([pk_i for _, pk_i in keys])      # server
    k = rlwe.max_scale_bits(P, num_clients=M, max_abs_value=bound)
    cts = [rlwe.encrypt_vector(P, pk, a, x_i, scale_bits=k, num_clients=M) ...]
    C = rlwe.add_ciphertexts(cts)                                    # server
    D = [rlwe.partial_decrypt(P, sk_i, C.c1, num_clients=M) ...]     # clients
    total = rlwe.combine_and_decode(P, C.c0, D, len(x), scale_bits=k)  # server

Threshold decryption (a member lost after its upload is recovered in the
round, :mod:`~flwr_fedeval.rlwe.threshold`): each member Shamir-shares s_i
(``split_secret``), aggregates what it receives (``aggregate_shares``), and
any t > N/2 members decrypt with ``threshold_partial_decrypt``; self-masks
(:mod:`~flwr_fedeval.rlwe.selfmask`) and ``split_bytes``/``combine_bytes``
recover the SecAgg masks.

KAHE (:mod:`~flwr_fedeval.rlwe.kahe`): the update under key-additive RLWE, one message per
client; ``kahe_parameters`` sizes Q, ``kahe.encrypt`` encrypts, ``KaheSum`` folds and decodes with
the key sum (``round_key_sum``).

Compact uploads (:mod:`~flwr_fedeval.rlwe.compact`): ``compact_limbs`` picks
how many RNS limbs c0 and the decryption shares keep; ``compress_ciphertext``
/ ``compress_decryption_share`` switch them, ``compact_combine_and_decode``
decodes the sum.
"""

from .compact import (
    CompactCiphertext,
    add_compact_ciphertexts,
    compact_combine_and_decode,
    compact_limbs,
    compact_noise_bound,
    compress_ciphertext,
    compress_decryption_share,
    dropped_modulus,
    level_parameter_set,
    switch_modulus,
)
from .encoding import EncodingRangeError, decode, encode, num_polys
from .kahe import (
    KaheCiphertext,
    KaheError,
    KaheParameters,
    KaheSum,
    kahe_parameters,
    public_polynomials,
    public_seed,
    round_key_sum,
    sample_key,
)
from .params import (
    DEFAULT_PARAMETER_SET,
    HE_STANDARD_128_MAX_LOG2Q,
    HE_STANDARD_128_TABLE,
    MAX_DECRYPTION_ATTEMPTS,
    PARAMETER_SETS,
    NoiseBudget,
    NoiseBudgetError,
    ParameterSet,
    check_noise_budget,
    fresh_noise_bound,
    get_parameter_set,
    max_decryptions,
    max_plaintext_int,
    max_scale_bits,
    smudging_bound,
    total_noise_bound,
    validate_security,
)
from .ring import Ring, find_ntt_primes, get_ring, schoolbook_negacyclic
from .sampling import RandomStream, new_public_seed
from .selfmask import SELF_MASK_SEED_BYTES, new_self_mask_seed, self_mask
from .threshold import (
    SecretShare,
    ThresholdError,
    aggregate_shares,
    combine_bytes,
    lagrange_at_zero,
    member_points,
    min_threshold,
    split_bytes,
    split_secret,
    threshold_partial_decrypt,
)
from .xmkckks import (
    Ciphertext,
    DecryptionShare,
    PublicKey,
    SecretKey,
    add_ciphertexts,
    aggregate_public_keys,
    combine,
    combine_and_decode,
    encrypt,
    encrypt_vector,
    expand_a,
    keygen,
    partial_decrypt,
    polys_from_bytes,
    polys_to_bytes,
)

__all__ = [
    "Ciphertext",
    "KaheCiphertext",
    "KaheError",
    "KaheParameters",
    "KaheSum",
    "kahe_parameters",
    "public_polynomials",
    "public_seed",
    "round_key_sum",
    "sample_key",
    "CompactCiphertext",
    "DEFAULT_PARAMETER_SET",
    "DecryptionShare",
    "EncodingRangeError",
    "HE_STANDARD_128_MAX_LOG2Q",
    "HE_STANDARD_128_TABLE",
    "NoiseBudget",
    "NoiseBudgetError",
    "PARAMETER_SETS",
    "ParameterSet",
    "PublicKey",
    "RandomStream",
    "Ring",
    "SELF_MASK_SEED_BYTES",
    "SecretKey",
    "SecretShare",
    "ThresholdError",
    "add_ciphertexts",
    "add_compact_ciphertexts",
    "aggregate_public_keys",
    "aggregate_shares",
    "check_noise_budget",
    "combine",
    "combine_and_decode",
    "combine_bytes",
    "compact_combine_and_decode",
    "compact_limbs",
    "compact_noise_bound",
    "compress_ciphertext",
    "compress_decryption_share",
    "decode",
    "dropped_modulus",
    "encode",
    "encrypt",
    "encrypt_vector",
    "expand_a",
    "find_ntt_primes",
    "fresh_noise_bound",
    "get_parameter_set",
    "get_ring",
    "keygen",
    "lagrange_at_zero",
    "level_parameter_set",
    "MAX_DECRYPTION_ATTEMPTS",
    "max_decryptions",
    "max_plaintext_int",
    "max_scale_bits",
    "member_points",
    "min_threshold",
    "new_public_seed",
    "new_self_mask_seed",
    "num_polys",
    "partial_decrypt",
    "polys_from_bytes",
    "polys_to_bytes",
    "schoolbook_negacyclic",
    "self_mask",
    "smudging_bound",
    "split_bytes",
    "split_secret",
    "switch_modulus",
    "threshold_partial_decrypt",
    "total_noise_bound",
    "validate_security",
]
