"""The pairwise-mask graph of degree k (SecAgg+, Bell et al. 2020) for xMK-CKKS."""

import hashlib
import itertools

import numpy as np
import pytest

from flwr_fedeval.rlwe import keyset
from flwr_fedeval.rlwe import masking as mk
from flwr_fedeval.rlwe.params import DEFAULT_PARAMETER_SET as P

T = hashlib.sha256(b"a key-set transcript").digest()
CTX = mk.mask_context(T, 1)


def _names(m):
    return [f"node-{i}" for i in range(m)]


def _connected(graph):
    start = next(iter(graph))
    seen, todo = {start}, [start]
    while todo:
        for nb in graph[todo.pop()]:
            if nb not in seen:
                seen.add(nb)
                todo.append(nb)
    return seen == set(graph)


def _edges(graph):
    return {frozenset((a, b)) for a, nbs in graph.items() for b in nbs}


@pytest.mark.parametrize("m", range(2, 17))
def test_graph_is_symmetric_regular_and_connected_for_every_degree(m):
    for k in range(0, m + 2):
        graph = mk.mask_neighbours(_names(m), k, T)
        d = mk.graph_degree(k, m)
        assert set(graph) == set(_names(m))
        assert all(len(nbs) == d and name not in nbs for name, nbs in graph.items()), (m, k)
        assert all(name in graph[nb] for name, nbs in graph.items() for nb in nbs)  # symmetric
        assert _connected(graph), (m, k)
        if k == 0 or k >= m - 1:
            assert d == m - 1  # complete graph
        else:
            assert max(k, 2) <= d <= max(k, 2) + 1 and d <= m - 1


def test_graph_degree_rules_and_errors():
    assert mk.graph_degree(4, 10) == 4
    assert mk.graph_degree(3, 10) == 3 and mk.graph_degree(3, 9) == 4  # odd degree needs an even M
    assert mk.graph_degree(1, 10) == 2  # a matching would be disconnected: a ring at least
    assert mk.graph_degree(0, 10) == 9 and mk.graph_degree(9, 10) == 9 and mk.graph_degree(50, 10) == 9
    assert mk.graph_degree(4, 2) == 1
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(mk.MaskKeyError, match="integer"):
            mk.graph_degree(bad, 5)
    with pytest.raises(mk.MaskKeyError, match="at least 2"):
        mk.graph_degree(2, 1)
    with pytest.raises(mk.MaskKeyError, match="distinct"):
        mk.mask_neighbours(["a", "a", "b"], 2, T)


def test_graph_depends_on_the_transcript_only_and_not_on_the_order_given():
    names = _names(10)
    graph = mk.mask_neighbours(names, 4, T)
    assert mk.mask_neighbours(names[::-1], 4, T) == graph  # every member recomputes the same graph
    others = [_edges(mk.mask_neighbours(names, 4, hashlib.sha256(bytes([i])).digest())) for i in range(8)]
    assert sum(e != _edges(graph) for e in others) >= 7  # another transcript: another graph
    assert len({frozenset(e) for e in others}) >= 7


def test_degree_is_bound_to_the_signed_transcript():
    members = [(n, hashlib.sha256(n.encode()).digest()) for n in _names(4)]
    kid, seed = "k" * 32, b"\x01" * 32
    digests = {k: keyset.transcript_digest(P, key_id=kid, seed_a=seed, round_=1, members=members, mask_degree=k)
               for k in (0, 2, 4)}
    assert len(set(digests.values())) == 3
    with pytest.raises(keyset.KeySetError, match="mask degree"):
        keyset.transcript_digest(P, key_id=kid, seed_a=seed, round_=1, members=members, mask_degree=-1)


def test_a_client_refuses_a_degree_below_its_floor():
    assert mk.check_mask_degree(4, 10, 4) == 4
    assert mk.check_mask_degree(6, 10, 4) == 6
    assert mk.check_mask_degree(0, 10, 4) == 9  # the complete graph satisfies every floor
    assert mk.check_mask_degree(2, 3, 4) == 2  # M = 3: the floor of 4 means the complete graph, and 2 is it
    with pytest.raises(mk.MaskKeyError, match="requires at least 4"):
        mk.check_mask_degree(2, 10, 4)
    with pytest.raises(mk.MaskKeyError, match="requires at least 9"):
        mk.check_mask_degree(4, 10, 0)  # floor 0: only the complete graph
    with pytest.raises(mk.MaskKeyError, match="floor"):
        mk.check_mask_degree(4, 10, -1)


def _graph_masks(names, degree, num_polys=1, keys=None, graph=None):
    keys = keys or {name: mk.new_mask_keypair() for name in names}
    graph = graph or mk.mask_neighbours(names, degree, T)
    return {name: mk.client_mask(P, own_name=name, own_private=keys[name][0],
                                 peers={nb: keys[nb][1] for nb in graph[name]}, context=CTX, num_polys=num_polys)
            for name in names}


@pytest.mark.parametrize("m,k", [(3, 2), (5, 2), (6, 3), (7, 3), (8, 4), (10, 4), (12, 5), (6, 0)])
def test_masks_over_the_graph_cancel_exactly_over_the_full_set(m, k):
    masks = _graph_masks(_names(m), k, num_polys=2)
    assert not P.ring.sum(np.stack(list(masks.values()))).any()
    assert all(np.mean(x == 0) < 0.01 for x in masks.values())


@pytest.mark.parametrize("m,k", [(4, 2), (6, 2), (7, 4), (8, 3)])
def test_every_proper_subset_sum_stays_masked(m, k):
    """Exhaustive: for every proper non-empty S, Σ_{i in S} r_i has (almost) no zero coefficient."""
    names = _names(m)
    masks = _graph_masks(names, k)
    for size in range(1, m):
        for subset in itertools.combinations(names, size):
            total = P.ring.sum(np.stack([masks[n] for n in subset]))
            assert np.mean(total == 0) < 0.01, subset
    # and statistically uniform mod each q_l for a few (chi-square, 16 bins, 15 dof; the masks are fresh CSPRNG
    # draws, so the bound is the 1 - 1e-9 quantile, 73.6: a suite run never fails by chance, a biased mask still does)
    for subset in (names[:1], names[: m // 2], names[1:]):
        total = P.ring.sum(np.stack([masks[n] for n in subset]))
        for l, p in enumerate(P.primes):
            u = total[:, l, :].ravel().astype(np.float64) / p
            counts = np.bincount(np.minimum((u * 16).astype(int), 15), minlength=16)
            assert np.sum((counts - u.size / 16) ** 2 / (u.size / 16)) < 73.6


def test_a_disconnected_graph_would_leak_a_partial_sum():
    """The subset check above can fail: with a perfect matching (not connected) a pair's masks cancel."""
    names = _names(4)
    matching = {"node-0": ("node-1",), "node-1": ("node-0",), "node-2": ("node-3",), "node-3": ("node-2",)}
    masks = _graph_masks(names, 0, graph=matching)
    assert not P.ring.add(masks["node-0"], masks["node-1"]).any()
