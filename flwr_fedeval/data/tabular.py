"""The embedded default data set: scikit-learn's bundled breast-cancer data.

Real data (Wisconsin Diagnostic Breast Cancer, 569 samples, 30 features),
shipped inside scikit-learn, so the main job runs offline and without
``../shared/data``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["load_breast_cancer_data"]


def load_breast_cancer_data() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Load the breast-cancer data with *malignant* as the positive class.

    scikit-learn labels malignant 0 and benign 1; here the label is
    ``1 = malignant`` (the class a screening model should flag).

    Features are standardised with the mean and standard deviation of the
    public data set (it is public, so these statistics leak nothing private).

    Returns
    -------
    x : ndarray of shape (569, 30), dtype float32
    y : ndarray of shape (569,), dtype int64
        212 positives (malignant), 357 negatives.
    class_names : list of str
        ``["benign", "malignant"]`` (index = label).
    """
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = data.data.astype(np.float64)
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    y = (data.target == 0).astype(np.int64)
    return x.astype(np.float32), y, ["benign", "malignant"]
