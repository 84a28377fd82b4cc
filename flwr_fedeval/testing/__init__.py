"""Test your own Flower App against real message serialization, without a SuperLink.

Flower's simulation engine passes ``Message`` objects between the ServerApp and
the ClientApps without serializing them; the deployment engine serializes
every message to protobuf. Record type and size errors (numpy scalars in a
``ConfigRecord``, object arrays, int64 overflow of unsigned 64-bit node IDs,
...) therefore show up only in deployment. :class:`InProcessGrid` is a Flower
``Grid`` that runs a ``ClientApp`` in the calling process, on any number of
nodes, and sends every instruction, every reply and every node's ``Context``
through Flower's protobuf serialization first. It needs no Ray and no
network, so a protocol test over it takes seconds.

Fault hooks let a test play a deviating or unreliable federation: a
:data:`Fault` sees every ``(node_id, instruction, reply)`` and returns the
reply (possibly altered) or ``None`` to drop it (the node times out).

Example
-------
A test of your own App (any ``ClientApp`` and any strategy of
``flwr.serverapp.strategy``)::

    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    from flwr_fedeval.testing import InProcessGrid
    from my_app.client_app import app as client_app   # your ClientApp
    from my_app.task import initial_weights           # your model's weights

    grid = InProcessGrid(client_app, num_nodes=3, run_config={"local-epochs": 1})
    result = FedAvg(fraction_evaluate=1.0).start(
        grid=grid,
        initial_arrays=ArrayRecord(initial_weights()),
        num_rounds=2,
        train_config=ConfigRecord({"lr": 0.01}),
    )
    assert all(ok for _, _, ok in grid.log)           # (node, message type, ok) per message
    print(grid.bytes_up)                              # serialized bytes received per node

Dropping one node's training replies (it looks timed out to the server)::

    victim = grid.node_ids[1]
    grid.fault = lambda node, msg, reply: (
        None if node == victim and msg.metadata.message_type == "train" else reply
    )

A SuperNode killed during a step (``kill -9``) and restarted 5 s later under a
new node ID; the old ID leaves the node list when its 60 s heartbeat expires
(simulated time: ``grid.clock()``, ``grid.sleep()``; no real waiting)::

    def fault(node, msg, reply):
        if node == victim and msg.metadata.message_type == "train":
            new_id = grid.restart(node, back_after=5.0, gone_after=60.0)  # the reply is lost with it
        return reply

    grid.fault = fault

Many nodes with big replies: :class:`LazyInProcessGrid` (same arguments, plus
``per_pull``) runs a node only when the server pulls its reply, ``per_pull`` per
pull, so it holds no reply (``InProcessGrid`` runs every node at push time and
holds every reply: 100 encrypted ResNet-18 updates would not fit in memory);
``grid.max_alive`` counts the reply contents alive at once
(``benchmarks/bench_xmk_100.py``)::

    grid = LazyInProcessGrid(client_app, num_nodes=100, run_config=run_config, per_pull=1)

Each node sees ``node_config = {"partition-id": i, "num-partitions": num_nodes}``
unless ``node_configs`` is given, and the same ``run_config``.

:mod:`flwr_fedeval.testing.scores` has synthetic data for AUC tests and
benchmarks (:func:`~flwr_fedeval.testing.scores.tiled_counts`: per-client
counts of one fixed score set at any size); :mod:`flwr_fedeval.testing.deployment`
runs a SuperLink and SuperNodes on 127.0.0.1.

Notes
-----
This module uses Flower internals that are not public API:
``flwr.common.serde`` (message/context protobuf conversion), ``flwr.proto``,
``flwr.supercore.run.Run`` and ``flwr.supercore.task_identity.TaskIdentity``
(the ServerApp's run identity, which it sets process-wide when a grid is
created). It is tested on both ends of the flwr range in ``pyproject.toml``;
a newer Flower may need a new release of this package.
"""

from flwr_fedeval.testing.grid import Fault, InProcessGrid
from flwr_fedeval.testing.identities import throwaway_identities
from flwr_fedeval.testing.lazy_grid import LazyInProcessGrid

__all__ = ["Fault", "InProcessGrid", "LazyInProcessGrid", "throwaway_identities"]
