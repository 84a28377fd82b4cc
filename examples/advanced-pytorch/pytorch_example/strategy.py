"""pytorch_example: a FedAvg with its own round loop (Flower's advanced-pytorch ``CustomFedAvg`` shape).

No flwr-fedeval here: this is the user's strategy as it is. Its ``start()`` runs Flower's round
loop itself and, after every round, saves the global model (``model_round_<r>.pt``), the best one
by the server's accuracy (``best_model.pt``) and the metrics so far (``rounds.json``);
``configure_train`` halves the learning rate from round ``lr-decay-round`` on. Flower's example
also logs to Weights & Biases; that is left out (the example runs offline).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from logging import INFO
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result


class CustomFedAvg(FedAvg):
    """FedAvg that writes a checkpoint and the metrics every round and decays the learning rate."""

    def __init__(self, save_path: Path, lr_decay_round: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.save_path = Path(save_path)
        self.lr_decay_round = lr_decay_round
        self.best_accuracy = -1.0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """FedAvg's, with ``lr`` halved once, at round ``lr_decay_round``."""
        if server_round == self.lr_decay_round:
            config["lr"] = float(config["lr"]) * 0.5
            log(INFO, "learning rate now %f", config["lr"])
        return super().configure_train(server_round, arrays, config, grid)

    def _save_round(self, server_round: int, arrays: ArrayRecord, result: Result) -> None:
        state = arrays.to_torch_state_dict()
        torch.save(state, self.save_path / f"model_round_{server_round}.pt")
        server_metrics = result.evaluate_metrics_serverapp.get(server_round)
        if server_metrics is not None and server_metrics["accuracy"] > self.best_accuracy:
            self.best_accuracy = float(server_metrics["accuracy"])
            torch.save(state, self.save_path / "best_model.pt")
        rounds = [
            {
                "round": r,
                "train_metrics": dict(result.train_metrics_clientapp.get(r, {})),
                "evaluate_metrics_clientapp": dict(result.evaluate_metrics_clientapp.get(r, {})),
                "evaluate_metrics_serverapp": dict(result.evaluate_metrics_serverapp.get(r, {})),
            }
            for r in range(1, server_round + 1)
        ]
        (self.save_path / "rounds.json").write_text(json.dumps(rounds, indent=2))

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's round loop (train, client-side evaluation, ``evaluate_fn``), saving after every round."""
        self.summary()
        self.save_path.mkdir(parents=True, exist_ok=True)
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result, arrays = Result(), initial_arrays
        t_start = time.time()
        if evaluate_fn is not None and (metrics := evaluate_fn(0, arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = metrics
        for server_round in range(1, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            replies = grid.send_and_receive(
                messages=self.configure_train(server_round, arrays, train_config, grid), timeout=timeout
            )
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                result.arrays = arrays = new_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[server_round] = train_metrics
            replies = grid.send_and_receive(
                messages=self.configure_evaluate(server_round, arrays, evaluate_config, grid), timeout=timeout
            )
            evaluate_metrics = self.aggregate_evaluate(server_round, replies)
            if evaluate_metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = evaluate_metrics
            if evaluate_fn is not None and (metrics := evaluate_fn(server_round, arrays)) is not None:
                result.evaluate_metrics_serverapp[server_round] = metrics
                log(INFO, "round %d: server accuracy %.4f", server_round, metrics["accuracy"])
            self._save_round(server_round, arrays, result)
        log(INFO, "strategy finished in %.2f s", time.time() - t_start)
        return result
