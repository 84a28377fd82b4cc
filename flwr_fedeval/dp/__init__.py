"""Differential-privacy AUC baselines (no flwr, no TensorFlow imports).

Each protocol step is a plain function: client steps take exact counts, scores,
ranks or labels and return the values the client sends; server steps take the
clients' values and return an :class:`AUCEstimate`.

============================  ======  ==============================================
step                          side    function
============================  ======  ==============================================
DPAUC_Lap noise               client  :func:`dpauc_laplace_client`
DPAUC_Lap aggregate + AUC     server  :func:`dpauc_laplace_server`
RR label flip (once)          client  :func:`randomize_labels`
DPAUC_RR AUC + debias         server  :func:`dpauc_rr_server`
FedAUC shuffle scores         client  :func:`fedauc_shuffle_scores`
FedAUC global ranks           server  :func:`fedauc_server_ranks`
FedAUC unshuffle ranks        client  :func:`fedauc_unshuffle_ranks`
FedAUC local stats (plain/RR) client  :func:`fedauc_local_stats`
FedAUC_Lap noisy stats        client  :func:`fedauc_laplace_client`
FedAUC AUC (plain/Laplace)    server  :func:`fedauc_server_auc`
FedAUC_RR AUC + debias        server  :func:`fedauc_rr_server`
============================  ======  ==============================================
"""

from flwr_fedeval.dp.budget import BudgetError, charge, client_random_state
from flwr_fedeval.dp.debias import menon_debias
from flwr_fedeval.dp.dpauc import (
    DPAUCLaplaceParams,
    NoisyCounts,
    RandomizedResponseParams,
    dpauc_laplace_client,
    dpauc_laplace_server,
    dpauc_rr_server,
    randomize_labels,
)
from flwr_fedeval.dp.fedauc import (
    FedAUCLaplaceParams,
    LocalStats,
    adaptive_beta,
    fedauc_laplace_client,
    fedauc_local_stats,
    fedauc_rr_server,
    fedauc_server_auc,
    fedauc_server_ranks,
    fedauc_shuffle_scores,
    fedauc_unshuffle_ranks,
)
from flwr_fedeval.dp.result import AUCEstimate, UndefinedAUCWarning

__all__ = [
    "AUCEstimate",
    "BudgetError",
    "DPAUCLaplaceParams",
    "FedAUCLaplaceParams",
    "LocalStats",
    "NoisyCounts",
    "RandomizedResponseParams",
    "UndefinedAUCWarning",
    "adaptive_beta",
    "charge",
    "client_random_state",
    "dpauc_laplace_client",
    "dpauc_laplace_server",
    "dpauc_rr_server",
    "fedauc_laplace_client",
    "fedauc_local_stats",
    "fedauc_rr_server",
    "fedauc_server_auc",
    "fedauc_server_ranks",
    "fedauc_shuffle_scores",
    "fedauc_unshuffle_ranks",
    "menon_debias",
    "randomize_labels",
]
