"""Every run-config key the library reads, in one place (``docs/configuration.md``).

A Flower App owns its run config (``[tool.flwr.app.config]`` in its
``pyproject.toml``): generic names such as ``min-nodes`` or ``dp-epsilon`` would collide
with the App's own keys. So every key the library's client handlers and strategies read
from the run config carries the ``fedeval-`` prefix, as the node-config keys do
(``fedeval-identity-key``, ``fedeval-share-auc``, ...). A run-config key of the same name
as a node-policy key means the same quantity and may only **tighten** the node's value
(:mod:`flwr_fedeval.clients.policy`): the data owner's policy lives on the node.

=============================  =======  ===========================================================
run-config key                 default  read by, meaning
=============================  =======  ===========================================================
``fedeval-identity-dir``       ""       the clients (simulation): ``node-<partition-id>.key`` and
                                        ``roster.json``; the ServerApp's roster too
``fedeval-roster``             ""       the ServerApp (deployment): its copy of the roster
``fedeval-min-clients``        2        the clients: raises their floor on the parties of a key set
                                        or evaluation (node ``fedeval-min-clients``)
``fedeval-dp-epsilon``         (none)   the clients: lowers the ε of one DP evaluation (node
                                        ``fedeval-dp-epsilon``; larger is refused)
``fedeval-dp-budget``          (none)   the clients: lowers the total ε of the run (node
                                        ``fedeval-dp-budget``; larger is refused)
``fedeval-share-auc``          true     the clients: ``false`` withholds the decrypted FHE AUC
                                        whatever node ``fedeval-share-auc`` says
``fedeval-xmk-mask-degree``    4        the clients: raises their floor on the xMK-CKKS mask-graph
                                        degree (0: complete graph), never below node
                                        ``fedeval-xmk-mask-degree``
=============================  =======  ===========================================================

Node-config keys the library reads besides the policy's (:mod:`flwr_fedeval.clients.policy`) and the
identity's (:mod:`flwr_fedeval.clients.identity`): ``fedeval-ledger`` (:data:`LEDGER`), the path of the
node's privacy ledger (:mod:`flwr_fedeval.clients.ledger`; default: beside the identity key). It is
never read from the run config: whoever starts a run must not be able to point a node at a fresh ledger.

An App declares (with ``""`` or its default) only the keys it lets its users set: Flower
refuses a ``--run-config`` key the App does not declare. The demo App
(:mod:`flwr_fedeval.app`) keeps its short names and maps them onto these
(:data:`flwr_fedeval.app.task.LIBRARY_RUN_CONFIG`). ``tests/protocol/test_config_keys.py`` checks that
code outside :mod:`flwr_fedeval.app` reads no run-config key without the prefix.
"""

from __future__ import annotations

__all__ = ["PREFIX", "RUN_CONFIG_KEYS", "IDENTITY_DIR", "ROSTER", "MIN_CLIENTS", "DP_EPSILON", "DP_BUDGET",
           "SHARE_AUC", "XMK_MASK_DEGREE", "LEDGER"]

#: The prefix of every config key the library reads (run config and node config).
PREFIX = "fedeval-"

IDENTITY_DIR = "fedeval-identity-dir"
ROSTER = "fedeval-roster"
MIN_CLIENTS = "fedeval-min-clients"
DP_EPSILON = "fedeval-dp-epsilon"
DP_BUDGET = "fedeval-dp-budget"
SHARE_AUC = "fedeval-share-auc"
XMK_MASK_DEGREE = "fedeval-xmk-mask-degree"
#: Node config only: the path of the node's privacy ledger (:mod:`flwr_fedeval.clients.ledger`).
LEDGER = "fedeval-ledger"

#: The run-config keys the library reads, in the module docstring's order.
RUN_CONFIG_KEYS: tuple[str, ...] = (IDENTITY_DIR, ROSTER, MIN_CLIENTS, DP_EPSILON, DP_BUDGET, SHARE_AUC,
                                    XMK_MASK_DEGREE)
