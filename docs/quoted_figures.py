"""Figures for the results quoted from earlier sessions in docs/results.md.

The COVID CNN (Walskaar et al. Tables 4/6) and Shapley-on-BANK runs take
~30 and ~15 min of CPU on the shared 2-core machine, so docs/results.md quotes
the tables an earlier session measured (stop notes 8 and 9). This script draws
their figures from exactly those quoted numbers; re-running the experiments
with ``--docs`` replaces both the tables and these figures with new
measurements.

Usage: ``python docs/quoted_figures.py`` (writes docs/figures/covid-cnn.png and
docs/figures/shapley-bank.png).
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
# experiments/shapley_bank.py --binary-margin --model-bound 4 --data-frac-bits 9 --skip-compare --full-all (stop 9)
SHAPLEY_TIME = {"HESV": (411.0, 410.7), "SecSV": (128.2, 127.9), "SecSV + SampleSkip": (119.9, 119.8)}  # wall, CPU s
SHAPLEY_FSV = {"plaintext": (-1.2567, -1.2906, 1.5370, 0.3006, 1.0869),
               "SecSV": (-1.2566, -1.2906, 1.5369, 0.3005, 1.0870)}


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


def shapley() -> None:
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    names = list(SHAPLEY_TIME)
    x = np.arange(len(names))
    ax1.bar(x - 0.2, [SHAPLEY_TIME[m][0] for m in names], 0.4, label="wall")
    ax1.bar(x + 0.2, [SHAPLEY_TIME[m][1] for m in names], 0.4, label="CPU")
    ax1.set_xticks(x, names, fontsize=8)
    ax1.set_ylabel("seconds (10 rounds, 9,044 test samples)", fontsize=8)
    ax1.set_title("BANK, 5 clients: time of the secure FSVs", fontsize=9)
    ax1.legend(fontsize=7)
    for j, (method, fsv) in enumerate(SHAPLEY_FSV.items()):
        ax2.bar(np.arange(5) + (j - 0.5) * 0.4, fsv, 0.4, label=method)
    ax2.axhline(0, color="k", lw=0.5)
    ax2.set_xticks(np.arange(5), [f"client {c}" for c in range(5)], fontsize=8)
    ax2.set_title("Federated Shapley values", fontsize=9)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIGURES / "shapley-bank.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    FIGURES.mkdir(exist_ok=True)
    covid()
    shapley()
    print(f"wrote {FIGURES / 'covid-cnn.png'} and {FIGURES / 'shapley-bank.png'}")
