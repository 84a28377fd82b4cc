"""pytorch_example: a Flower ServerApp (Flower's advanced-pytorch shape).

The strategy is the user's own ``CustomFedAvg`` (its own ``start()`` writes a checkpoint and the
metrics every round); the lines marked ``# +`` are what flwr-fedeval adds: ``SecureAggregation``
around it (its loop, files and learning-rate schedule stay as they are; every update is aggregated
under xMK-CKKS), then the FHE AUC (malicious protocol) of the final model over every client's
private test split.
"""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

from flwr_fedeval.strategies import FHEAUCPhase, SecureAggregation  # +
from pytorch_example.strategy import CustomFedAvg
from pytorch_example.task import Net, load_centralized_data, test

app = ServerApp()


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """The global model on the server's own test set."""
    net = Net()
    net.load_state_dict(arrays.to_torch_state_dict())
    loss, accuracy = test(net, *load_centralized_data())
    return MetricRecord({"accuracy": accuracy, "loss": loss})


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    out = Path(str(cfg["output-dir"])).resolve()
    strategy = CustomFedAvg(
        save_path=out,
        lr_decay_round=int(cfg["lr-decay-round"]),
        fraction_train=float(cfg["fraction-train"]),
        fraction_evaluate=float(cfg["fraction-evaluate"]),
        min_train_nodes=int(cfg["min-nodes"]),
        min_evaluate_nodes=int(cfg["min-nodes"]),
        min_available_nodes=int(cfg["min-nodes"]),
    )
    strategy = SecureAggregation(strategy)  # + CustomFedAvg's own start() runs, with secure aggregation
    result = strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord(Net().state_dict()),
        train_config=ConfigRecord({"lr": float(cfg["lr"])}),
        num_rounds=int(cfg["num-server-rounds"]),
        evaluate_fn=global_evaluate,
    )
    torch.save(result.arrays.to_torch_state_dict(), out / "final_model.pt")

    fhe = FHEAUCPhase(protocol="malicious", share_auc_with_server=True).run(grid, result.arrays)  # +
    print(fhe)  # + the AUC with its resolution bound, or "not shared by policy" and how to change that
    summary = {"fhe_auc": fhe.auc, "fhe_resolution_bound": fhe.resolution_bound}  # +
    summary["fhe_contributors"] = len(fhe.contributors)  # +
    (out / "results.json").write_text(json.dumps(summary, indent=2))  # +
