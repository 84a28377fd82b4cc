"""pytorchexample: a Flower ClientApp (Flower's quickstart-pytorch shape).

The lines marked ``# +`` are what flwr-fedeval adds: xMK-CKKS secure aggregation of the
training replies (``xmkckks_mod``), and the handlers of the FHE AUC and DP AUC evaluation phases.
``pytorchexample.task`` (PyTorch, scikit-learn) is imported inside the functions that need the data
or the model: on the deployment engine every message is a fresh process, and the secure-aggregation
and AUC steps that carry no model need neither.
"""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval.clients import (  # +
    register_dp_handlers,  # +
    register_fhe_handlers,  # +
    register_xmkckks_handlers,  # +
    xmkckks_mod,  # +
)  # +

app = ClientApp()


def _data(context: Context):
    from pytorchexample.task import load_data

    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))


@app.train(mods=[xmkckks_mod])  # + encrypts the reply; the handler is Flower's own
def train_fn(msg: Message, context: Context) -> Message:
    from pytorchexample.task import Net, train

    net = Net()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x_train, y_train, _, _ = _data(context)
    loss = train(net, x_train, y_train, int(context.run_config["local-epochs"]), float(context.run_config["lr"]))
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y_train)})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


def test_scores(msg: Message, context: Context):  # + labels and positive-class scores of the test split
    from pytorchexample.task import Net, scores  # +

    net = Net()  # +
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())  # +
    _, _, x_test, y_test = _data(context)  # +
    return y_test, scores(net, x_test)  # +


def test_labels(context: Context):  # +
    return _data(context)[3]  # +


register_xmkckks_handlers(app)  # +
register_fhe_handlers(app, test_scores=test_scores, test_labels=test_labels)  # +
register_dp_handlers(app, test_scores=test_scores, test_labels=test_labels)  # +
