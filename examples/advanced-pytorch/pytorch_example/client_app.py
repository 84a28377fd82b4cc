"""pytorch_example: a Flower ClientApp (Flower's advanced-pytorch shape).

The lines marked ``# +`` are what flwr-fedeval adds: xMK-CKKS secure aggregation of the training
replies (``xmkckks_mod`` and its handlers) and the handlers of the FHE AUC phase. Flower's example
also keeps each client's own classification head in ``context.state``; that is left out here, so
that every client trains and scores the one global model the server saves.
"""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval.clients import register_fhe_handlers, register_xmkckks_handlers, xmkckks_mod  # +

app = ClientApp()


def _data(context: Context):
    from pytorch_example.task import load_data

    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))


def _model(msg: Message):
    from pytorch_example.task import Net

    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    return net


@app.train(mods=[xmkckks_mod])  # + encrypts the reply; the handler is Flower's own
def train_fn(msg: Message, context: Context) -> Message:
    from pytorch_example.task import train

    net = _model(msg)
    x_train, y_train, _, _ = _data(context)
    loss = train(net, x_train, y_train, int(context.run_config["local-epochs"]), float(msg.content["config"]["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y_train)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


@app.evaluate()
def evaluate_fn(msg: Message, context: Context) -> Message:
    from pytorch_example.task import test

    _, _, x_test, y_test = _data(context)
    loss, accuracy = test(_model(msg), x_test, y_test)
    metrics = MetricRecord({"eval_loss": loss, "eval_acc": accuracy, "num-examples": len(y_test)})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def test_scores(msg: Message, context: Context):  # + labels and positive-class scores of the test split
    from pytorch_example.task import scores  # +

    _, _, x_test, y_test = _data(context)  # +
    return y_test, scores(_model(msg), x_test)  # +


register_xmkckks_handlers(app)  # +
register_fhe_handlers(app, test_scores=test_scores, test_labels=lambda context: _data(context)[3])  # +
