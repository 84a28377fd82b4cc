"""The main job with a SuperNode restarted mid-round (issue 16.3), over the serializing grid with simulated time."""

import json

import pytest
from flwr.app import Context, RecordDict
from identities import IDENTITY_DIR

from flwr_fedeval.app import server_app
from flwr_fedeval.app.client_app import app as client_app
from flwr_fedeval.protocol import ReplyCode
from flwr_fedeval.strategies.collect import POLL_INTERVAL
from flwr_fedeval.testing import InProcessGrid


@pytest.mark.slow
def test_restarted_node_is_left_out_of_the_round_and_rejoins_the_fhe_phase(tmp_path):
    """xmkckks + FHE AUC, 3 nodes: the partition-1 node is killed during round-1 training and restarted
    5 s later under a new node ID. It proves its roster identity, the old ID is given up at once (not at
    the 60 s heartbeat or the 600 s step-timeout) and left out of the round's signed contributor set (issue 21:
    no retry, so the round has two contributors), the FHE phase has all three, and the FINAL reference pools
    all three partitions."""
    run_config = {"num-server-rounds": 1, "local-epochs": 1, "model": "logreg", "output-dir": str(tmp_path),
                  "secure-aggregation": "xmkckks", "auc-method": "fhe", "fhe-auc": "semi-honest",
                  "num-decision-points": 2000, "decision-point-spacing": "logit", "identity-dir": IDENTITY_DIR,
                  "min-nodes": 2, "step-timeout": 600}
    new = {}

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == "train" and not new:
            new["id"] = grid.restart(node, back_after=5.0, gone_after=60.0)
        return reply

    grid = InProcessGrid(client_app, 3, run_config, fault=fault)
    victim = grid.node_ids[1]
    server_app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config))
    assert grid.now < 60  # simulated seconds: the old ID's heartbeat never had to expire

    (folder,) = list(tmp_path.iterdir())
    result = json.loads((folder / "results.json").read_text())
    (f,) = result["failures"]
    assert (f["node"], f["round"], f["step"], f["code_name"]) == (victim, 1, "train", "NODE_REJOINED")
    assert f["code"] == int(ReplyCode.NODE_REJOINED) and 5.0 <= f["seconds_to_detect"] <= 5.0 + POLL_INTERVAL
    assert f"back as node {new['id']}" in f["reason"] and "node-1" in f["reason"]
    assert result["train_metrics"]["1"]["num-clients"] == 2  # lost before its upload: left out, no retry
    assert result["num_clients"] == 3 and str(new["id"]) not in result["failed_nodes"]
    assert result["reference_roc_auc_score"] is not None  # the restarted node's partition is known
    assert abs(result["federated_auc"] - result["reference_roc_auc_score"]) <= result["resolution_bound"]


def test_without_a_roster_a_restarted_node_is_known_by_its_partition_id():
    """No roster yet (plain FedAvg, no identity-dir): the Rejoin of the main job knows nodes by the
    partition id they report; the new ID of partition 2 replaces the old one within a poll interval."""
    from flwr.app import ConfigRecord, Message

    from flwr_fedeval.app.server_app import make_rejoin
    from flwr_fedeval.app.task import JobConfig
    from flwr_fedeval.protocol import secsv
    from flwr_fedeval.strategies.base import FailureRecordingGrid
    from flwr_fedeval.strategies.shapley_phase import discover_roles

    new = {}

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == secsv.ROLE_QUERY.message_type and not new:
            new["id"] = grid.restart(node, back_after=3.0, gone_after=60.0)
        return reply

    grid = InProcessGrid(client_app, 3)
    victim = grid.node_ids[2]
    rec, partitions = FailureRecordingGrid(grid), {}
    discover_roles(rec, strict=False, partitions=partitions)
    rec.rejoin = make_rejoin(JobConfig(), None, partitions, {})
    assert rec.rejoin.identities[victim] == "partition 2 of 3"
    grid.fault = fault
    msgs = [Message(RecordDict({secsv.ROLE_KEY: ConfigRecord({})}), dst_node_id=n,
                    message_type=secsv.ROLE_QUERY.message_type)
            for n in rec.get_node_ids()]
    got = rec.collect_replies(msgs, timeout=600)
    assert got.replaced == {victim: new["id"]} and 3.0 <= got.seconds[victim] <= 3.0 + POLL_INTERVAL
    assert partitions[new["id"]] == (2, 3) and sorted(rec.get_node_ids()) == sorted([*grid.node_ids[:2], new["id"]])
    assert [f.code for f in rec.failures] == [ReplyCode.NODE_REJOINED]
