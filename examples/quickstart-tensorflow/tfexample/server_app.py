"""tfexample: a Flower ServerApp (Flower's quickstart-tensorflow shape).

The lines marked ``# +`` are what flwr-fedeval adds: ``XMKFedAvg`` in place of ``FedAvg``
(xMK-CKKS secure aggregation, same parameters), then two evaluation phases of the final
model on every client's private test split: the FHE AUC (malicious protocol) and DPAUC_Lap.
"""

import json
from pathlib import Path

from flwr.app import ArrayRecord, Context
from flwr.serverapp import Grid, ServerApp

from flwr_fedeval.strategies import DPAUCLaplacePhase, FHEAUCPhase, XMKFedAvg  # +
from tfexample.task import load_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""
    cfg = context.run_config
    model = load_model()
    strategy = XMKFedAvg(fraction_train=float(cfg["fraction-train"]), fraction_evaluate=0.0,  # + was FedAvg
                         min_train_nodes=int(cfg["min-nodes"]), min_available_nodes=int(cfg["min-nodes"]))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.get_weights()),
                            num_rounds=int(cfg["num-server-rounds"]))
    out = Path(str(cfg["output-dir"])).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model.set_weights(result.arrays.to_numpy_ndarrays())
    model.save(out / "final_model.keras")

    fhe = FHEAUCPhase(protocol="malicious", share_auc_with_server=True).run(grid, result.arrays)  # +
    dp = DPAUCLaplacePhase(epsilon=float(cfg["dp-epsilon"])).run(grid, result.arrays)  # +
    print(f"FHE AUC {fhe.auc:.6f} (resolution bound {fhe.resolution_bound:.6f}), "
          f"DPAUC_Lap AUC {dp.auc:.6f} ({dp.label})")
    (out / "results.json").write_text(json.dumps({
        "fhe_auc": fhe.auc, "fhe_resolution_bound": fhe.resolution_bound, "fhe_contributors": len(fhe.contributors),
        "dp_auc": dp.auc, "dp_label": dp.label}, indent=2))
