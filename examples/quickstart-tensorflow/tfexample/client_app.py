"""tfexample: a Flower ClientApp (Flower's quickstart-tensorflow shape).

The lines marked ``# +`` are what flwr-fedeval adds: xMK-CKKS secure aggregation of the
training replies (``xmkckks_mod``), and the handlers of the FHE AUC and DP AUC evaluation phases.
``tfexample.task`` (scikit-learn) and Keras are imported inside the functions that need the data or
the model: on the deployment engine every message is a fresh process, and the secure-aggregation
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
    from tfexample.task import load_data

    return load_data(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))


@app.train(mods=[xmkckks_mod])  # + encrypts the reply; the handler is Flower's own
def train(msg: Message, context: Context) -> Message:
    """Train the model on local data."""
    import keras

    from tfexample.task import load_model

    keras.backend.clear_session()  # reset local TensorFlow state
    x_train, y_train, _, _ = _data(context)
    model = load_model(float(context.run_config["learning-rate"]))
    model.set_weights(msg.content["arrays"].to_numpy_ndarrays())
    history = model.fit(x_train, y_train, epochs=int(context.run_config["local-epochs"]),
                        batch_size=int(context.run_config["batch-size"]),
                        verbose=bool(context.run_config.get("verbose", False)))
    metrics = MetricRecord({"train_loss": float(history.history["loss"][-1]),
                            "train_acc": float(history.history["accuracy"][-1]), "num-examples": len(x_train)})
    return Message(RecordDict({"arrays": ArrayRecord(model.get_weights()), "metrics": metrics}), reply_to=msg)


def test_scores(msg: Message, context: Context):  # + labels and positive-class scores of the test split
    from tfexample.task import load_model, scores  # +

    model = load_model()  # +
    model.set_weights(msg.content["arrays"].to_numpy_ndarrays())  # +
    _, _, x_test, y_test = _data(context)  # +
    return y_test, scores(model, x_test)  # +


def test_labels(context: Context):  # +
    return _data(context)[3]  # +


register_xmkckks_handlers(app)  # +
register_fhe_handlers(app, test_scores=test_scores, test_labels=test_labels)  # +
register_dp_handlers(app, test_scores=test_scores, test_labels=test_labels)  # +
