"""Create node signing keys and the roster: ``python -m flwr_fedeval.keys create --out DIR --nodes N``.

Writes, into ``DIR`` (created with mode 0700 if missing):

* ``<name>.key`` — one private key per node: ECDSA P-256, OpenSSH format,
  mode 0600. The same file works as ``flower-supernode
  --auth-supernode-private-key`` and as the node config
  ``fedeval-identity-key``;
* ``<name>.pub`` — its OpenSSH public key line (for ``flwr supernode
  register`` / the SuperLink's list of authorised SuperNodes);
* ``roster.json`` — the federation's roster (:class:`flwr_fedeval.identity.Roster`),
  mode 0644, to be given to every node (node config ``fedeval-roster``).

Names default to ``node-0 … node-{N-1}`` (simulation: partition id i loads
``node-i.key``). Existing files are never overwritten. Prints the roster
fingerprint, to be compared out of band by every node operator.

``python -m flwr_fedeval.keys show ROSTER`` prints the names, key
fingerprints and the roster fingerprint.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

from flwr_fedeval.identity import IdentityError, NodeIdentity, Roster

__all__ = ["create", "main"]


def create(out: str | os.PathLike, names: list[str]) -> Roster:
    """Generate one key per name into ``out`` and write ``roster.json``; returns the roster.

    Raises
    ------
    IdentityError
        Duplicate or invalid names, or a file that already exists.
    """
    if not names:
        raise IdentityError("at least one node name is needed")
    if len(set(names)) != len(names):
        raise IdentityError(f"node names must be distinct, got {names}")
    out = Path(out)
    if not out.exists():
        out.mkdir(parents=True, mode=0o700)
    targets = [out / "roster.json"] + [out / f"{n}.{ext}" for n in names for ext in ("key", "pub")]
    existing = [str(p) for p in targets if p.exists()]
    if existing:
        raise IdentityError(f"refusing to overwrite {existing}")
    identities = [NodeIdentity.generate(n) for n in names]
    roster = Roster.from_identities(identities)
    for ident in identities:
        ident.save(out / f"{ident.name}.key")
        (out / f"{ident.name}.pub").write_bytes(ident.public_key_bytes() + b"\n")
    roster.save(out / "roster.json")
    return roster


def _show(roster: Roster) -> None:
    for name in roster.names:
        fp = hashlib.sha256(roster.public_key_bytes(name)).hexdigest()[:16]
        print(f"{name}\t{fp}")
    print(f"roster fingerprint {roster.fingerprint()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flwr_fedeval.keys", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="create one private key per node and the roster")
    c.add_argument("--out", required=True, help="output directory")
    c.add_argument("--nodes", type=int, help="number of nodes (names node-0 .. node-{N-1})")
    c.add_argument("--names", nargs="+", help="node names (instead of, or as many as, --nodes)")
    s = sub.add_parser("show", help="print the names and fingerprints of a roster")
    s.add_argument("roster")
    args = parser.parse_args(argv)
    try:
        if args.command == "show":
            _show(Roster.load(args.roster))
            return 0
        if args.names and args.nodes is not None and len(args.names) != args.nodes:
            parser.error(f"--names lists {len(args.names)} names, --nodes says {args.nodes}")
        if not args.names and (args.nodes is None or args.nodes < 1):
            parser.error("give --nodes N (>= 1) or --names")
        names = args.names or [f"node-{i}" for i in range(args.nodes)]
        roster = create(args.out, names)
    except IdentityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(names)} private keys and roster.json to {args.out}")
    _show(roster)
    return 0


if __name__ == "__main__":
    sys.exit(main())
