"""Flower glue: which key and roster a node loads (flwr_fedeval.clients.identity)."""

from __future__ import annotations

import os

import pytest
from flwr.app import Context, RecordDict

from flwr_fedeval.clients.identity import node_identity, server_roster
from flwr_fedeval.identity import IdentityError
from flwr_fedeval.keys import create


def _ctx(node_config, run_config):
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config=run_config)


def test_simulation_and_deployment_configs(tmp_path):
    create(tmp_path, [f"node-{i}" for i in range(3)])
    ident, roster = node_identity(_ctx({"partition-id": 2}, {"fedeval-identity-dir": str(tmp_path)}))
    assert ident.name == "node-2" and roster.names == ("node-0", "node-1", "node-2")
    ident, _ = node_identity(_ctx({"fedeval-identity-key": str(tmp_path / "node-1.key"),
                                   "fedeval-roster": str(tmp_path / "roster.json")}, {}))
    assert ident.name == "node-1"
    assert server_roster({"fedeval-identity-dir": str(tmp_path)}).names == roster.names
    assert server_roster({}) is None


def test_missing_identity_names_the_config_keys(tmp_path):
    for node, run in (({"partition-id": 0}, {}), ({"partition-id": 0}, {"fedeval-identity-dir": ""}),
                      ({"fedeval-identity-key": "x.key"}, {})):
        with pytest.raises(IdentityError) as err:
            node_identity(_ctx(node, run))
        assert "fedeval-identity-key" in str(err.value) and "fedeval-identity-dir" in str(err.value)
    with pytest.raises(IdentityError, match="does not exist"):
        node_identity(_ctx({"partition-id": 5}, {"fedeval-identity-dir": str(tmp_path)}))


def test_key_not_in_roster_refused(tmp_path):
    create(tmp_path / "a", ["node-0", "node-1"])
    create(tmp_path / "b", ["node-0"])
    os.replace(tmp_path / "b" / "node-0.key", tmp_path / "a" / "node-0.key")   # a key the roster does not list
    with pytest.raises(IdentityError, match="another public key"):
        node_identity(_ctx({"partition-id": 0}, {"fedeval-identity-dir": str(tmp_path / "a")}))
