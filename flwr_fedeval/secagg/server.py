"""The server party of xMK secure aggregation: fold the uploads, combine the decryption shares, unmask,
decode; streaming, and below Flower.

One :class:`Aggregator` per key set and round, built from what the members signed
(:class:`~flwr_fedeval.secagg.KeySetParameters`, the members' names and mask keys, T). It holds the
round's running sums, so the server never keeps more than one model-sized sum and the reply in
flight (DESIGN.md §3):

* step 2, :meth:`Aggregator.add_upload`: each upload is checked and folded straight from its bytes
  (a ``bytes`` or a ``memoryview`` into the message's buffer), a range of polynomials at a time
  (:class:`RunningSum`, :class:`~flwr_fedeval.rlwe.kahe.KaheSum`); a malformed upload adds nothing;
* step 2b, :meth:`Aggregator.contributor_components`: the mask graph induced on the contributors (every
  member refuses to decrypt for a disconnected one);
* step 3, :meth:`Aggregator.share_sum`: Σ_{j∈A} D_j folded as the shares arrive, then C0 + Σ D_j minus the
  rebuilt masks (:meth:`ShareSum.unmask`);
* step 4, :meth:`Aggregator.decode`: the mean update over the contributors and Σ n_i.

The server is trusted for nothing: every check that protects a member is the member's
(:mod:`flwr_fedeval.secagg.member`); the checks here name a failing node early and keep a malformed
reply out of the sums. The Flower glue is :mod:`flwr_fedeval.strategies.xmk_fedavg`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from flwr_fedeval import rlwe
from flwr_fedeval.rlwe import capsule, compact, kahe, masking, selfmask
from flwr_fedeval.rlwe import serialization as ser
from flwr_fedeval.rlwe import threshold as shamir
from flwr_fedeval.secagg.parameters import KeySetParameters

__all__ = ["CHUNK_POLYS", "AggregationError", "Aggregator", "CiphertextSum", "Decoded", "RunningSum", "ShareSum",
           "add_ranges"]

#: Polynomials per range when the server folds, rebuilds masks and decodes: ranges of a few MB instead of
#: whole arrays of hundreds of MB (64 × 4096 coefficients × L limbs).
CHUNK_POLYS = 64

_U32 = NDArray[np.uint32]
_U64 = NDArray[np.uint64]


class AggregationError(ValueError):
    """The round's sum cannot be finished: ``step`` is ``"mask recovery"`` (a seed or mask key does not
    reconstruct) or ``"decoding"`` (the key sum does not round, Σ n_i is not a valid count); the reason
    says which. The global model must stay unchanged."""

    def __init__(self, step: str, reason: str) -> None:
        self.step = step
        super().__init__(reason)


def add_ranges(accs: Sequence[tuple[NDArray[Any], NDArray[Any]]],
               ranges: Callable[[], Iterator[tuple[Any, ...]]]) -> None:
    """acc[start:stop] ← acc[start:stop] + part mod q for every range ``(start, part, ...)`` of ``ranges()``
    (one part per ``(acc, q_col)`` of ``accs``; reduced accumulators, parts reduced uint64, used as scratch).

    ``ranges()`` checks each range before yielding it; if one raises ``ValueError``, the ranges already
    added are read again and subtracted (exactly: arithmetic mod q), so the accumulators are left as
    they were, then the error is raised: nothing is lost and nothing half-added.
    """

    def fold(start: int, parts: Sequence[NDArray[Any]], negate: bool) -> None:
        for (acc, q), part in zip(accs, parts):
            rows = acc[start : start + part.shape[0]]
            if negate:
                np.subtract(q, part, out=part)  # −x mod q = q − x
            np.add(part, rows, out=part)  # < 2q < 2^32: no overflow in uint64
            np.minimum(part, part - q, out=rows, casting="unsafe")  # part - q wraps around below q: mod q

    done = 0
    try:
        for start, *parts in ranges():
            fold(start, parts, False)
            done = start + parts[0].shape[0]
            del parts  # not alive while the next range is read
    except ValueError:
        for start, *parts in ranges():
            if start >= done:
                break
            fold(start, parts, True)
        raise


@dataclass(frozen=True, eq=False)
class CiphertextSum:
    """C = Σ_{j∈C} c_j of step 2 as step 3 uses it: C0' of shape (k, L', n) uint32 (reduced mod q'), C1 as
    :func:`flwr_fedeval.rlwe.polys_to_bytes` (sent to the decryptors as is in CKKS mode)."""

    c0: _U32
    c1: bytes


class RunningSum:
    """Σ c_j of step 2 (Eq. 3) over compact ciphertexts (C0' at L' limbs, C1 at L), folded one at a
    time straight from the wire bytes, ``chunk_polys`` polynomials at a time, kept reduced in uint32
    (residues < 2^31: half the bytes of a parsed ciphertext); ``folded`` maps each node to what its
    reply carried besides the ciphertext."""

    def __init__(self, params: rlwe.ParameterSet, limbs: int, num_polys: int, chunk_polys: int = CHUNK_POLYS) -> None:
        self.params = params
        self.limbs = limbs
        self.level = compact.level_parameter_set(params, limbs)
        self.num_polys = num_polys
        self.chunk_polys = chunk_polys
        self.c0: _U32 | None = None
        self.c1: _U32 | None = None
        self.folded: dict[int, Any] = {}

    def add(self, node: int, data: bytes | memoryview, extra: Any = None) -> None:
        """Check and add one ciphertext's bytes (:meth:`~flwr_fedeval.rlwe.compact.CompactCiphertext.to_bytes`).

        Every check of :meth:`~flwr_fedeval.rlwe.compact.CompactCiphertext.from_bytes` is made: the
        headers and lengths before anything is added (:func:`~flwr_fedeval.rlwe.compact.compact_count`),
        the residues of each range of polynomials before that range is added
        (:func:`~flwr_fedeval.rlwe.compact.compact_rows`). If a later range is malformed, the ranges
        already added are subtracted again (exactly: arithmetic mod q), so a refused ciphertext leaves
        the sum as it was.

        Raises
        ------
        ValueError
            The node's second ciphertext in this round, or a malformed ciphertext (naming the field),
            or one of another size than the model's.
        """
        if node in self.folded:
            raise ValueError(f"node {node}: a second ciphertext in one round")
        count = compact.compact_count(data, self.params, self.limbs)
        if count != self.num_polys:
            raise ValueError(f"{count} polynomials, expected {self.num_polys}")
        fresh = self.c0 is None or self.c1 is None
        if self.c0 is None or self.c1 is None:
            self.c0 = np.zeros((count, self.limbs, self.params.n), dtype=np.uint32)
            self.c1 = np.zeros((count, self.params.limbs, self.params.n), dtype=np.uint32)
        accs = ((self.c0, self.level.ring.q_col), (self.c1, self.params.ring.q_col))
        try:
            add_ranges(accs, lambda: compact.compact_rows(data, self.params, self.limbs, chunk_polys=self.chunk_polys))
        except ValueError:
            if fresh:
                self.c0 = self.c1 = None
            raise
        self.folded[node] = extra

    def total(self, nodes: Iterable[int]) -> CiphertextSum:
        """C = Σ_{j ∈ nodes} c_j: C0' (uint32, the decryption's accumulator) and C1's bytes
        (:func:`flwr_fedeval.rlwe.polys_to_bytes`, packed a range at a time from the uint32 sum).
        The running sum is released.

        Raises
        ------
        ValueError
            If ``nodes`` are not exactly the folded nodes.
        """
        nodes = set(nodes)
        if self.c0 is None or self.c1 is None or nodes != set(self.folded):
            raise ValueError(f"the running sum holds nodes {sorted(self.folded)}, not {sorted(nodes)}")
        c0, self.c0 = self.c0, None
        params, count = self.params, self.num_polys
        header = ser.pack_header(ser.KIND_POLYNOMIALS, params, count)
        out = bytearray(len(header) + ser.packed_size(params, count, 1))
        out[: len(header)] = header
        payload = memoryview(out)[len(header):]
        for start in range(0, count, self.chunk_polys):
            ser.pack_rows_into(params, payload, count, start, self.c1[start : start + self.chunk_polys])
        del payload
        self.c1 = None
        return CiphertextSum(c0, bytes(out))


@dataclass(frozen=True, eq=False)
class Decoded:
    """Step 4's result: the mean update Σ_C n_i·Δw_i / Σ_C n_i (float64, the model's weights flattened),
    Σ_C n_i, and (KAHE mode) the total count of values the contributors clipped, else ``None``."""

    mean_update: NDArray[np.float64]
    total_examples: int
    clipped: int | None


class ShareSum:
    """Step 3 on the server: Σ_{j∈A} D_j of the attempt in progress and the recovery shares, folded as the
    shares arrive (:meth:`add`), then C0' + Σ D'_j minus the masks (:meth:`unmask`).

    Build it with :meth:`Aggregator.share_sum`. Attempt 1's shares arrive at the key set's L' limbs; a
    retry's (k ≥ 2) at the full L limbs (:func:`flwr_fedeval.rlwe.threshold.share_limbs`, which keeps
    several complete attempts simulatable), each range parsed strictly at L and switched to L' on arrival
    (one rounding term per share, as attempt 1's: the masks still cancel, Σ m_j ≡ 0 mod q). Σ D_j is kept in
    its own accumulator (the masks cancel only over all of A; C0 stays intact for the next attempt),
    reduced in uint32.
    """

    def __init__(self, aggregator: Aggregator, contributors: Sequence[str], num_polys: int) -> None:
        self.aggregator = aggregator
        params, limbs = aggregator.params, aggregator.parameters.limbs
        self.contributors = tuple(contributors)
        self.dropped = tuple(name for name in aggregator.order if name not in self.contributors)
        self.points = dict(zip(aggregator.order, shamir.member_points(len(aggregator.order), params=params)))
        self.ring = compact.level_parameter_set(params, limbs).ring
        self.seed_shares: dict[str, dict[int, bytes]] = {name: {} for name in self.contributors}
        self.key_shares: dict[str, dict[int, bytes]] = {name: {} for name in self.dropped}
        self.acc: _U32 = np.zeros((num_polys, limbs, params.n), dtype=np.uint32)
        self.sent_at = limbs  # the level of the attempt in progress: L' for k = 1, L for a retry

    def start(self, attempt: int) -> None:
        """Begin attempt k (its shares' level; Σ D_j back to zero; the recovery shares are kept: they are
        the same Shamir shares in every attempt)."""
        agg = self.aggregator
        self.sent_at = shamir.share_limbs(agg.params, agg.parameters.limbs, attempt)
        self.acc.fill(0)

    def _rows_at_l_prime(self, share: bytes | memoryview) -> Iterator[tuple[int, _U64]]:
        agg = self.aggregator
        limbs = agg.parameters.limbs
        for start, rows in compact.share_rows(share, agg.params, self.sent_at, chunk_polys=agg.chunk_polys):
            yield start, (rows if self.sent_at == limbs else compact.switch_modulus(agg.params, rows, limbs))

    def add(self, name: str, share: bytes | memoryview, seed_shares: Sequence[bytes],
            mask_shares: Sequence[bytes]) -> None:
        """Fold member ``name``'s masked decryption share (Eq. 5, a range at a time straight from its bytes)
        and keep its recovery shares.

        Raises
        ------
        ValueError
            The share is malformed or not at the attempt's level (nothing is added), of another size, or
            the recovery shares are not one per contributor and one per dropped member.
        """
        count = compact.share_count(share, self.aggregator.params, self.sent_at)  # strict, at the attempt's level
        if count != self.acc.shape[0]:
            raise ValueError(f"share has {count} polynomials, expected {self.acc.shape[0]}")
        if len(seed_shares) != len(self.contributors) or len(mask_shares) != len(self.dropped):
            raise ValueError("recovery shares are not one per contributor and one per dropped member")
        add_ranges(((self.acc, self.ring.q_col),), lambda: self._rows_at_l_prime(share))
        x = self.points[name]
        for member, part in zip(self.contributors, seed_shares):
            self.seed_shares[member][x] = part
        for member, part in zip(self.dropped, mask_shares):
            self.key_shares[member][x] = part

    def unmask(self, c0: NDArray[np.uint32] | NDArray[np.uint64]) -> _U64:
        """C0' + Σ_{j∈A} D'_j (Eq. 5) minus Σ_{i∈C} u_i (u_i = PRG(seed_i), the seeds reconstructed from t
        shares) and minus the pairwise masks between C and K∖C (the mask keys of K∖C reconstructed),
        expanded at L limbs a range of polynomials at a time (the clients' streams,
        :class:`~flwr_fedeval.rlwe.masking.MaskSum`) and each range switched to L' once (one more rounding
        term, counted in :func:`~flwr_fedeval.rlwe.compact.compact_noise_bound`). The result is computed in
        ``c0``'s buffer (overwritten).

        Returns
        -------
        ndarray of shape (k, L', n), uint64
            round(Σ_{j∈C} m_j / Q) mod q' plus bounded noise (Q = the dropped primes; 1 if L' = L).

        Raises
        ------
        AggregationError
            At ``"mask recovery"``: a seed or a mask key does not reconstruct.
        """
        agg = self.aggregator
        params, t = agg.params, agg.parameters.threshold
        q_col = self.ring.q_col
        np.add(c0, self.acc, out=c0)  # both < 2^31: no overflow
        acc = c0
        np.minimum(acc, acc - q_col, out=acc, casting="unsafe")  # < 2q -> mod q (x - q wraps around below q)
        try:
            pairs: list[tuple[bytes, np.ufunc]] = [
                (selfmask.self_mask_key(shamir.combine_bytes(self.seed_shares[name], threshold=t)), np.subtract)
                for name in self.contributors]
            if self.dropped:
                graph = masking.mask_neighbours(agg.order, agg.parameters.mask_degree, agg.transcript)
                context = masking.mask_context(agg.transcript, agg.round)
                for name in self.dropped:
                    peers = {j: agg.mask_keys[j] for j in graph[name] if j in self.contributors}
                    if not peers:
                        continue
                    private = shamir.combine_bytes(self.key_shares[name], threshold=t)
                    pairs += masking.mask_pairs(own_name=name, own_private=private, peers=peers, context=context)
            masks = masking.MaskSum(params, pairs, acc.shape[0])
        except (ValueError, shamir.ThresholdError) as exc:
            raise AggregationError("mask recovery", f"{type(exc).__name__}: {exc}") from None
        chunk = masks.rows * -(-agg.chunk_polys // masks.rows)  # whole PRG steps per range
        zero = np.zeros((chunk, params.limbs, params.n), dtype=np.uint64)
        for start in range(0, acc.shape[0], chunk):
            rows = acc[start : start + chunk]
            correction = masks.next_rows(zero[: rows.shape[0]])
            switched = compact.switch_modulus(params, correction, agg.parameters.limbs)  # one rounding, < 1 of q'
            np.add(switched, rows, out=switched)  # < 2q' (uint64)
            np.minimum(switched, switched - q_col, out=rows, casting="unsafe")  # mod q' (wraps around below q')
        out: _U64 = acc.astype(np.uint64, copy=False)
        return out


class Aggregator:
    """The server party of one key set's round.

    Parameters
    ----------
    parameters : KeySetParameters
        What the members signed in T.
    names, mask_keys : sequence
        The members' roster names and X25519 mask keys (aligned).
    transcript : bytes
        T (the mask graph and every PRG context derive from it).
    round : int
        The round.
    size : int
        d, the model's weights (the update's length).
    chunk_polys : int, default :data:`CHUNK_POLYS`
        Polynomials per range of the fold, the mask rebuild and the decoding (memory, not results).
    """

    def __init__(self, parameters: KeySetParameters, names: Sequence[str], mask_keys: Sequence[bytes],
                 transcript: bytes, round: int, size: int, chunk_polys: int = CHUNK_POLYS) -> None:
        self.parameters = parameters
        self.params = parameters.params
        self.order = sorted(names)  # the members' points: 1..N in name order
        self.mask_keys = dict(zip(names, mask_keys))
        self.transcript = transcript
        self.round = round
        self.size = size
        self.chunk_polys = chunk_polys
        self.kahe_mode = parameters.bulk == "kahe"
        self.running: RunningSum | None = None
        self.kahe_sum: kahe.KaheSum | None = None
        #: KAHE mode: node -> (its capsule's c1 at L, its signature over it), for step 3.
        self.capsules: dict[int, tuple[bytes, bytes]] = {}

    @property
    def plaintext_length(self) -> int:
        """Encoded values per upload: every weight and n_i (CKKS mode), every weight (KAHE mode: n_i is an
        integer slot)."""
        return self.size if self.kahe_mode else self.size + 1

    @property
    def folded(self) -> dict[int, Any]:
        """Node -> what its upload carried besides the ciphertext, for every upload folded."""
        return {} if self.running is None else self.running.folded

    # ------------------------------------------------------------ step 2
    def add_upload(self, node: int, ciphertext: bytes | memoryview, capsule_bytes: bytes | memoryview | None,
                   capsule_signature: bytes, extra: Any = None) -> None:
        """Check one step-2 upload and fold it into the round's running sums.

        CKKS mode: the ciphertext (canonical compact encoding, c0 at L', c1 at L, of the model's size:
        :meth:`RunningSum.add`). KAHE mode: the capsule is parsed strictly first (one polynomial), then the
        KAHE ciphertext is added into the KAHE sum (:meth:`flwr_fedeval.rlwe.kahe.KaheSum.add`), then the
        capsule into the capsule sum; the capsule's c1 and its signature are kept for step 3. A malformed
        upload adds nothing.

        Raises
        ------
        ValueError, flwr_fedeval.rlwe.kahe.KaheError
            The ciphertext or capsule is malformed, at another level, or of another size, or it is the
            node's second in this round.
        """
        params, limbs = self.params, self.parameters.limbs
        if not self.kahe_mode:
            if self.running is None:
                self.running = RunningSum(params, limbs, -(-self.plaintext_length // params.n), self.chunk_polys)
            self.running.add(node, ciphertext, extra)
            return
        assert self.parameters.kahe is not None
        if capsule_bytes is None or not capsule_signature:
            raise ValueError("KAHE mode: the reply carries no key capsule or no signature over its c1")
        if self.running is None:
            self.running = RunningSum(params, limbs, capsule.CAPSULE_POLYS, self.chunk_polys)
        if node in self.running.folded:
            raise ValueError(f"node {node}: a second ciphertext in one round")
        parsed = compact.CompactCiphertext.from_bytes(bytes(capsule_bytes), params, limbs)
        if parsed.c1.shape[0] != capsule.CAPSULE_POLYS:
            raise ValueError(f"the key capsule has {parsed.c1.shape[0]} polynomials, expected {capsule.CAPSULE_POLYS}")
        c1 = rlwe.polys_to_bytes(params, parsed.c1)
        if self.kahe_sum is None:
            self.kahe_sum = kahe.KaheSum(self.parameters.kahe, kahe.public_seed(self.transcript, self.round),
                                         self.plaintext_length)
        self.kahe_sum.add(ciphertext)
        self.running.add(node, capsule_bytes, extra)  # parsed above: cannot fail now
        self.capsules[node] = (c1, bytes(capsule_signature))

    def total(self, nodes: Iterable[int]) -> CiphertextSum:
        """C = Σ c_j over ``nodes`` (exactly the uploads folded; KAHE mode: the capsules), releasing the
        running sum (:meth:`RunningSum.total`).

        Raises
        ------
        ValueError
            No upload was folded, or ``nodes`` are not exactly the folded ones.
        """
        if self.running is None:
            raise ValueError("no upload was folded in this round")
        return self.running.total(nodes)

    # ------------------------------------------------------------ step 2b
    def contributor_components(self, contributors: Sequence[str]) -> list[list[str]]:
        """The connected components of the mask graph induced on ``contributors`` (one: every member will
        decrypt; more: every member refuses, since once the masks of K∖C are rebuilt the sum over one
        component alone would be unmasked)."""
        graph = masking.mask_neighbours(self.order, self.parameters.mask_degree, self.transcript)
        return masking.induced_components(graph, contributors)

    # ------------------------------------------------------------ step 3
    def share_sum(self, contributors: Sequence[str], num_polys: int) -> ShareSum:
        """The accumulator of step 3 for the contributor set C (names, in the order the members were asked
        to list their recovery shares) and C0' of ``num_polys`` polynomials."""
        return ShareSum(self, contributors, num_polys)

    # ------------------------------------------------------------ step 4
    def decode(self, plaintext: NDArray[np.uint64], count: int) -> Decoded:
        """Step 4: decode Σ m = C0' + Σ D'_j minus the masks (:meth:`ShareSum.unmask`, at the key set's L'
        limbs, scale Δ / Q: :func:`flwr_fedeval.rlwe.compact.compact_combine_and_decode`'s rule), a range of
        polynomials at a time; KAHE mode: round K_C = Σ_{i∈C} k_i from it and decode the KAHE sum
        (Σ_C c_j − a_j·K_C = Δ·Σ x_j + Σ e_j). Returns the mean update over the ``count`` contributors.

        Raises
        ------
        ValueError
            ``plaintext`` is not reduced or does not hold the values.
        AggregationError
            At ``"decoding"``: a coefficient of K_C is more than 1/4 from an integer (a wrong rounding would
            be a silently wrong model), the KAHE sum does not decode, or Σ n_i is not a valid count (< |C|,
            or not an integer).
        """
        params, limbs = self.params, self.parameters.limbs
        level = compact.level_parameter_set(params, limbs)
        length = params.n if self.kahe_mode else self.plaintext_length  # KAHE mode: the capsule sum, K_C
        level.ring.check(plaintext, "plaintext")
        if plaintext.ndim != 3 or length > plaintext.shape[0] * params.n:
            raise ValueError(f"plaintext of shape {plaintext.shape} does not hold {length} values")
        decoded = np.empty(length, dtype=np.float64)
        step = self.chunk_polys * params.n
        for start in range(0, length, step):  # a range of polynomials at a time: CRT temporaries stay small
            part = plaintext[start // params.n : -(-min(start + step, length) // params.n)]
            decoded[start : start + step] = rlwe.decode(level, part, scale_bits=self.parameters.scale_bits,
                                                        length=min(step, length - start))
        decoded *= float(compact.dropped_modulus(params, limbs))
        clipped: int | None = None
        if self.kahe_mode:
            assert self.kahe_sum is not None
            try:
                sums, integers = self.kahe_sum.decode(kahe.round_key_sum(decoded))
            except kahe.KaheError as exc:
                raise AggregationError("decoding", f"the key sum of the capsules does not decode: {exc}") from None
            decoded = np.asarray(sums, dtype=np.float64)
            total_examples, clipped = float(integers[0]), int(integers[1])
        else:
            total_examples = float(decoded[-1])
            decoded = decoded[:-1]
        if not (np.isfinite(total_examples) and total_examples >= count - 0.5
                and abs(total_examples - round(total_examples)) < 1e-3):
            raise AggregationError("decoding", f"decoded Σ n_i = {total_examples!r} is not a valid count")
        decoded /= round(total_examples)
        return Decoded(decoded, int(round(total_examples)), clipped)
