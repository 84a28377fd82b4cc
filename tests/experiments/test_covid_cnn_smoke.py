"""Smoke test of experiments/covid_cnn.py: every mode end to end on a tiny synthetic image folder.

The experiment itself (the paper's Tables 4/6, 4 client counts × 3 seeds)
takes hours on real chest X-rays; this runs its command line with 2 clients,
1 seed, 1 round, 1 epoch and 48×48 images (a few seconds of training per run)
and checks that every mode completes and the tables, the figure and the docs
section are written; then ``--aggregate-only`` with a second seed that was
never run, which must be listed as missing (never filled in).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _image_folder(root: Path, per_class: int = 12) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls, brightness in (("normal", 60), ("covid", 170)):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(rng.normal(brightness, 40, size=(40, 40)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels, mode="L").save(root / cls / f"{cls}{i}.png")
    return root


@pytest.mark.slow
def test_covid_cnn_smoke_runs_every_mode_and_publishes(tmp_path):
    data = _image_folder(tmp_path / "xray")
    out, docs = tmp_path / "out", tmp_path / "docs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, str(REPO / "experiments" / "covid_cnn.py"), "--clients", "2", "--seeds", "0",
           "--rounds", "1", "--local-epochs", "1", "--image-size", "48", "--batch-size", "8", "--data-dir", str(data),
           "--out", str(out), "--docs", str(docs)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    logs = "".join(p.read_text() for p in sorted((out / "covid_cnn_runs").glob("*.log")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs[-3000:]

    summary = json.loads((out / "covid_cnn.json").read_text())
    assert [(r["mode"], r["clients"]) for r in summary["rows"]] == [("local", 2), ("plain", 2), ("he", 2)]
    he = summary["runs"]["he-n2-s0"]
    assert he["rounds_completed"] == [1] and he["aborted_attempts"] == []
    steps = he["rounds"][0]["server_steps_s"]  # from XMKFedAvg.timer, client calls removed
    # issue 21: the signed contributor set (step 2b) sits between the sum and the threshold decryption
    assert list(steps) == ["step 1 (key generation)", "step 2 (sum of the encrypted updates)",
                           "step 2b (contributor set)", "step 3 (partial decryption)", "step 4 (decoding)"]
    assert all(seconds >= 0 for seconds in steps.values())
    assert he["bytes_up"] > summary["runs"]["plain-n2-s0"]["bytes_up"]  # ciphertexts are larger than weights
    # plain and HE train identical round-1 client models; their global models differ only by rounding
    assert summary["determinism"]["2-s0"]["round1_he_vs_exact64"] < 1e-5
    for row in summary["rows"]:  # (mean, std) over seeds; one seed: no std
        assert row["seeds"] == [0] and row["pooled_accuracy"][1] is None
        assert 0.0 <= row["pooled_accuracy"][0] <= 1.0 and row["process_peak_rss_mb"][0] > 0
        assert 0.0 <= row["pooled_auc"][0] <= 1.0 and 0.5 <= row["majority_rate"][0] <= 1.0
        assert row["server_py_mb"][0] is not None and row["client_py_mb"][0] > 0
    text = (docs / "results.md").read_text()
    assert "<!-- begin generated: covid-cnn -->" in text and "| 2 | HE FL (xMK-CKKS) |" in text
    assert (docs / "figures" / "covid-cnn.png").stat().st_size > 1000

    # seed 1 was never run: --aggregate-only reports it missing and keeps seed 0's numbers as they are
    proc = subprocess.run([*cmd, "--seeds", "0", "1", "--aggregate-only"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    again = json.loads((out / "covid_cnn.json").read_text())
    assert again["coverage"] == [[2, label, "0", "1"] for label in ("Local", "Plain FL", "HE FL (xMK-CKKS)")]
    assert again["rows"] == summary["rows"]
    assert not list((out / "covid_cnn_runs").glob("*-s1*"))
    assert "still miss seeds" in (docs / "results.md").read_text()

    # other settings into the same --out: refused before any run, the measured runs stay as they are
    before = {p.name: p.read_bytes() for p in (out / "covid_cnn_runs").glob("*.json")}
    proc = subprocess.run([*cmd, "--rounds", "2"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert {p.name: p.read_bytes() for p in (out / "covid_cnn_runs").glob("*.json")} == before
