"""Figures for the results quoted from earlier sessions in docs/results.md.

The COVID CNN run (Walskaar et al. Tables 4/6) takes ~30 min of CPU on the
shared 2-core machine, so docs/results.md quotes the table an earlier session
measured (stop note 8). This script draws its figure from exactly those quoted
numbers; re-running the experiment with ``--docs`` replaces both the table and
this figure with new measurements. (The Shapley-on-BANK section is measured:
``experiments/shapley_bank.py --docs`` draws its figure.)

Usage: ``python docs/quoted_figures.py`` (writes docs/figures/covid-cnn.png).
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

FIGURES = Path(__file__).resolve().parent / "figures"

# experiments/covid_cnn.py --clients 2 3 5 --rounds 4 --local-epochs 2 (stop 8):
# clients -> mode -> (accuracy, F1, mean FL round wall s, mean FL round CPU s)
COVID = {
    2: {"local": (0.937, 0.818, None, None), "plain": (0.968, 0.923, 58.9, 30.3), "he": (0.929, 0.780, 50.0, 35.6)},
    3: {"local": (0.952, 0.864, None, None), "plain": (0.976, 0.936, 42.4, 41.9), "he": (0.976, 0.936, 41.6, 45.8)},
    5: {"local": (0.864, 0.452, None, None), "plain": (0.816, 0.080, 57.6, 62.8), "he": (0.808, 0.000, 72.1, 77.1)},
}


def covid() -> None:
    modes = {"local": ("Local", "#999999"), "plain": ("Plain FL", "#1f77b4"), "he": ("HE FL (xMK-CKKS)", "#d62728")}
    ns = sorted(COVID)
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.2))
    for ax, (k, title) in zip(axes, ((0, "accuracy (pooled test)"), (1, "F1, covid (pooled test)"),
                                     (3, "mean FL round CPU time (s)"))):
        for j, (mode, (label, color)) in enumerate(modes.items()):
            vals = [np.nan if COVID[n][mode][k] is None else COVID[n][mode][k] for n in ns]
            ax.bar(np.arange(len(ns)) + (j - 1) * 0.27, vals, 0.27, label=label, color=color)
        ax.set_xticks(np.arange(len(ns)), [str(n) for n in ns])
        ax.set_xlabel("clients")
        ax.set_title(title, fontsize=9)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    fig.savefig(FIGURES / "covid-cnn.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    FIGURES.mkdir(exist_ok=True)
    covid()
    print(f"wrote {FIGURES / 'covid-cnn.png'}")
