"""Create node signing keys and the roster: ``python -m flwr_fedeval.keys create --out DIR --nodes N``.

Writes, into ``DIR`` (created with mode 0700 if missing):

* ``<name>.key`` — one private key per node: ECDSA P-256, OpenSSH format,
  mode 0600. The same file works as ``flower-supernode
  --auth-supernode-private-key`` and as the node config
  ``fedeval-identity-key``;
* ``<name>.pub`` — its OpenSSH public key line (for ``flwr supernode
  register`` / the SuperLink's list of authorised SuperNodes);
* ``roster.json`` — the federation's roster (:class:`flwr_fedeval.identity.Roster`),
  mode 0644, to be given to every node (node config ``fedeval-roster``);
* ``<name>.policy.toml`` — the node's policy (what leaves the node:
  :mod:`flwr_fedeval.clients.policy`), the documented defaults (AUC sharing off,
  ε = 1 per evaluation, one evaluation per global model) unless ``--policy
  KEY=VALUE`` sets a key for every node; node config ``fedeval-*`` keys override it;
* ``<name>.ledger.sqlite`` — the node's privacy ledger (:mod:`flwr_fedeval.ledger`), mode 0600:
  what the node has given, across runs (models trained on, ε spent, randomized responses,
  evaluations per model, SecSV deals). Keep it with the key and back it up; deleting it gives
  a server a fresh budget (docs/how-to/node-ledger.md).

Names default to ``node-0 … node-{N-1}`` (simulation: partition id i loads
``node-i.key``). Existing files are never overwritten. Prints the roster
fingerprint, to be compared out of band by every node operator.

``python -m flwr_fedeval.keys show ROSTER`` prints the names, key
fingerprints and the roster fingerprint.

``python -m flwr_fedeval.keys ledger PATH`` prints a node's ledger as a person reads it (models
trained on, ε spent per dataset and what is left, evaluations per model, SecSV deals and
batches); ``--create`` makes an empty one at ``PATH`` (e.g. for a key made before ledgers existed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any

from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster

__all__ = ["create", "main"]


def create(out: str | os.PathLike[str], names: list[str], *, policy: dict[str, Any] | None = None) -> Roster:
    """Generate one key per name into ``out``, write ``roster.json``, one policy file per node
    (:data:`~flwr_fedeval.clients.policy.POLICY_DEFAULTS` updated by ``policy``) and one empty privacy
    ledger per node (``<name>.ledger.sqlite``); returns the roster.

    Raises
    ------
    IdentityError
        Duplicate or invalid names, a file that already exists, or a ``policy`` key that is not a
        node policy key.
    """
    from flwr_fedeval.clients.ledger import LEDGER_SUFFIX
    from flwr_fedeval.clients.policy import POLICY_DEFAULTS, POLICY_SUFFIX, write_policy_file
    from flwr_fedeval.ledger import NodeLedger

    unknown = sorted(set(policy or {}) - set(POLICY_DEFAULTS))
    if unknown:
        raise IdentityError(f"not node policy keys: {unknown}; known: {sorted(POLICY_DEFAULTS)}")
    if not names:
        raise IdentityError("at least one node name is needed")
    if len(set(names)) != len(names):
        raise IdentityError(f"node names must be distinct, got {names}")
    out = Path(out)
    if not out.exists():
        out.mkdir(parents=True, mode=0o700)
    targets = [out / "roster.json"] + [out / f"{n}{ext}" for n in names
                                       for ext in (".key", ".pub", POLICY_SUFFIX, LEDGER_SUFFIX)]
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise IdentityError(f"refusing to overwrite {existing}")
    identities = [NodeIdentity.generate(n) for n in names]
    roster = Roster.from_identities(identities)
    for ident in identities:
        ident.save(out / f"{ident.name}.key")
        (out / f"{ident.name}.pub").write_bytes(ident.public_key_bytes() + b"\n")
        write_policy_file(out / f"{ident.name}{POLICY_SUFFIX}", policy)
        NodeLedger.create(out / f"{ident.name}{LEDGER_SUFFIX}")
    roster.save(out / "roster.json")
    return roster


def _toml_value(text: str) -> Any:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef,unused-ignore]
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:  # a bare word (fedeval-fhe-min-protocol=malicious): the string
        return text


def _show(roster: Roster) -> None:
    for name in roster.names:
        fp = hashlib.sha256(roster.public_key_bytes(name)).hexdigest()[:16]
        print(f"{name}\t{fp}")
    print(f"roster fingerprint {roster.fingerprint()}")


def _show_policy(names: list[str], policy: dict[str, Any]) -> None:
    """Print the policy every ``<name>.policy.toml`` now holds, and how to change what leaves a node."""
    from flwr_fedeval.clients.policy import POLICY_DEFAULTS, POLICY_SUFFIX, SHARE_AUC

    values = {**POLICY_DEFAULTS, **policy}
    print(f"node policy written to {names[0]}{POLICY_SUFFIX}{' ...' if len(names) > 1 else ''} "
          f"(what leaves each node; the node config's fedeval-* keys override it):")
    for key, value in values.items():
        origin = "--policy" if key in policy else "default"
        print(f"  {key} = {str(value).lower() if isinstance(value, bool) else value}\t({origin})")
    if not values[SHARE_AUC]:
        print(f"the FHE AUC stays on the nodes ({SHARE_AUC} = false): the server reports it as 'not shared by "
              f"policy'; to let the nodes report it, create the keys with --policy {SHARE_AUC}=true or set "
              f"{SHARE_AUC} = true in each {POLICY_SUFFIX} file")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flwr_fedeval.keys", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="create one private key per node and the roster")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--nodes", type=int, help="number of nodes (names node-0 .. node-{N-1})")
    c.add_argument("--names", nargs="+", help="node names (instead of, or as many as, --nodes)")
    w = sub.add_parser("policy", help="write the missing <name>.policy.toml files of existing keys")
    w.add_argument("--out", required=True, help="the keys' directory")
    w.add_argument("--nodes", type=int, help="number of nodes (names node-0 .. node-{N-1})")
    w.add_argument("--names", nargs="+", help="node names")
    for p in (c, w):
        p.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE",
                       help="a node policy value for every node's <name>.policy.toml (TOML value, e.g. "
                            "fedeval-share-auc=true); repeat for several")
    s = sub.add_parser("show", help="print the names and fingerprints of a roster")
    s.add_argument("roster")
    g = sub.add_parser("ledger", help="print a node's privacy ledger (or --create an empty one)")
    g.add_argument("path", help="the ledger, e.g. DIR/node-0.ledger.sqlite")
    g.add_argument("--create", action="store_true", help="create an empty ledger at PATH (never overwrites)")
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            _show(Roster.load(args.roster))
            return 0
        if args.command == "ledger":
            from flwr_fedeval.ledger import LedgerError, NodeLedger

            try:
                ledger = NodeLedger.create(args.path) if args.create else NodeLedger(args.path)
                print(ledger.summary().text())
            except LedgerError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            return 0
        if args.names and args.nodes is not None and len(args.names) != args.nodes:
            parser.error(f"--names lists {len(args.names)} names, --nodes says {args.nodes}")
        if not args.names and (args.nodes is None or args.nodes < 1):
            parser.error("give --nodes N (>= 1) or --names")
        names = args.names or [f"node-{i}" for i in range(args.nodes)]
        policy = {}
        for item in args.policy:
            key, sep, value = item.partition("=")
            if not sep:
                parser.error(f"--policy {item!r}: expected KEY=VALUE")
            try:
                policy[key.strip()] = _toml_value(value.strip())
            except ValueError as exc:
                parser.error(f"--policy {item!r}: {exc}")
        if args.command == "policy":
            from flwr_fedeval.clients.policy import POLICY_SUFFIX, write_policy_file

            missing = [Path(args.out) / f"{n}{POLICY_SUFFIX}" for n in names]
            missing = [p for p in missing if not p.exists()]
            for path in missing:
                write_policy_file(path, policy)
            print(f"wrote {len(missing)} policy file(s) to {args.out}")
            return 0
        roster = create(args.out, names, policy=policy)
    except (IdentityError, ValueError) as exc:  # ValueError: protocol.Refused, a bad policy value
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(names)} private keys, policy files, privacy ledgers and roster.json to {args.out}")
    _show(roster)
    _show_policy(names, policy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
