"""Cost of the signed participant list in the FHE AUC phase (issue 22: <= 0.1 s at 100 clients).

One run, side by side, JSON out (``benchmarks/results/participants.json``). What the list adds
to the phase, measured directly (median of ``--repeats``, wall clock, one process):

1. **as implemented** (:class:`flwr_fedeval.protocol.fhe_auc.ParticipantList`): the key holder
   builds and signs the list of ``--clients`` (100) roster members; the server (with the roster)
   and every client verify it (digest, one ECDSA P-256 verification, the name/key/floor
   checks). The clients verify in parallel, so the phase waits for: the key holder's signature
   + the server's verification + one client's verification (the *critical path*); the sum over
   all clients is reported too;
2. **every member signs** (the alternative the issue names): 100 signatures made (one per
   member, in parallel) and each client verifying all 100: critical path one signature + 100
   verifications per client;
3. **binding the list into the XOF**: the malicious protocol's common randomness of both runs
   (N = 100 decision points, S = 4, M = 100 parties) with and without the list's digest in the
   XOF key.

Usage::

    .venv/bin/python benchmarks/bench_participants.py [--clients 100] [--repeats 50]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
BUDGET_S = 0.1


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    import secrets

    from flwr_fedeval.fhe.auc_malicious import MaliciousAUCConfig, common_randomness, new_seed
    from flwr_fedeval.identity import NodeIdentity, Roster, sign_key, verify_key
    from flwr_fedeval.protocol.fhe_auc import SIGNED_PROTOCOL, ParticipantList

    m, session = args.clients, secrets.token_hex(16)
    idents = [NodeIdentity.generate(f"node-{i}") for i in range(m)]
    roster = Roster.from_identities(idents)
    members = {i.name: secrets.token_bytes(32) for i in idents}
    holder = idents[0]

    # 1. as implemented: the key holder signs, the server and every client verify
    listed = ParticipantList.sign(holder, session=session, members=members, protocol="malicious")
    t_sign = _median(lambda: ParticipantList.sign(holder, session=session, members=members, protocol="malicious"),
                     args.repeats)
    t_server = _median(lambda: listed.verify(roster, session=session, holder=holder.name, floor=2), args.repeats)
    own = idents[m // 2].name
    t_client = _median(lambda: listed.verify(roster, session=session, holder=holder.name, own=own,
                                             own_key=members[own], floor=2), args.repeats)
    t0 = time.perf_counter()
    for ident in idents:  # every client once, one after another
        listed.verify(roster, session=session, holder=holder.name, own=ident.name, own_key=members[ident.name],
                      floor=2)
    t_all_clients = time.perf_counter() - t0
    implemented = {
        "holder_sign_s": t_sign, "server_verify_s": t_server, "client_verify_s": t_client,
        "all_clients_verify_sequential_s": t_all_clients,
        "critical_path_s": t_sign + t_server + t_client,
    }

    # 2. every member signs the digest; each client verifies all M signatures
    digest = listed.digest(session)
    stmt = dict(protocol=SIGNED_PROTOCOL, session=session, round=0, role="participants", key=digest)
    sigs = {i.name: sign_key(i, **stmt) for i in idents}
    t_member_sign = _median(lambda: sign_key(idents[1], **stmt), args.repeats)

    def verify_all():
        for name, sig in sigs.items():
            verify_key(roster, name, sig, **stmt)

    t_verify_all = _median(verify_all, max(3, args.repeats // 10))
    t0 = time.perf_counter()
    for ident in idents:
        sign_key(ident, **stmt)
    t_all_sign = time.perf_counter() - t0
    every_member = {
        "one_member_sign_s": t_member_sign, "all_signatures_made_sequential_s": t_all_sign,
        "one_client_verifies_all_s": t_verify_all, "critical_path_s": t_member_sign + t_verify_all,
    }

    # 3. the list's digest in the malicious protocol's XOF key (both runs)
    cfg = MaliciousAUCConfig(n_points=100, max_rows=4096, n_splits=4)
    seed = new_seed()
    nonce = secrets.token_bytes(16)
    without = _median(lambda: [common_randomness(seed, config=cfg, n_parties=m, run=r, nonce=nonce)
                               for r in (0, 1)], max(3, args.repeats // 5))
    with_list = _median(lambda: [common_randomness(seed, config=cfg, n_parties=m, run=r, nonce=nonce,
                                                   transcript=digest) for r in (0, 1)], max(3, args.repeats // 5))
    xof = {"common_randomness_both_runs_without_list_s": without, "with_list_digest_s": with_list,
           "added_s": with_list - without}

    added = implemented["critical_path_s"] + max(0.0, xof["added_s"])
    out = {
        "benchmark": "signed participant list, FHE AUC phase (issue 22)",
        "clients": m,
        "repeats": args.repeats,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None},
        "implemented_key_holder_signs": implemented,
        "alternative_every_member_signs": every_member,
        "xof_binding": xof,
        "added_to_phase_critical_path_s": added,
        "budget_s": BUDGET_S,
        "within_budget": added <= BUDGET_S and every_member["critical_path_s"] <= BUDGET_S,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "participants.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
