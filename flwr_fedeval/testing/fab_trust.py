"""Signed FABs: SuperNodes run only the client code a publisher they trust signed.

In a Flower deployment the ClientApp reaches every SuperNode inside the FAB
(the zipped Flower App) that the SuperLink hands out, so every check the client
handlers of this project make holds only if the node runs the code its owner
trusts. Flower's SuperNode verifies FABs (``flower-supernode --trusted-entities
<yaml>``, flwr >= 1.30); this module makes the publisher key, signs a FAB and
serves it the way Flower expects. Read from flwr 1.41/1.42's source:

* **What is signed** (``flwr.supercore.primitives.asymmetric_ed25519
  .create_message_to_sign``): ``signed_at`` (Unix seconds, 8 bytes big-endian)
  followed by SHA-256 of the FAB's bytes, signed with Ed25519. The app ID and
  version are not signed: a signature vouches for the content only.
* **Where the signature travels.** Only from an app registry (Flower Hub, or
  :class:`AppRegistry` here) through the SuperLink: ``flwr run
  @publisher/name==x.y.z`` makes the SuperLink ``POST
  {FLWR_SUPERGRID_API_URL}/hub/fetch-fab`` and receive ``{"fab_url": ...,
  "verifications": [{"public_key_id", "signature" (base64url, unpadded),
  "signed_at"}]}``; it downloads the FAB and stores the verifications beside
  it (``Fab.verifications``: ``{public_key_id: json, "valid_license":
  "Valid"}``), and hands both to every SuperNode with the run. A FAB uploaded
  by ``flwr run <dir>`` carries none (the SuperLink drops whatever the request
  carries).
* **Who checks.** A SuperNode started with ``--trusted-entities`` (a YAML
  mapping ``public_key_id: "ssh-ed25519 AAAA..."``) runs a run's ClientApp only
  if one verification names a trusted key ID and that key's signature verifies
  over the FAB it received; otherwise it replies ``Error(ErrorCode.INVALID_FAB)``
  (code 7) to the run's messages and never starts a ClientApp for it.

So the SuperLink (which this project does not trust) can drop signatures,
attach its own or swap the FAB: each is refused. It can still submit any FAB
the publisher ever signed (signatures do not expire and do not name the app
version): a publisher retires a version by rotating its key.

Flower versions: flwr >= 1.41 reads the registry's address from the
``FLWR_SUPERGRID_API_URL`` environment variable, so :class:`AppRegistry` can
stand in for Flower Hub (see :func:`registry_url_configurable`). flwr 1.30
hard-codes ``https://api.flower.ai/v1``: its SuperNodes verify too, but a
signed FAB reaches them only from Flower Hub (``flwr app publish``, then
``flwr app review`` signs it), so a local deployment on 1.30 runs unsigned.

Command line (``python -m flwr_fedeval.testing.fab_trust``): ``keygen`` (the
publisher key and the SuperNodes' trusted-entities file), ``sign`` (build the
FAB of an App and sign it), ``serve`` (the registry the SuperLink fetches
signed FABs from).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

__all__ = [
    "AppRegistry", "BuiltFab", "PublisherKey", "build_fab", "message_to_sign",
    "registry_url_configurable", "trusted_entities", "verify_fab",
]

#: Flower's registry address variable (flwr >= 1.41; the SuperLink reads it at start-up).
REGISTRY_URL_ENV = "FLWR_SUPERGRID_API_URL"


def message_to_sign(fab: bytes, signed_at: int) -> bytes:
    """``signed_at`` (8 bytes, big-endian) + SHA-256(``fab``): what the publisher signs.

    The same bytes as Flower's ``create_message_to_sign(sha256(fab).digest(), signed_at)``.
    """
    if not 0 <= signed_at < 2**64:
        raise ValueError(f"signed_at must be a Unix time in [0, 2**64), got {signed_at}")
    return signed_at.to_bytes(8, "big") + hashlib.sha256(fab).digest()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _default_key_id(private: ed25519.Ed25519PrivateKey) -> str:
    raw = private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "fpk_" + hashlib.sha256(raw).hexdigest()[:32]


@dataclass(frozen=True)
class PublisherKey:
    """The federation publisher's Ed25519 key and the ID the SuperNodes know it by.

    ``key_id`` defaults to ``fpk_`` + the first 16 bytes (hex) of SHA-256 of the
    raw public key (Flower Hub's IDs also start ``fpk_``); a SuperNode looks the
    key up by this ID, so a signature under the right ID but by another key
    fails verification.
    """

    private: ed25519.Ed25519PrivateKey
    key_id: str

    @classmethod
    def generate(cls, folder: str | os.PathLike[str], key_id: str | None = None) -> PublisherKey:
        """A new key (``cryptography``, OS CSPRNG) written to ``folder/publisher.key``
        (OpenSSH format, mode 0600; ``folder`` is created mode 0700) with
        ``publisher.pub`` (OpenSSH public key) and ``trusted-entities.yaml`` beside it.

        Raises
        ------
        FileExistsError
            If ``folder/publisher.key`` exists (a key is never overwritten).
        """
        folder = Path(folder)
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        private = ed25519.Ed25519PrivateKey.generate()
        key = cls(private, key_id or _default_key_id(private))
        pem = key.private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption())
        fd = os.open(folder / "publisher.key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        (folder / "publisher.pub").write_text(f"{key.key_id} {key.public_openssh()}\n")
        (folder / "trusted-entities.yaml").write_text(trusted_entities([key]))
        return key

    @classmethod
    def load(cls, path: str | os.PathLike[str], key_id: str | None = None) -> PublisherKey:
        """Read an OpenSSH Ed25519 private key (e.g. ``publisher.key``; also ``ssh-keygen -t ed25519``).

        Raises
        ------
        ValueError
            If the file holds no unencrypted Ed25519 key.
        """
        private = serialization.load_ssh_private_key(Path(path).read_bytes(), password=None)
        if not isinstance(private, ed25519.Ed25519PrivateKey):
            raise ValueError(f"{path}: not an Ed25519 key ({type(private).__name__})")
        return cls(private, key_id or _default_key_id(private))

    def public_openssh(self) -> str:
        """``"ssh-ed25519 AAAA..."``: the form ``--trusted-entities`` expects."""
        return self.private.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                      serialization.PublicFormat.OpenSSH).decode("ascii")

    def sign(self, fab: bytes, signed_at: int | None = None) -> dict[str, Any]:
        """One verification entry for ``fab`` (Flower Hub's wire format):
        ``{"public_key_id", "signature" (base64url, unpadded), "signed_at" (int, s)}``."""
        signed_at = int(time.time()) if signed_at is None else signed_at
        signature = self.private.sign(message_to_sign(fab, signed_at))
        return {"public_key_id": self.key_id, "signature": _b64url(signature), "signed_at": signed_at}


def trusted_entities(keys: list[PublisherKey]) -> str:
    """The ``--trusted-entities`` file: ``{key_id: "ssh-ed25519 ..."}`` (JSON, which is YAML)."""
    return json.dumps({k.key_id: k.public_openssh() for k in keys}, indent=2) + "\n"


def verify_fab(fab: bytes, verifications: list[dict[str, Any]], trusted: dict[str, str]) -> bool:
    """Whether a SuperNode trusting ``trusted`` (``{key_id: "ssh-ed25519 ..."}``) accepts ``fab``
    with ``verifications``: one entry names a trusted key whose signature verifies
    (Flower's ``_verify_fab``, for checking a signed FAB before it is served)."""
    for entry in verifications:
        public = trusted.get(str(entry.get("public_key_id")))
        if public is None:
            continue
        key = serialization.load_ssh_public_key(public.encode("utf-8"))
        if not isinstance(key, ed25519.Ed25519PublicKey):
            continue
        sig = str(entry["signature"])
        try:
            key.verify(base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4)),
                       message_to_sign(fab, int(entry["signed_at"])))
            return True
        except InvalidSignature:
            continue
    return False


# ---------------------------------------------------------------- FABs
@dataclass(frozen=True)
class BuiltFab:
    """A FAB's bytes and its app ID (``@publisher/name``) and version, from its ``pyproject.toml``."""

    content: bytes
    app_id: str
    version: str

    @property
    def app_spec(self) -> str:
        """``@publisher/name==x.y.z``: what ``flwr run`` takes to fetch it through the registry."""
        return f"{self.app_id}=={self.version}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


_BUILD = """
import json, sys
from pathlib import Path
from flwr.cli.build import build_fab_from_disk
from flwr.common.config import get_fab_config, get_metadata_from_config
fab = build_fab_from_disk(Path(sys.argv[1]))
Path(sys.argv[2]).write_bytes(fab)
fab_id, version = get_metadata_from_config(get_fab_config(fab))
print(json.dumps({"fab_id": fab_id, "version": version}))
"""


def build_fab(app: str | os.PathLike[str], python: str | os.PathLike[str] | None = None) -> BuiltFab:
    """Bundle the Flower App in ``app`` exactly as ``flwr run <app>`` and ``flwr build`` do
    (Flower's ``build_fab_from_disk``, run by ``python``: default the running interpreter).

    Raises
    ------
    RuntimeError
        If Flower cannot build it (the message carries Flower's error).
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fedeval-fab-") as tmp:
        out = Path(tmp) / "app.fab"
        done = subprocess.run([str(python or sys.executable), "-c", _BUILD, str(Path(app).resolve()), str(out)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"building the FAB of {app} failed: {done.stderr.strip()[-1000:]}")
        meta = json.loads(done.stdout.strip().splitlines()[-1])
        return BuiltFab(out.read_bytes(), f"@{meta['fab_id']}", str(meta["version"]))


def registry_url_configurable(python: str | os.PathLike[str] | None = None) -> bool:
    """Whether the flwr installed for ``python`` reads the registry address from
    ``FLWR_SUPERGRID_API_URL`` (flwr >= 1.41; 1.30 only talks to Flower Hub). Probed once per
    ``python`` and process."""
    key = str(python or sys.executable)
    if key not in _REGISTRY_PROBED:
        probe = "import flwr.supercore.constant as c; print(hasattr(c, 'FLWR_SUPERGRID_API_URL'))"
        done = subprocess.run([key, "-c", probe], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:  # no answer (not kept: asked again next time)
            return False
        _REGISTRY_PROBED[key] = done.stdout.strip() == "True"
    return _REGISTRY_PROBED[key]


_REGISTRY_PROBED: dict[str, bool] = {}


# ---------------------------------------------------------------- registry
class AppRegistry:
    """A stand-in for Flower Hub's ``/hub/fetch-fab`` on ``host:port``: hands a SuperLink a
    published FAB and its verifications (start the SuperLink with
    ``FLWR_SUPERGRID_API_URL=<url>``, submit with ``flwr run <app_spec>``).

    It serves whatever was published; trust comes from the signatures, which
    every SuperNode checks, not from the registry. One FAB per ``app_spec``:
    publishing again replaces it.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._apps: dict[str, tuple[BuiltFab, list[dict[str, Any]]]] = {}
        self._fabs: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.fetches: list[str] = []  # app specs the SuperLink asked for, in order
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                if self.path.rstrip("/").split("?")[0] != "/hub/fetch-fab":
                    return self._send(404, b'{"detail": "not found"}')
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    spec = f"{body['app_id']}=={body['app_version']}"
                except (ValueError, KeyError, TypeError):
                    return self._send(400, b'{"detail": "expected app_id and app_version"}')
                with registry._lock:
                    registry.fetches.append(spec)
                    entry = registry._apps.get(spec)
                if entry is None:
                    return self._send(404, json.dumps({"detail": f"{spec} not published"}).encode())
                fab, verifications = entry
                reply = {"fab_url": f"{registry.url}/fab/{fab.sha256}", "verifications": verifications}
                return self._send(200, json.dumps(reply).encode())

            def do_GET(self) -> None:
                with registry._lock:
                    content = registry._fabs.get(self.path.rsplit("/", 1)[-1])
                if not self.path.startswith("/fab/") or content is None:
                    return self._send(404, b'{"detail": "not found"}')
                return self._send(200, content, "application/octet-stream")

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fedeval-app-registry", daemon=True)
        self._thread.start()

    def publish(self, fab: BuiltFab, verifications: list[dict[str, Any]]) -> str:
        """Serve ``fab`` with ``verifications`` (``[]``: unsigned) under its app spec; return the spec."""
        with self._lock:
            self._apps[fab.app_spec] = (fab, [dict(v) for v in verifications])
            self._fabs[fab.sha256] = fab.content
        return fab.app_spec

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


# ---------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m flwr_fedeval.testing.fab_trust keygen|sign|serve``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m flwr_fedeval.testing.fab_trust",
                                 description="Sign Flower Apps so SuperNodes run only trusted client code.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    kg = sub.add_parser("keygen", help="publisher.key (0600), publisher.pub, trusted-entities.yaml in --out")
    kg.add_argument("--out", required=True)
    sg = sub.add_parser("sign", help="build the FAB of --app, sign it: <name>.fab + <name>.fab.json in --out")
    sg.add_argument("--key", required=True, help="publisher.key")
    sg.add_argument("--app", default=".", help="the Flower App (directory with pyproject.toml)")
    sg.add_argument("--out", required=True)
    sv = sub.add_parser("serve", help="serve every signed FAB in --dir to a SuperLink (FLWR_SUPERGRID_API_URL)")
    sv.add_argument("--dir", required=True)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--port", type=int, default=8765)
    args = ap.parse_args(argv)
    if args.cmd == "keygen":
        key = PublisherKey.generate(args.out)
        print(f"publisher key {key.key_id}: {Path(args.out) / 'publisher.key'} (keep it off the SuperLink); "
              f"give every SuperNode --trusted-entities {Path(args.out) / 'trusted-entities.yaml'}")
    elif args.cmd == "sign":
        key = PublisherKey.load(args.key)
        fab = build_fab(args.app)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = f"{fab.app_id.lstrip('@').replace('/', '.')}.{fab.version}.{fab.sha256[:8]}.fab"
        (out / name).write_bytes(fab.content)
        meta = {"app_id": fab.app_id, "version": fab.version, "verifications": [key.sign(fab.content)]}
        (out / f"{name}.json").write_text(json.dumps(meta, indent=2) + "\n")
        print(f"signed {out / name} (sha256 {fab.sha256}) with {key.key_id}; submit with: flwr run {fab.app_spec}")
    else:
        registry = AppRegistry(args.host, args.port)
        for meta_file in sorted(Path(args.dir).glob("*.fab.json")):
            meta = json.loads(meta_file.read_text())
            fab = BuiltFab(meta_file.with_suffix("").read_bytes(), meta["app_id"], meta["version"])
            print(f"serving {registry.publish(fab, meta['verifications'])}")
        print(f"registry on {registry.url}: start the SuperLink with {REGISTRY_URL_ENV}={registry.url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            registry.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
