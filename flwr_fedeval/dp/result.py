"""The value a DP AUC server step returns, and the undefined case.

A server step never raises on noisy input and never returns a silent NaN: when
the AUC is undefined (e.g. no positive sample in the pooled data, or a noisy
count estimate that is not positive) it returns ``AUCEstimate(auc=nan,
defined=False, reason=...)`` **and** emits :class:`UndefinedAUCWarning`, like
:func:`sklearn.metrics.roc_auc_score` does for single-class data.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AUCEstimate", "UndefinedAUCWarning", "undefined_estimate"]

logger = logging.getLogger(__name__)


class UndefinedAUCWarning(RuntimeWarning):
    """The (noisy) AUC is undefined for this run; the estimate is NaN."""


@dataclass(frozen=True)
class AUCEstimate:
    """Result of a DP AUC server step.

    Attributes
    ----------
    auc : float
        The AUC estimate; ``nan`` iff ``defined`` is False. Not clipped to
        ``[0, 1]`` unless the variant says so (noisy estimates can leave it).
    method : str
        ``"dpauc-laplace"``, ``"dpauc-rr"``, ``"fedauc-rr"`` or ``"fedauc-laplace"``.
    variant : str
        Which option produced the number, e.g. ``"clip-sort"`` / ``"no-clip"``
        for DPAUC_Lap, ``"local-alpha"``, ``"global-alpha"``,
        ``"local-orthogonal"``, ``"local-adaptive"`` for FedAUC_Lap,
        ``"debiased"`` for the RR methods.
    epsilon : float
        Per-client total privacy budget of the run (``inf`` = noise disabled).
    defined : bool
        False when the estimate is undefined (see ``reason``).
    reason : str
        Why the estimate is undefined; empty otherwise.
    details : dict
        Intermediate public values (e.g. ``noisy_auc`` before debiasing,
        estimated totals), for experiments and logging.
    """

    auc: float
    method: str
    variant: str
    epsilon: float
    defined: bool = True
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __float__(self) -> float:
        return float(self.auc)


def undefined_estimate(method: str, variant: str, epsilon: float, reason: str, **details: Any) -> AUCEstimate:
    """Build the NaN estimate for an undefined AUC and warn (never silent)."""
    message = f"{method} ({variant}): AUC undefined, returning nan: {reason}"
    warnings.warn(message, UndefinedAUCWarning, stacklevel=3)
    logger.warning(message)
    return AUCEstimate(
        auc=math.nan, method=method, variant=variant, epsilon=epsilon, defined=False, reason=reason, details=details
    )
