"""SuperNodes run only the client code the federation's publisher signed (issue 22, item 4).

The ClientApp reaches a SuperNode inside the FAB the SuperLink hands out, and
the SuperLink is the party this project does not trust. Flower's SuperNode,
started with ``--trusted-entities``, runs a run's ClientApp only if the FAB
carries a signature by a trusted key (:mod:`flwr_fedeval.testing.fab_trust`).

* Fast tests: our signatures and registry replies are accepted by Flower's
  own code (``_verify_fab`` of the SuperNode, ``request_download_link`` and
  ``_format_verification`` of the SuperLink), and tampering is refused by it.
* The deployment test: one SuperLink and two SuperNodes that trust only the
  publisher key of :class:`LocalDeployment`, and a tiny App whose ClientApp
  writes a file per node and run. The FAB signed by the publisher runs on
  both nodes; the server's own client code (same app ID and version,
  another ClientApp) is refused by both nodes — submitted unsigned (``flwr run
  <dir>``), signed by another key under the publisher's key ID, and carrying
  the publisher's genuine signature of another FAB. Checked: the run's status
  (Control API), each node's reply (an ``INVALID_FAB`` error), and that no
  ClientApp of a refused run wrote anything.
"""

from __future__ import annotations

import importlib
import json
import stat
import time
from pathlib import Path

import pytest
import requests
import yaml
from deployment_support import BUDGET_S, bin_dir
from flwr.common.constant import ErrorCode
from flwr.supercore.utils import request_download_link
from flwr.supernode import start_client_internal

from flwr_fedeval.testing.deployment import DeploymentError, FlwrRun, LocalDeployment
from flwr_fedeval.testing.fab_trust import AppRegistry, PublisherKey, build_fab

REPO_ROOT = Path(__file__).resolve().parents[2]

_CLIENT = '''"""The test ClientApp: a file per node and run, then a reply naming this variant."""
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

VARIANT = {variant!r}
app = ClientApp()


@app.query()
def query(msg: Message, context: Context) -> Message:
    marker = Path(str(context.node_config["fabtrust-dir"])) / f"run-{{context.run_id}}-node-{{context.node_id}}"
    marker.write_text(VARIANT)
    return Message(RecordDict({{"answer": ConfigRecord({{"variant": VARIANT}})}}), reply_to=msg)
'''

_SERVER = '''"""The test ServerApp: one query to every node; fails unless every node answered."""
import json
from pathlib import Path

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    nodes = sorted(grid.get_node_ids())
    replies = grid.send_and_receive(
        [Message(RecordDict(), dst_node_id=n, message_type="query") for n in nodes], timeout=600)
    seen = {}
    for reply in replies:
        seen[str(reply.metadata.src_node_id)] = (
            {"error": reply.error.code} if reply.has_error()
            else {"variant": str(reply.content["answer"]["variant"])})
    out = Path(str(context.run_config["out-dir"])) / f"run-{context.run_id}.json"
    out.write_text(json.dumps({"nodes": [str(n) for n in nodes], "replies": seen}))
    if len(seen) != len(nodes) or any("error" in r for r in seen.values()):
        raise RuntimeError(f"not every node answered: {seen}")
'''

_PYPROJECT = '''[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "fabtrust-app"
version = "1.0.0"
dependencies = ["flwr"]

[tool.hatch.build.targets.wheel]
packages = ["fabtrust_app"]

[tool.flwr.app]
publisher = "fedeval-test"

[tool.flwr.app.components]
serverapp = "fabtrust_app.server:app"
clientapp = "fabtrust_app.client:app"

[tool.flwr.app.config]
out-dir = ""
'''


def write_app(folder: Path, variant: str) -> Path:
    """A two-file Flower App (``@fedeval-test/fabtrust-app==1.0.0``) whose ClientApp says ``variant``."""
    pkg = folder / "fabtrust_app"
    pkg.mkdir(parents=True)
    (folder / "pyproject.toml").write_text(_PYPROJECT)
    (pkg / "__init__.py").write_text("")
    (pkg / "client.py").write_text(_CLIENT.format(variant=variant))
    (pkg / "server.py").write_text(_SERVER)
    return folder


def flower_accepts(fab: bytes, verifications: dict[str, str], trusted: dict[str, str]) -> bool:
    """Flower's SuperNode check (``_verify_fab``; its ``Fab`` type moved between flwr 1.30 and 1.41)."""
    fab_type = start_client_internal.Fab
    return bool(start_client_internal._verify_fab(fab_type("", fab, verifications), trusted))


def flower_format(verifications: list[dict]) -> dict[str, str]:
    """What Flower's SuperLink stores beside a FAB fetched from the registry."""
    for module in ("flwr.superlink.servicer.control.control_handlers",   # flwr >= 1.41
                   "flwr.superlink.servicer.control.control_servicer"):  # flwr 1.30
        fmt = getattr(importlib.import_module(module), "_format_verification", None)
        if fmt is not None:
            return dict(fmt(verifications))
    raise AssertionError("Flower's _format_verification not found")


# ---------------------------------------------------------------- fast: against Flower's own code
@pytest.fixture(scope="module")
def app_fabs(tmp_path_factory):
    """The FAB of the published test App and of the server's own variant (same ID and version)."""
    root = tmp_path_factory.mktemp("apps")
    return (build_fab(write_app(root / "published" / "fabtrust-app", "published")),
            build_fab(write_app(root / "evil" / "fabtrust-app", "server's own")))


def test_publisher_key_file_is_private_and_its_trusted_entities_load_as_flower_does(tmp_path):
    key = PublisherKey.generate(tmp_path / "publisher")
    assert stat.S_IMODE((tmp_path / "publisher" / "publisher.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "publisher").stat().st_mode) == 0o700
    trusted = yaml.safe_load((tmp_path / "publisher" / "trusted-entities.yaml").read_text())  # as flower-supernode
    assert trusted == {key.key_id: key.public_openssh()}
    assert PublisherKey.load(tmp_path / "publisher" / "publisher.key").key_id == key.key_id
    with pytest.raises(FileExistsError):
        PublisherKey.generate(tmp_path / "publisher")  # never overwritten


@pytest.mark.process  # build_fab: a subprocess Python
def test_flower_supernode_accepts_only_the_publishers_signature_of_that_fab(tmp_path, app_fabs):
    published, evil = app_fabs
    assert (published.app_spec, evil.app_spec) == ("@fedeval-test/fabtrust-app==1.0.0",) * 2
    assert published.sha256 != evil.sha256
    key = PublisherKey.generate(tmp_path / "publisher")
    impostor = PublisherKey.generate(tmp_path / "impostor", key_id=key.key_id)  # claims the publisher's ID
    stranger = PublisherKey.generate(tmp_path / "stranger")
    trusted = {key.key_id: key.public_openssh()}
    signed = key.sign(published.content)
    assert flower_accepts(published.content, flower_format([signed]), trusted)
    assert flower_accepts(published.content, flower_format([stranger.sign(published.content), signed]), trusted)
    assert not flower_accepts(evil.content, flower_format([signed]), trusted)  # genuine signature, other FAB
    assert not flower_accepts(evil.content, flower_format([impostor.sign(evil.content)]), trusted)
    assert not flower_accepts(evil.content, flower_format([stranger.sign(evil.content)]), trusted)
    assert not flower_accepts(evil.content, flower_format([]), trusted)


@pytest.mark.process
def test_registry_speaks_flower_hubs_protocol(tmp_path, app_fabs):
    """What Flower's SuperLink does on ``flwr run @app==version``: fetch-fab, download, store the
    verifications; what its SuperNode then checks."""
    published, _ = app_fabs
    key = PublisherKey.generate(tmp_path / "publisher")
    registry = AppRegistry()
    try:
        registry.publish(published, [key.sign(published.content)])
        url, verifications, _ = request_download_link(published.app_id, published.version,
                                                      f"{registry.url}/hub/fetch-fab", "fab_url")
        content = requests.get(url, timeout=30).content
        assert content == published.content
        assert flower_accepts(content, flower_format(verifications), {key.key_id: key.public_openssh()})
        with pytest.raises(ValueError):  # not published
            request_download_link(published.app_id, "9.9.9", f"{registry.url}/hub/fetch-fab", "fab_url")
    finally:
        registry.close()


@pytest.mark.process
def test_command_line_keygen_and_sign_give_what_a_supernode_accepts(tmp_path):
    """The operator's path (README, multi-machine section): keygen, sign; the signed FAB file and its
    signature are what Flower's SuperNode accepts, with the trusted-entities file keygen wrote."""
    from flwr_fedeval.testing.fab_trust import main

    app = write_app(tmp_path / "fabtrust-app", "published")
    assert main(["keygen", "--out", str(tmp_path / "publisher")]) == 0
    assert main(["sign", "--key", str(tmp_path / "publisher" / "publisher.key"), "--app", str(app),
                 "--out", str(tmp_path / "signed")]) == 0
    (meta_file,) = (tmp_path / "signed").glob("*.fab.json")
    meta = json.loads(meta_file.read_text())
    fab = meta_file.with_suffix("").read_bytes()
    assert (meta["app_id"], meta["version"]) == ("@fedeval-test/fabtrust-app", "1.0.0")
    assert fab == build_fab(app).content  # what `flwr run <app>` would have uploaded
    trusted = yaml.safe_load((tmp_path / "publisher" / "trusted-entities.yaml").read_text())
    assert flower_accepts(fab, flower_format(meta["verifications"]), trusted)
    assert not flower_accepts(fab + b"\0", flower_format(meta["verifications"]), trusted)


# ---------------------------------------------------------------- on the deployment engine
@pytest.mark.deployment
@pytest.mark.process
def test_supernodes_run_only_the_fab_the_publisher_signed(deployment: LocalDeployment, tmp_path):
    dep = deployment
    if not dep.signs_fabs:
        pytest.skip(f"the flwr in {bin_dir()} cannot deliver signed FABs locally (flwr 1.30: Flower Hub only)")
    assert dep.publisher is not None and dep.trusted_entities is not None
    assert json.loads(dep.trusted_entities.read_text()) == {dep.publisher.key_id: dep.publisher.public_openssh()}
    deadline = time.monotonic() + BUDGET_S
    app = write_app(tmp_path / "published" / "fabtrust-app", "published")
    evil = write_app(tmp_path / "evil" / "fabtrust-app", "server's own")
    marks, out = tmp_path / "executed", tmp_path / "out"
    marks.mkdir()
    out.mkdir()
    try:
        dep.start_superlink()
        for k in range(2):
            dep.start_supernode(f"supernode-{k}", {"fabtrust-dir": str(marks)})
        node_ids = set(dep.wait_for_nodes(2).values())
    except DeploymentError as exc:
        pytest.fail(str(exc))

    def run(app_or_spec: Path | str, name: str, signed: bool = True) -> tuple[FlwrRun, dict, dict[int, str]]:
        result = dep.run(app_or_spec, f"out-dir='{out}'", name=name, signed=signed,
                         timeout=max(1.0, deadline - time.monotonic()))
        assert result.run_id, f"{name}: no run\n{result.output}\n{dep.tails()}"
        report = json.loads((out / f"run-{result.run_id}.json").read_text())
        executed = {int(p.name.rsplit("-", 1)[1]): p.read_text() for p in marks.glob(f"run-{result.run_id}-node-*")}
        return result, report, executed

    # The publisher's FAB (signed, through the registry): runs on both nodes.
    ok, report, executed = run(app, "signed")
    assert ok.status == "finished:completed", f"{ok.status}\n{dep.tails()}"
    assert executed == dict.fromkeys(node_ids, "published")
    assert report["replies"] == {str(n): {"variant": "published"} for n in node_ids}

    # The server's own client code: every node refuses it, no ClientApp runs.
    evil_fab = dep.build(evil)
    impostor = PublisherKey.generate(tmp_path / "impostor", key_id=dep.publisher.key_id)
    genuine_of_other_fab = dep.publisher.sign(dep.build(app).content)
    refused = [  # (name, what to submit: made when it is submitted, as publish replaces, signed)
        ("unsigned", lambda: evil, False),  # flwr run <dir>: no signature at all
        ("other-key", lambda: dep.publish(evil_fab, [impostor.sign(evil_fab.content)]), True),
        ("signature-of-another-fab", lambda: dep.publish(evil_fab, [genuine_of_other_fab]), True),
    ]
    for name, target, signed in refused:
        result, report, executed = run(target(), name, signed)
        assert result.status == "finished:failed", f"{name}: {result.status}\n{dep.tails()}"
        assert report["replies"] == {str(n): {"error": ErrorCode.INVALID_FAB} for n in node_ids}, name
        assert executed == {}, name
    assert {p.read_text() for p in marks.iterdir()} == {"published"}  # no node ever ran the server's code
