"""Test helpers: each node's own test scores, and the plaintext counts-AUC of a set of nodes."""

from flwr.app import Message, RecordDict

from flwr_fedeval.app.client_app import local_test_scores
from flwr_fedeval.metrics.auc import auc_from_counts
from flwr_fedeval.metrics.counts import threshold_counts


def client_scores(grid, arrays) -> dict:
    """``{node: (labels, scores)}`` of every node of an ``InProcessGrid``, exactly as its handlers compute them."""
    out = {}
    for node in sorted(grid.node_ids):
        msg = Message(RecordDict({"arrays": arrays}), dst_node_id=node, message_type="evaluate")
        out[node] = local_test_scores(msg, grid.contexts[node])
    return out


def plain_auc_of(scores: dict, nodes, thresholds) -> float:
    """The plaintext counts-AUC at ``thresholds`` of the pooled test data of ``nodes``."""
    return auc_from_counts(sum(threshold_counts(*scores[n], thresholds) for n in nodes))
