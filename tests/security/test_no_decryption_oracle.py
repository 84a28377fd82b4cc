"""No client reply that follows a decryption depends on the private decrypted value.

The server plays the phase over the in-process grid with the real handlers and roster
identities, and sends crafted ciphertexts built from the public context only:

* FHE AUC step 6 (semi-honest): E(AUC_v − θ) from client v's own counts, for several θ on both
  sides of AUC_v — the bisection that recovered every local AUC to ±3e-5 when a client answered
  an error for an out-of-range value before looking at its policy;
* FHE AUC step 6 (malicious): client v's counts alone, with offsets;
* SecSV helper: P's half of a job altered so that the decrypted scores fall out of range or not.

Replies are compared as the server sees them (:func:`fhe_deviating_server.reply_bytes`: the
error's code and reason, or every record's entries; message ids left out). The other replies that
follow a decryption-like step were reviewed and need no test of their own: xMK-CKKS partial
decryption (the client never sees a plaintext: its reply is s_i·C1 + smudging, the same function
whatever C1 encrypts), key-bundle opening (AES-GCM: fails on the ciphertext's authenticity, not on
private data) and the DP phases (no decryption).
"""

from __future__ import annotations

import pytest
from fhe_deviating_server import (
    BACKEND,
    N,
    grid_over,
    offset_counts,
    policy_dir,
    reply_bytes,
    result_reply,
    session_counts,
    shifted_solo_auc,
)
from flwr.app import ArrayRecord

from flwr_fedeval.app.task import JobConfig, build_model
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.fhe_phase import FHEAUCPhase

#: θ on both sides of any local AUC in [0, 1]: AUC_v − θ below 0 for some, above 1 for others, in
#: range for the rest.
THETAS = (-0.9, -0.25, 0.0, 0.5, 0.999, 1.5)


@pytest.fixture(scope="module")
def arrays():
    return ArrayRecord(build_model(JobConfig()).get_weights())


def _bisection_replies(grid, phase, arrays, node_index=0):
    """One new session per θ; the reply of client v to E(AUC_v − θ)."""
    replies = {}
    for theta in THETAS:
        run, counts = session_counts(phase, grid, arrays)
        victim = sorted(run.participants)[node_index]
        replies[theta] = result_reply(grid, run, victim, shifted_solo_auc(run, counts[victim], theta))
    return replies


def test_semi_honest_not_shared_the_bisection_gets_identical_replies(tmp_path, arrays):
    """Default policy (sharing off), semi-honest protocol: every θ gets the same ``shared = false``
    report, whatever AUC_v − θ decrypts to (in range, below 0, above 1)."""
    grid = grid_over(policy_dir(tmp_path))
    replies = _bisection_replies(grid, FHEAUCPhase(N, backend=BACKEND), arrays)
    seen = {theta: reply_bytes(r) for theta, r in replies.items()}
    assert len(set(seen.values())) == 1, seen
    assert not replies[THETAS[0]].has_error()
    assert dict(replies[THETAS[0]].content["fhe-report"]) == {"status": "ok", "shared": False}


def test_semi_honest_shared_an_out_of_range_value_says_neither_which_way_nor_the_value(tmp_path, arrays):
    """Sharing on, semi-honest allowed by the operator: an in-range E(AUC_v − θ) is reported (the
    semi-honest protocol's known exposure, which is why sharing defaults to the malicious protocol);
    every out-of-range one — below 0 or above 1 — gets one and the same error reply."""
    grid = grid_over(policy_dir(tmp_path, fedeval_share_auc=True, fedeval_fhe_min_protocol="semi-honest"))
    replies = _bisection_replies(grid, FHEAUCPhase(N, backend=BACKEND), arrays)
    assert not replies[0.0].has_error()
    local_auc = float(replies[0.0].content["fhe-report"]["auc"])  # θ = 0: v's own AUC, reported
    out_of_range = {t for t in THETAS if not 1e-3 < local_auc - t < 1 - 1e-3}
    below = [t for t in out_of_range if local_auc - t < 0]
    above = [t for t in out_of_range if local_auc - t > 1]
    assert below and above  # the test covers both directions
    failed = {theta: reply_bytes(r) for theta, r in replies.items() if r.has_error()}
    assert set(failed) == out_of_range, (local_auc, sorted(failed))
    assert len(set(failed.values())) == 1, failed  # below 0 and above 1: the same reply
    ((_, code, reason),) = set(failed.values())
    assert code == ReplyCode.RESULT_REJECTED
    assert not any(ch.isdigit() for ch in reason)  # no value in the reason


@pytest.mark.parametrize("shared", [False, True])
def test_malicious_solo_and_offset_aggregates_get_identical_replies(tmp_path, arrays, shared):
    """Malicious protocol: the server aggregates client v's counts alone, with an offset θ added; the
    replies are the same for every θ (sharing off: ``shared = false``; on: one error reply)."""
    policy = {"fedeval_share_auc": True} if shared else {}
    grid = grid_over(policy_dir(tmp_path, **policy))
    phase = FHEAUCPhase(N, backend=BACKEND, protocol="malicious")
    seen = {}
    for theta in (0.0, 0.01, 0.5, 10.0):
        run, counts = session_counts(phase, grid, arrays)
        victim = sorted(run.participants)[1]
        message = offset_counts(run, counts[victim], theta) if theta else counts[victim]
        reply = result_reply(grid, run, victim, phase.aggregate(run.context, [message], run.config))
        seen[theta] = reply_bytes(reply)
    assert len(set(seen.values())) == 1, seen
    (got,) = set(seen.values())
    if shared:
        assert got[0] == "error" and got[1] == ReplyCode.RESULT_REJECTED
    else:
        assert got != () and got[0][0] == "fhe-report" and ("shared", "False") in got[0][1]


def test_the_honest_runs_beside_them_complete(tmp_path, arrays):
    """The same policies, an honest server: the AUC is computed (and reported only where shared)."""
    import math

    grid = grid_over(policy_dir(tmp_path / "off"))
    off = FHEAUCPhase(N, backend=BACKEND, share_auc_with_server=True).run(grid, arrays)
    assert math.isnan(off.auc) and sorted(off.details["decrypted_by"]) == sorted(grid.node_ids)
    grid = grid_over(policy_dir(tmp_path / "on", fedeval_share_auc=True))
    on = FHEAUCPhase(N, backend=BACKEND, protocol="malicious", share_auc_with_server=True).run(grid, arrays)
    assert 0.0 <= on.auc <= 1.0
