"""The server folds each reply into a running sum as it arrives (issue 21 item 3: fold, don't hold)."""

import gc

import numpy as np
from flwr.app import Message, RecordDict
from xmk_app import RUN_CONFIG, flat, initial, make_app, plain_fedavg, run

from flwr_fedeval import rlwe
from flwr_fedeval.protocol import xmk
from flwr_fedeval.rlwe import compact
from flwr_fedeval.secagg.server import RunningSum
from flwr_fedeval.strategies.collect import send_and_collect
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid


def test_on_reply_sees_every_reply_once_and_the_result_keeps_what_it_returns():
    grid = InProcessGrid(make_app(), 3, RUN_CONFIG)
    msgs = [Message(RecordDict(), dst_node_id=n, message_type=xmk.KEYGEN.message_type) for n in grid.node_ids]
    seen = []

    def on_reply(reply):
        seen.append(reply.metadata.reply_to_message_id)
        return Message(RecordDict(), reply_to=next(m for m in msgs if m.metadata.message_id == seen[-1]))

    got = send_and_collect(grid, msgs, timeout=10, on_reply=on_reply)
    assert sorted(seen) == sorted(m.metadata.message_id for m in msgs)
    assert all(not r.has_error() and len(r.content) == 0 for r in got.replies)  # the stripped replies are kept


def test_start_folds_every_ciphertext_before_aggregate_train_and_gets_the_exact_mean():
    """Flower's loop hands aggregate_train the replies without their ciphertexts: each was added into the
    running sum as it arrived, straight from the message's bytes (a view, not a copy), and no parsed
    ciphertext was alive besides the sum."""
    seen, alive, kinds = [], [], []
    add = RunningSum.add

    def counting_add(self, node, data, extra=None):
        gc.collect()  # what earlier tests left in reference cycles is not this round's
        alive.append(sum(isinstance(o, (rlwe.Ciphertext, compact.CompactCiphertext)) for o in gc.get_objects()))
        kinds.append(type(data))
        return add(self, node, data, extra)

    class Spy(XMKFedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen.extend(replies)
            return super().aggregate_train(server_round, replies)

    RunningSum.add = counting_add
    try:
        grid = InProcessGrid(make_app(), 4, RUN_CONFIG)
        result = run(grid, Spy(fraction_evaluate=0.0, min_train_nodes=2, min_available_nodes=4, max_abs_value=1e4,
                               bulk="ckks"))
    finally:
        RunningSum.add = add
    assert len(seen) == 4 and all(xmk.XMK_CIPHERTEXT_KEY not in r.content for r in seen)
    assert alive == [0, 0, 0, 0]  # folded from the wire bytes: no reply was parsed whole, none kept
    assert kinds == [memoryview] * 4  # a view into the message's buffer, not a copy of it
    got = flat(result.arrays.to_numpy_ndarrays())
    assert np.max(np.abs(got - plain_fedavg(initial(), range(4), 1))) <= 1e-6
