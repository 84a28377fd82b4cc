"""Menon et al. (2015) debiasing of an AUC computed on randomized-response labels.

Server side, shared by DPAUC_RR and FedAUC_RR. With symmetric flip probability
``ρ+ = ρ- = ρ = 1/(1+e^ε)`` (FedAUC §4.3, Algorithm 3; Appendix P Eqs. 10-12):

* estimated clean totals ``P' = (P̄(1-ρ) - N̄ρ)/(1-2ρ)``, ``N' = P̄ + N̄ - P'``,
  base rate ``π' = P'/(P'+N')``;
* ``α = (1-π')ρ / (π'(1-ρ) + (1-π')ρ)``, ``β = π'ρ / (π'ρ + (1-π')(1-ρ))`` (Eq. 4);
* ``AUC_clean = (AUC_noisy - (α+β)/2) / (1 - α - β)`` (Eq. 3, Menon et al. 2015).

Algorithm 3 of the FedAUC paper writes ``π`` (the unknown true rate) in the
denominator of ``α``; we use the estimate ``π'`` throughout, as the authors'
code does.

The relation is exact for tie-aware (Mann-Whitney / trapezoid) AUCs whenever
each class is flipped in exact proportion ``ρ`` at every score level; with
random flips it holds in expectation.

References
----------
Menon, van Rooyen, Ong, Williamson. "Learning from Corrupted Binary Labels via
Class-Probability Estimation", ICML 2015.
Sun et al. "Differentially Private AUC Computation in Vertical Federated
Learning", §4.3 and Appendix P.
"""

from __future__ import annotations

from typing import NamedTuple

from flwr_fedeval.dp.mechanisms import flip_probability

__all__ = ["MenonDebias", "menon_debias"]


class MenonDebias(NamedTuple):
    """Debiased AUC and the quantities it was computed from."""

    auc: float | None  # None when undefined (then ``reason`` says why)
    rho: float
    p_est: float
    n_est: float
    pi_est: float
    alpha: float
    beta: float
    reason: str = ""


def menon_debias(noisy_auc: float, noisy_p: float, noisy_n: float, epsilon: float) -> MenonDebias:
    """Debias an AUC computed on ε-randomized-response labels (server step).

    Parameters
    ----------
    noisy_auc : float
        AUC computed with the flipped labels.
    noisy_p, noisy_n : float
        Numbers of positive / negative flipped labels, summed over clients.
    epsilon : float
        The RR budget (``> 0``; ``inf`` returns ``noisy_auc`` unchanged).

    Returns
    -------
    MenonDebias
        ``auc`` is None when the estimated clean base rate is not in (0, 1)
        (``P' <= 0`` or ``N' <= 0``): the debiasing is then undefined.
    """
    rho = flip_probability(epsilon)
    p_est = (noisy_p * (1.0 - rho) - noisy_n * rho) / (1.0 - 2.0 * rho)
    n_est = noisy_p + noisy_n - p_est
    if p_est <= 0 or n_est <= 0:
        return MenonDebias(
            None, rho, p_est, n_est, float("nan"), float("nan"), float("nan"),
            reason=f"estimated clean totals P'={p_est:.6g}, N'={n_est:.6g} are not both positive",
        )
    pi = p_est / (p_est + n_est)
    alpha = (1.0 - pi) * rho / (pi * (1.0 - rho) + (1.0 - pi) * rho)
    beta = pi * rho / (pi * rho + (1.0 - pi) * (1.0 - rho))
    auc = (noisy_auc - (alpha + beta) / 2.0) / (1.0 - alpha - beta)
    return MenonDebias(auc, rho, p_est, n_est, pi, alpha, beta)
