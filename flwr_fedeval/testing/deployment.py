"""A Flower deployment engine on loopback: one SuperLink and N SuperNodes, with TLS.

Flower's simulation engine runs every ClientApp in one Ray cluster; the
deployment engine runs a SuperLink and one SuperNode per data owner as
separate processes that talk gRPC over TLS, and a SuperNode is addressed by
a node ID the SuperLink assigns. :class:`LocalDeployment` starts exactly that
on ``127.0.0.1`` with Flower's own command line tools (``flower-superlink``,
``flower-supernode``, ``flwr run``), so an App can be run, and faults can be
played (a SuperNode killed or restarted, the SuperLink killed and restarted on
the same database), as an operator would, without Ray. ``make run-deployment``
and the deployment tests (``tests/deployment``) use it.

Everything lives under one work directory: a throwaway CA and a server
certificate for 127.0.0.1/localhost (``cryptography``), one ``FLWR_HOME`` per
process (the CLI's holds the ``config.toml`` with the SuperLink connection),
the SuperLink database and every process's log (``logs/<name>.log``).

Signed FABs (:mod:`flwr_fedeval.testing.fab_trust`). Where the installed flwr
can (``flower-supernode --trusted-entities`` and a SuperLink that reads its app
registry's address from ``FLWR_SUPERGRID_API_URL``: flwr >= 1.41), the
deployment makes a federation publisher Ed25519 key (in a temp dir of its own,
mode 0600, deleted at :meth:`LocalDeployment.stop`), starts every SuperNode
with ``--trusted-entities`` listing only that key, and :meth:`LocalDeployment.submit`
builds the App's FAB, signs it and submits it through a local app registry
(``flwr run @publisher/name==version``), so the nodes run only the client code
the publisher signed; a FAB submitted any other way is refused by every node.
On flwr 1.30 (its SuperLink takes signed FABs only from Flower Hub) runs are
submitted unsigned with ``flwr run <dir>`` and the nodes do not verify.

Flower versions. ``flwr >= 1.31`` serves the Fleet, Control and ServerAppIo
APIs on one ``--host``/``--port`` and a SuperNode's ClientAppIo API on its own
``--host``/``--port``; ``flwr 1.30`` has one address flag per API
(``--fleet-api-address``, ``--control-api-address``,
``--serverappio-api-address``; ``--clientappio-api-address``). The flags are
chosen from the tools' ``--help``.

Teardown. With ``--isolation subprocess`` the SuperLink starts a
``flower-superexec`` in a session of its own, which starts the ServerApp, and
every SuperNode does the same for its ClientApps; killing process groups is
not enough. Every process started here inherits a marker variable in its
environment and :meth:`LocalDeployment.stop` ends every process of this user
that carries it, then returns the ones still alive (none, normally).

Example
-------
::

    with LocalDeployment("/tmp/dep") as dep:
        dep.start_superlink()
        for k in range(3):
            dep.start_supernode(f"node-{k}", {"partition-id": k, "num-partitions": 3})
        dep.wait_for_nodes(3)
        run = dep.run(".", "num-server-rounds=1")
        assert run.status == "finished:completed", run.output
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr_fedeval.testing.fab_trust import (
    REGISTRY_URL_ENV,
    AppRegistry,
    BuiltFab,
    PublisherKey,
    build_fab,
    registry_url_configurable,
)

__all__ = ["DeploymentError", "FlwrRun", "LocalDeployment", "make_certificates"]

MARKER = "FLWR_FEDEVAL_DEPLOYMENT_TOKEN"
#: Flower's default ports: never handed out, a stray default SuperLink may hold them.
RESERVED_PORTS = frozenset({39091, 39092, 39093, 8000, 9091, 9092, 9093, 9094, 9095})
CONNECTION = "local-deployment"


class DeploymentError(RuntimeError):
    """A process of the local deployment failed or did not come up in time."""


@dataclass
class FlwrRun:
    """One ``flwr run``: its output (the ServerApp's log with ``--stream``), run id and final status.

    ``status`` is the SuperLink's, e.g. ``"finished:completed"``; ``flwr run
    --stream`` exits 0 even when the ServerApp fails, so check this, not
    ``returncode``.
    """

    output: str
    run_id: str | None
    status: str
    returncode: int | None


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (bound to port 0 together, then released)."""
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            held.append(s)
            port = s.getsockname()[1]
            if port not in RESERVED_PORTS:
                ports.append(port)
    finally:
        for s in held:
            s.close()
    return ports


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost (valid one day).

    Returns ``(ca.pem, server.pem, server.key)`` under ``folder``; the key is mode 0600.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "flwr-fedeval local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    ca_pem, cert_pem, key_pem = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_pem.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_pem.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
    )
    key_pem.chmod(0o600)
    return ca_pem, cert_pem, key_pem


def _marked_pids(token: str) -> list[int]:
    """PIDs of this user's live processes whose environment carries ``MARKER=token``."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue  # gone, or not ours
        if state not in (b"Z", b"X") and needle in env.split(b"\0"):
            found.append(int(entry))
    return found


def _descendants(pid: int) -> list[int]:
    """``pid``'s descendants (read from /proc), deepest last."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                ppid = int(fh.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


#: ``--help`` of each Flower tool, by path: read once per process (each call starts a Python that
#: imports the tool's module, ~1.5 CPU s; the flags of an installed tool do not change).
_HELP: dict[str, str] = {}


def _tool_help(path: str) -> str:
    if path in _HELP:
        return _HELP[path]
    out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=120)
    if out.returncode == 0:  # kept only when the tool answered
        _HELP[path] = out.stdout + out.stderr
    return out.stdout + out.stderr


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a TOML basic string


def node_config_string(config: Mapping[str, Any]) -> str:
    """``{"partition-id": 0, "x": "a"}`` -> ``'partition-id=0 x="a"'`` (``--node-config``)."""
    return " ".join(f"{k}={_toml_value(v)}" for k, v in config.items())


class LocalDeployment:
    """One SuperLink and any number of SuperNodes on 127.0.0.1, and ``flwr run`` against them.

    Parameters
    ----------
    workdir : path
        Where certificates, Flower homes, the SuperLink database and the logs go
        (created if missing).
    bin_dir : path, optional
        The venv ``bin`` holding ``flower-superlink``, ``flower-supernode`` and
        ``flwr``; default: the running interpreter's.
    tls : bool, default True
        Serve the SuperLink's APIs over TLS with a throwaway CA (else ``--insecure``).
    max_wait_time : float, default 3600
        A SuperNode's ``--max-wait-time`` (s) to reach the SuperLink (it retries
        while the SuperLink is restarted).
    sign_fabs : bool or None, default None
        SuperNodes verify FABs against a publisher key made here and runs are
        submitted signed (``None``: whenever the installed flwr can, see the
        module docstring; ``True``: required; ``False``: never).
    fab_cache : dict or None, default None
        FABs built by :meth:`build`, by app folder and bundling Python: pass one dict to
        the deployments of a session whose apps do not change (Flower's bundling walks the
        whole folder, a venv inside it too: seconds of CPU per build). ``None``: built
        every time.

    Attributes
    ----------
    signs_fabs : bool
        Whether SuperNodes verify FABs (``--trusted-entities``) and runs are signed.
    publisher : PublisherKey or None
        The federation publisher's key (when ``signs_fabs``).
    trusted_entities : Path or None
        The SuperNodes' ``--trusted-entities`` file (only ``publisher``'s public key).
    registry : AppRegistry or None
        The app registry the SuperLink fetches signed FABs from.

    Raises
    ------
    DeploymentError
        If Flower's tools are not in ``bin_dir``, ``sign_fabs=True`` but the
        installed flwr cannot, or a process exits or does not come up before
        its deadline (the message carries the logs' tails).
    """

    def __init__(self, workdir: str | os.PathLike[str], *, bin_dir: str | os.PathLike[str] | None = None,
                 tls: bool = True, max_wait_time: float = 3600.0, sign_fabs: bool | None = None,
                 fab_cache: dict[tuple[Path, Path], BuiltFab] | None = None) -> None:
        self.workdir = Path(workdir).resolve()
        self.fab_cache = fab_cache
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bin = Path(bin_dir) if bin_dir is not None else Path(sys.executable).parent
        for tool in ("flower-superlink", "flower-supernode", "flwr"):
            if not (self.bin / tool).exists():
                raise DeploymentError(f"{tool} not found in {self.bin}: install flwr in that environment")
        self.tls = tls
        self.max_wait_time = max_wait_time
        self.token = uuid.uuid4().hex
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}
        self._log_offset: dict[str, int] = {}  # where the latest start of a process begins in its log
        self._node_args: dict[str, list[str]] = {}
        self._node_ids: dict[str, int] = {}  # name -> node ID at its latest start
        self._listed: set[int] | None = None  # node IDs of the latest Control API listing
        self._runs_before: dict[str, set[str]] = {}  # submission name -> run IDs listed before it
        self._run_ids: dict[str, str] = {}
        self._superlink_args: list[str] | None = None
        superlink_help = self._help("flower-superlink")  # the flags this flwr version has
        self._one_port = "--port " in superlink_help  # flwr >= 1.31
        self._no_dep_install = "--disable-runtime-dependency-installation" in superlink_help
        # the Python of bin_dir's flwr (it bundles FABs and is probed for the registry variable)
        self._python = self.bin / "python" if (self.bin / "python").exists() else Path(sys.executable)
        can_sign = (sign_fabs is not False and "--trusted-entities" in self._help("flower-supernode")
                    and registry_url_configurable(self._python))
        if sign_fabs and not can_sign:
            raise DeploymentError(f"the flwr in {self.bin} cannot deliver signed FABs to SuperNodes "
                                  "(needs flower-supernode --trusted-entities and FLWR_SUPERGRID_API_URL: flwr 1.41+)")
        self.signs_fabs = can_sign if sign_fabs is None else sign_fabs
        self.publisher: PublisherKey | None = None
        self.trusted_entities: Path | None = None
        self.registry: AppRegistry | None = None
        self._publisher_dir: Path | None = None
        if self.signs_fabs:
            self._publisher_dir = Path(tempfile.mkdtemp(prefix="fedeval-publisher-"))  # mode 0700
            self.publisher = PublisherKey.generate(self._publisher_dir)  # publisher.key: mode 0600
            self.trusted_entities = self.workdir / "trusted-entities.yaml"
            shutil.copyfile(self._publisher_dir / "trusted-entities.yaml", self.trusted_entities)
            self.registry = AppRegistry()
        self.ca: Path | None = None
        if tls:
            self.ca, self._cert, self._key = make_certificates(self.workdir / "certs")
        ports = free_ports(3)
        self.control_port, self._fleet_port, self._appio_port = ports  # one port on flwr >= 1.31
        self.cli_home = self.workdir / "home-cli"
        self.cli_home.mkdir(exist_ok=True)
        connection = f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
        connection += f'address = "127.0.0.1:{self.control_port}"\n'
        connection += f'root-certificates = "{self.ca}"\n' if tls else "insecure = true\n"
        (self.cli_home / "config.toml").write_text(connection)

    # ------------------------------------------------------------ processes
    def _help(self, tool: str) -> str:
        return _tool_help(str(self.bin / tool))

    def env(self, flwr_home: Path) -> dict[str, str]:
        """The environment of every process started here (own ``FLWR_HOME``, the marker)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FLWR_INTERNAL_") and k != "FLWR_HOME"}
        flwr_home.mkdir(parents=True, exist_ok=True)
        env.update({
            "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}",
            "VIRTUAL_ENV": str(self.bin.parent),
            "FLWR_HOME": str(flwr_home),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
            "PYTHONUNBUFFERED": "1",
            MARKER: self.token,
        })
        if self.registry is not None:  # the SuperLink fetches signed FABs here; never through a proxy
            env[REGISTRY_URL_ENV] = self.registry.url
            for var in ("NO_PROXY", "no_proxy"):
                env[var] = ",".join(filter(None, [env.get(var, ""), "127.0.0.1", "localhost"]))
        return env

    def _start(self, name: str, args: list[str], flwr_home: Path) -> subprocess.Popen[bytes]:
        log = self.workdir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        self.logs[name] = log
        self._log_offset[name] = log.stat().st_size if log.exists() else 0
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(self.bin / args[0]), *args[1:]], cwd=self.workdir, env=self.env(flwr_home),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: killpg reaches its children
            )
        self.procs[name] = proc
        return proc

    def start_superlink(self, *, timeout: float = 120.0) -> None:
        """Start (or restart, on the same database) the SuperLink; wait until it listens.

        Raises
        ------
        DeploymentError
            If it exits or does not listen within ``timeout`` s.
        """
        if self._superlink_args is None:
            args = ["flower-superlink", "--isolation", "subprocess",
                    "--database", str(self.workdir / "superlink-state.db")]
            if self.tls:
                args += ["--ssl-ca-certfile", str(self.ca), "--ssl-certfile", str(self._cert),
                         "--ssl-keyfile", str(self._key)]
            else:
                args += ["--insecure"]
            if self._one_port:
                args += ["--host", "127.0.0.1", "--port", str(self.control_port)]
            else:
                args += ["--control-api-address", f"127.0.0.1:{self.control_port}",
                         "--fleet-api-address", f"127.0.0.1:{self._fleet_port}",
                         "--serverappio-api-address", f"127.0.0.1:{self._appio_port}"]
            if self._no_dep_install:
                args.append("--disable-runtime-dependency-installation")
            self._superlink_args = args
        self._start("superlink", self._superlink_args, self.workdir / "home-superlink")
        deadline = time.monotonic() + timeout
        for port in {self.control_port, self.fleet_port}:
            self._wait_for_port(port, deadline, "superlink")

    @property
    def fleet_port(self) -> int:
        """The port SuperNodes connect to (the one port on flwr >= 1.31)."""
        return self.control_port if self._one_port else self._fleet_port

    def start_supernode(self, name: str, node_config: Mapping[str, Any] | None = None, *,
                        timeout: float = 180.0) -> int:
        """Start (or, with the same ``name`` and no config, restart) a SuperNode; wait until the
        SuperLink lists it; return its node ID (after a restart: the new one).

        ``node_config`` becomes its ``--node-config`` (read by the ClientApp as
        ``context.node_config``). It reaches the SuperLink over TLS when ``tls``.
        The node ID is the one entry that appears in the SuperLink's node list
        (Control API, :meth:`nodes`) while this SuperNode starts, so SuperNodes
        are started one at a time.

        Raises
        ------
        DeploymentError
            If the SuperNode exits, or no new online node appears within ``timeout`` s.
        """
        if node_config is None and name in self._node_args:
            args = self._node_args[name]
        else:
            args = ["flower-supernode", "--superlink", f"127.0.0.1:{self.fleet_port}",
                    "--isolation", "subprocess", "--max-wait-time", str(self.max_wait_time)]
            args += ["--root-certificates", str(self.ca)] if self.tls else ["--insecure"]
            if self.trusted_entities is not None:  # run only FABs the publisher signed
                args += ["--trusted-entities", str(self.trusted_entities)]
            if node_config:
                args += ["--node-config", node_config_string(node_config)]
            (port,) = free_ports(1)
            if self._one_port:
                args += ["--host", "127.0.0.1", "--port", str(port)]
            else:
                args += ["--clientappio-api-address", f"127.0.0.1:{port}"]
            self._node_args[name] = args
        # the node IDs listed before it starts: the latest listing, once there is one (every node started
        # here is listed before its start returns; a node registering from elsewhere in the meantime
        # shows as a second new node and is refused below)
        before = set(self.nodes()) if self._listed is None else set(self._listed)
        self._start(name, args, self.workdir / f"home-{name}")
        deadline = time.monotonic() + timeout
        # Each Control API query is a `flwr` process (~1 CPU s): ask once the SuperNode has logged its
        # registration (or after 60 s, whichever comes first), not every half second while it starts.
        self._logged(name, r"SuperNode ID: \d+", min(60.0, timeout))
        while True:
            new = {n for n, entry in self.nodes().items() if n not in before and entry.get("status") == "online"}
            if len(new) == 1:
                self._node_ids[name] = new.pop()
                return self._node_ids[name]
            if len(new) > 1:
                raise DeploymentError(f"{name}: {len(new)} nodes registered while it started ({sorted(new)}); "
                                      "start SuperNodes one at a time")
            if self.procs[name].poll() is not None:
                raise DeploymentError(f"{name} exited with {self.procs[name].returncode}\n{self.tails()}")
            if time.monotonic() > deadline:
                raise DeploymentError(f"{name} not in the SuperLink's node list after {timeout:.0f} s\n{self.tails()}")
            time.sleep(1.0)

    def node_id(self, name: str) -> int:
        """The node ID the SuperLink gave SuperNode ``name`` at its latest start."""
        return self._node_ids[name]

    def wait_for_nodes(self, names: list[str] | int, timeout: float = 180.0) -> dict[str, int]:
        """Wait until the SuperLink lists the SuperNodes ``names`` (or the first ``names``) as online
        under the node IDs they registered with; return ``{name: node ID}``.

        Raises
        ------
        DeploymentError
            If one is not online within ``timeout`` s.
        """
        if isinstance(names, int):
            names = list(self._node_args)[:names]
        ids = {name: self._node_ids[name] for name in names}
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            nodes = self.nodes()
            offline = {name: i for name, i in ids.items() if nodes.get(i, {}).get("status") != "online"}
            if not offline:
                return ids
            if time.monotonic() > deadline:
                raise DeploymentError(f"not online after {timeout:.0f} s: {offline}\n{self.tails()}")
            polls += 1
            time.sleep(min(5.0, 0.5 * polls))  # a reconnect after a SuperLink restart takes Flower's back-off

    # ------------------------------------------------------------ Control API
    def _cli_json(self, args: list[str], timeout: float = 120.0) -> dict[str, Any]:
        """``flwr ARGS local-deployment --format json`` (the SuperLink's Control API), parsed."""
        out = subprocess.run([str(self.bin / "flwr"), *args, CONNECTION, "--format", "json"],
                             cwd=self.workdir, env=self.env(self.cli_home), capture_output=True, text=True,
                             timeout=timeout)
        try:
            reply = json.loads(out.stdout[out.stdout.index("{"):])
        except ValueError:
            reply = {}
        if not reply.get("success", False):
            raise DeploymentError(f"flwr {' '.join(args)}: {(out.stdout + out.stderr).strip()[-500:]}")
        return dict(reply)

    def nodes(self) -> dict[int, dict[str, Any]]:
        """The SuperLink's node list (``flwr supernode ls``): ``{node ID: entry}``; ``entry["status"]``
        is e.g. ``"online"``. Node IDs are unsigned 64-bit."""
        listed = {int(n["node-id"]): n for n in self._cli_json(["supernode", "ls"])["nodes"]}
        self._listed = set(listed)
        return listed

    def runs(self) -> dict[str, dict[str, Any]]:
        """The SuperLink's runs (``flwr ls``): ``{run ID: entry}``; ``entry["status"]`` is e.g.
        ``"finished:completed"``."""
        return {str(r["run-id"]): r for r in self._cli_json(["ls"])["runs"]}

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to process ``name`` and every process it started (default SIGKILL, as a crash).

        Its SuperExec and ClientApps leave the group (own session), so its
        descendants are signalled too.
        """
        proc = self.procs[name]
        for pid in [proc.pid, *_descendants(proc.pid)]:
            _signal(pid, sig)
        if sig == signal.SIGKILL:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def alive(self, name: str) -> bool:
        """Whether process ``name`` still runs."""
        return name in self.procs and self.procs[name].poll() is None

    # ------------------------------------------------------------ logs
    def tail(self, name: str, lines: int = 40) -> str:
        """The last ``lines`` lines of a process's log (TensorFlow start-up noise dropped)."""
        try:
            text = [line for line in self.logs[name].read_text(errors="replace").splitlines()
                    if "oneDNN custom operations" not in line]
        except (KeyError, OSError):
            return ""
        return f"--- {name} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

    def tails(self) -> str:
        """Every log's tail, for an error message."""
        return "\n".join(self.tail(name) for name in self.logs)

    def output(self, name: str) -> str:
        """What process ``name`` logged since it was last started (ANSI colours removed)."""
        with open(self.logs[name], "rb") as fh:
            fh.seek(self._log_offset.get(name, 0))
            return re.sub(r"\x1b\[[0-9;]*m", "", fh.read().decode(errors="replace"))

    def wait_for_log(self, name: str, pattern: str, deadline: float) -> re.Match[str]:
        """Wait until ``pattern`` (regex) appears in what ``name`` logged since its latest start;
        return the match.

        Raises
        ------
        DeploymentError
            If the process exits or ``deadline`` (``time.monotonic()``) passes first.
        """
        regex = re.compile(pattern)
        while True:
            m = regex.search(self.output(name))
            if m:
                return m
            if self.procs[name].poll() is not None:
                raise DeploymentError(f"{name} exited with {self.procs[name].returncode} before "
                                      f"/{pattern}/\n{self.tails()}")
            if time.monotonic() > deadline:
                raise DeploymentError(f"timed out waiting for /{pattern}/ in {name}'s log\n{self.tails()}")
            time.sleep(0.25)

    def _logged(self, name: str, pattern: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s until ``pattern`` (regex) appears in what ``name`` logged since its
        latest start; ``False`` if it does not (or the process exits first). Only paces the Control API
        queries (a file read instead of a ``flwr`` process); nothing is concluded from a log."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while not regex.search(self.output(name)):
            if self.procs[name].poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.25)
        return True

    def _wait_for_port(self, port: int, deadline: float, name: str) -> None:
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                raise DeploymentError(f"{name} exited with {self.procs[name].returncode}\n{self.tails()}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(1)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.25)
        raise DeploymentError(f"{name} did not listen on 127.0.0.1:{port}\n{self.tails()}")

    # ------------------------------------------------------------ runs
    def build(self, app: str | os.PathLike[str]) -> BuiltFab:
        """The FAB ``flwr run <app>`` would submit (Flower's own bundling, in ``bin_dir``'s Python;
        taken from ``fab_cache`` when it holds this app's)."""
        key = (Path(app).resolve(), self._python)
        if self.fab_cache is not None and key in self.fab_cache:
            return self.fab_cache[key]
        try:
            fab = build_fab(app, self._python)
        except RuntimeError as exc:
            raise DeploymentError(str(exc)) from exc
        if self.fab_cache is not None:
            self.fab_cache[key] = fab
        return fab

    def publish(self, fab: BuiltFab, verifications: list[dict[str, Any]] | None = None) -> str:
        """Put ``fab`` in the app registry, signed with the publisher key (or with
        ``verifications`` as given: ``[]`` for none, or another key's); return its app spec
        (``@publisher/name==version``) for :meth:`submit`.

        Raises
        ------
        DeploymentError
            If this deployment does not sign FABs (no registry).
        """
        if self.registry is None or self.publisher is None:
            raise DeploymentError("this deployment does not sign FABs (sign_fabs=False or flwr < 1.41)")
        if verifications is None:
            verifications = [self.publisher.sign(fab.content)]
        return self.registry.publish(fab, verifications)

    def submit(self, app: str | os.PathLike[str], run_config: str, name: str = "flwr-run", *,
               signed: bool = True) -> subprocess.Popen[bytes]:
        """Start ``flwr run <app> local-deployment --run-config ... --stream`` (not waiting).

        ``app`` is a Flower App directory or an app spec already published
        (``"@publisher/name==x.y.z"``, :meth:`publish`). When the deployment
        signs FABs (``signs_fabs``) and ``signed``, a directory's FAB is built,
        signed with the publisher key and submitted through the registry;
        ``signed=False`` submits it as ``flwr run <dir>`` does, with no
        signature (the SuperNodes then refuse it). Its run ID is the run that
        appears in the SuperLink's run list afterwards (:meth:`run_id`).
        """
        if isinstance(app, str) and app.startswith("@"):
            target = app
        elif self.signs_fabs and signed:
            target = self.publish(self.build(app))
        else:
            target = str(Path(app).resolve())
        self._runs_before[name] = set(self.runs())
        self._run_ids.pop(name, None)
        self.logs[name] = self.workdir / "logs" / f"{name}.log"
        self.logs[name].parent.mkdir(parents=True, exist_ok=True)
        self._log_offset[name] = self.logs[name].stat().st_size if self.logs[name].exists() else 0
        with open(self.logs[name], "ab") as out:
            proc = subprocess.Popen(
                [str(self.bin / "flwr"), "run", target, CONNECTION,
                 "--run-config", run_config, "--stream"],
                cwd=self.workdir, env=self.env(self.cli_home), stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def run_id(self, name: str = "flwr-run", timeout: float = 120.0) -> str:
        """The run ID of the ``flwr run`` submitted as ``name``: the one run the SuperLink lists
        (:meth:`runs`) that it did not list before the submission.

        Raises
        ------
        DeploymentError
            If no new run appears within ``timeout`` s, or more than one does.
        """
        if name in self._run_ids:
            return self._run_ids[name]
        deadline = time.monotonic() + timeout
        # the CLI prints the run ID once the SuperLink has it: ask the Control API then (the ID asked
        # for is the Control API's, not the printed one)
        self._logged(name, r"started run", min(60.0, timeout))
        while True:
            new = set(self.runs()) - self._runs_before[name] - set(self._run_ids.values())
            if len(new) == 1:
                self._run_ids[name] = new.pop()
                return self._run_ids[name]
            if len(new) > 1:
                raise DeploymentError(f"{name}: {len(new)} runs appeared ({sorted(new)}); submit one at a time")
            if time.monotonic() > deadline:
                raise DeploymentError(f"{name}: no run in the SuperLink's list after {timeout:.0f} s\n"
                                      f"{self.tail(name)}")
            time.sleep(1.0)

    def status(self, run_id: str, timeout: float = 120.0) -> str:
        """The run's status from the Control API (``flwr ls --run-id``), e.g. ``"finished:completed"``."""
        try:
            return str(self._cli_json(["ls", "--run-id", str(run_id)], timeout=timeout)["runs"][0]["status"])
        except (DeploymentError, KeyError, IndexError) as exc:
            return f"unknown ({exc})"

    def wait_finished(self, run_id: str, timeout: float) -> str:
        """Poll the run's status until it is ``finished:*``; return it (or the last one at ``timeout``).

        While the run's own ``flwr run --stream`` (:meth:`submit`) still follows it, the status is asked
        every 30 s only (each query is a ``flwr`` process, ~1 CPU s); once that stream ends (the run
        finished, or the connection was lost), every 2 s.
        """
        deadline = time.monotonic() + timeout
        streams = [self.procs[n] for n, r in self._run_ids.items() if r == str(run_id) and n in self.procs]
        status = self.status(run_id)
        asked = time.monotonic()
        while not status.startswith("finished") and time.monotonic() < deadline:
            following = any(p.poll() is None for p in streams)
            time.sleep(0.5 if following else 2.0)
            if following and time.monotonic() - asked < 30.0 and any(p.poll() is None for p in streams):
                continue
            status = self.status(run_id)
            asked = time.monotonic()
        return status

    def run(self, app: str | os.PathLike[str], run_config: str, *, name: str = "flwr-run",
            timeout: float = 3600.0, signed: bool = True) -> FlwrRun:
        """``flwr run`` (:meth:`submit`) and wait: the streamed output, run id and the
        SuperLink's final status.

        A run still going at ``timeout`` s is reported with its current status
        (not ``finished:*``); the caller decides.
        """
        proc = self.submit(app, run_config, name, signed=signed)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        output = self.output(name)
        try:
            run_id: str | None = self.run_id(name, timeout=30.0)
        except DeploymentError:
            run_id = None
        status = self.wait_finished(run_id, 60.0) if run_id else "not started"
        return FlwrRun(output=output, run_id=run_id, status=status, returncode=proc.returncode)

    # ------------------------------------------------------------ teardown
    def stop(self) -> list[int]:
        """Terminate everything started here (and its children); return the PIDs left (normally none)."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in _marked_pids(self.token):
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _marked_pids(self.token):
            time.sleep(0.25)
        for _ in range(20):  # SIGKILL what is left, repeatedly (a dying parent may spawn)
            for proc in self.procs.values():
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            left = _marked_pids(self.token)
            if not left:
                break
            for pid in left:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.25)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.registry is not None:
            self.registry.close()
            self.registry = None
        if self._publisher_dir is not None:  # the publisher's private key goes with the deployment
            shutil.rmtree(self._publisher_dir, ignore_errors=True)
        return _marked_pids(self.token) + [p.pid for p in self.procs.values() if p.poll() is None]

    def __enter__(self) -> LocalDeployment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m flwr_fedeval.testing.deployment``: run an App on a local deployment engine.

    Starts the SuperLink and ``--nodes`` SuperNodes (TLS; node ``k`` gets node
    config ``partition-id=k num-partitions=N`` and, with ``--identity-dir``,
    its signing key ``node-k.key`` and the roster; each trusts only this
    deployment's publisher key where flwr can verify FABs), submits ``flwr run``
    (the App's FAB signed with that key),
    prints its streamed output, stops every process and exits 0 only if the
    SuperLink reports ``finished:completed``.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m flwr_fedeval.testing.deployment",
                                 description=(main.__doc__ or "").split("\n")[0])
    ap.add_argument("--nodes", type=int, required=True, help="number of SuperNodes (data clients)")
    ap.add_argument("--app", default=".", help="the Flower App (directory with pyproject.toml)")
    ap.add_argument("--run-config", default="", help="flwr run --run-config overrides")
    ap.add_argument("--identity-dir", help="node-<k>.key files and roster.json (python -m flwr_fedeval.keys create)")
    ap.add_argument("--workdir", required=True, help="certificates, Flower homes, database, logs")
    ap.add_argument("--insecure", action="store_true", help="no TLS")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take")
    args = ap.parse_args(argv)
    if args.nodes < 1:
        ap.error("--nodes must be >= 1")
    t0 = time.monotonic()
    with LocalDeployment(args.workdir, tls=not args.insecure) as dep:
        try:
            dep.start_superlink()
            for k in range(args.nodes):
                config: dict[str, Any] = {"partition-id": k, "num-partitions": args.nodes}
                if args.identity_dir:
                    ids = Path(args.identity_dir).resolve()
                    config.update({"fedeval-identity-key": str(ids / f"node-{k}.key"),
                                   "fedeval-roster": str(ids / "roster.json")})
                dep.start_supernode(f"node-{k}", config)
            nodes = dep.wait_for_nodes(args.nodes)
        except DeploymentError as exc:
            print(f"local deployment: {exc}", file=sys.stderr)
            return 1
        print(f"local deployment: SuperLink on 127.0.0.1:{dep.control_port} ({'TLS' if dep.tls else 'insecure'}), "
              f"{len(nodes)} SuperNodes up in {time.monotonic() - t0:.1f} s; logs in {dep.workdir / 'logs'}",
              flush=True)
        if dep.publisher is not None:
            print(f"local deployment: the FAB is signed by publisher key {dep.publisher.key_id}, the only key "
                  "the SuperNodes trust (--trusted-entities)", flush=True)
        else:
            print("local deployment: the FAB is NOT signed and the SuperNodes do not verify it "
                  "(this flwr cannot deliver signed FABs locally: flwr >= 1.41 can)", flush=True)
        try:
            run = dep.run(args.app, args.run_config, timeout=args.timeout)
        except DeploymentError as exc:
            print(f"local deployment: {exc}", file=sys.stderr)
            return 1
        print(run.output, flush=True)
        print(f"local deployment: run {run.run_id} ended with status '{run.status}' "
              f"after {time.monotonic() - t0:.1f} s", flush=True)
    return 0 if run.status == "finished:completed" else 1


if __name__ == "__main__":
    sys.exit(main())
