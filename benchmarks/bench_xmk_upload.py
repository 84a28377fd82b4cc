"""Upload per client per xMK-CKKS round through the real Flower messages: compact (L' limbs) vs uncompressed.

One :class:`~flwr_fedeval.strategies.xmk_fedavg.XMKFedAvg` round over the serializing grid
(:class:`~flwr_fedeval.testing.InProcessGrid`, every message through Flower's protobuf serialization)
with the real client handlers and roster identities, once with the fewest limbs the noise budget allows
(the default) and once with ``limbs = L`` (the uncompressed form). Per client: the bytes of its
ciphertext (``xmk-ciphertext``: the KAHE ciphertext in the default KAHE mode, ``--bulk ckks`` the
xMK-CKKS one), its key capsule (``xmk-capsule``, KAHE mode) and its decryption share (``xmk-share``) as
received by the server, and
every serialized reply of the round; divided by 4 bytes per float32 weight. Also the max error of the
decrypted weighted mean against plaintext FedAvg and its worst-case bound. Each parameter set of
``--parameter-sets`` (default: the default set, ``xmk-n4096-q109-l5``, ``xmk-n4096-q108``) is run compact,
side by side in one process; the uncompressed form only for the first (``--no-uncompressed`` skips it).

    python benchmarks/bench_xmk_upload.py [--params 949002] [--clients 5 10] [--bulk kahe]
        [--parameter-sets xmk-n4096-q109 xmk-n4096-q109-l5 xmk-n4096-q108] [--no-uncompressed]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from flwr_fedeval import rlwe
from flwr_fedeval.clients.xmkckks import register_xmkckks_handlers, xmkckks_mod
from flwr_fedeval.protocol import xmk
from flwr_fedeval.rlwe import compact
from flwr_fedeval.strategies.xmk_fedavg import XMKFedAvg
from flwr_fedeval.testing import InProcessGrid, throwaway_identities

ROOT = Path(__file__).resolve().parent.parent


def _shapes(num_params: int) -> list[tuple[int, ...]]:
    big = num_params // 4
    return [(big,), (big,), (big,), (num_params - 3 * big,)]


def _update(pid: int, shapes) -> list[np.ndarray]:
    rng = np.random.default_rng(1000 + pid)  # test data, not key material
    return [rng.uniform(-1e-2, 1e-2, s).astype(np.float32) for s in shapes]


def _app(shapes) -> ClientApp:
    app = ClientApp()
    register_xmkckks_handlers(app)

    @app.train(mods=[xmkckks_mod])
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        w = msg.content["arrays"].to_numpy_ndarrays()
        new = [a + d for a, d in zip(w, _update(pid, shapes))]
        metrics = MetricRecord({"num-examples": 10 + pid})
        return Message(RecordDict({"arrays": ArrayRecord(new), "metrics": metrics}), reply_to=msg)

    return app


def _round(num_params: int, clients: int, limbs: int | None, parameter_set: str, bulk: str = "kahe") -> dict:
    shapes = _shapes(num_params)
    sizes: dict[int, dict[str, int]] = {}

    def spy(node, delivered, reply):
        if not reply.has_error():
            for key, field in (
                (xmk.XMK_CIPHERTEXT_KEY, "ciphertext"),
                (xmk.XMK_CAPSULE_KEY, "capsule"),
                (xmk.XMK_SHARE_KEY, "share"),
            ):
                if key in reply.content:
                    sizes.setdefault(node, {})[field] = int(reply.content[key][field].numpy().nbytes)
        return reply

    grid = InProcessGrid(_app(shapes), clients, {"fedeval-identity-dir": throwaway_identities(clients)})
    grid.fault = spy
    strategy = XMKFedAvg(
        fraction_evaluate=0.0,
        min_train_nodes=clients,
        min_available_nodes=clients,
        max_abs_value=2.0**16,
        limbs=limbs,
        parameter_set=parameter_set,
        bulk=bulk,
    )
    w0 = [np.zeros(s, dtype=np.float32) for s in shapes]
    t0 = time.perf_counter()
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(w0), num_rounds=1, train_config=ConfigRecord({}), timeout=3600
    )
    seconds = time.perf_counter() - t0
    got = np.concatenate([a.ravel() for a in result.arrays.to_numpy_ndarrays()]).astype(np.float64)
    n = np.array([10 + p for p in range(clients)], dtype=np.float64)
    ups = [np.concatenate([u.ravel() for u in _update(p, shapes)]).astype(np.float64) for p in range(clients)]
    expected = np.sum([ni * u for ni, u in zip(n, ups)], axis=0) / n.sum()
    scale_bits = strategy.protocol.scale_bits_for(clients)
    key_limbs = strategy.protocol.limbs_for(clients, scale_bits)
    # worst-case error of the decoded sum (rlwe.compact, condition 6); of the weighted mean: over sum n_i,
    # plus half an ulp of the float32 the new weights are stored in
    bound_sum = (
        compact.compact_noise_bound(strategy.params, key_limbs, num_clients=clients) + clients / 2
    ) / 2.0**scale_bits
    kahe_params = strategy.protocol.kahe_for(clients)
    if kahe_params is not None:  # KAHE mode: exact decoding, the quantisation of M values only
        bound_sum = clients * 2.0 ** -(kahe_params.fractional_bits + 1)
    per_client = [s["ciphertext"] + s.get("capsule", 0) + s.get("share", 0) for s in sizes.values()]
    return {
        "bulk": bulk,
        "kahe_primes": list(kahe_params.primes) if kahe_params is not None else None,
        "capsule_bytes": sorted({s["capsule"] for s in sizes.values() if "capsule" in s}),
        "limbs": key_limbs,
        "parameter_set": strategy.params.name,
        "params": num_params,
        "clients": clients,
        "ciphertext_bytes": sorted({s["ciphertext"] for s in sizes.values()}),
        "share_bytes": sorted({s["share"] for s in sizes.values() if "share" in s}),
        "upload_bytes_per_client_max": max(per_client),
        "upload_per_float32": max(per_client) / (4 * num_params),
        "all_replies_bytes_per_client_max": max(grid.bytes_up.values()),
        "all_replies_per_float32": max(grid.bytes_up.values()) / (4 * num_params),
        "max_error_of_mean": float(np.max(np.abs(got - expected))),
        "scale_bits": scale_bits,
        "error_bound_of_sum": bound_sum,
        "error_bound_of_mean": bound_sum / n.sum() + float(np.max(np.abs(expected))) * 2.0**-24,
        "bits_per_coefficient": sum(p.bit_length() for p in strategy.params.primes)
        + 2 * sum(p.bit_length() for p in strategy.params.primes[:key_limbs]),
        "round_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", type=int, default=949_002)
    ap.add_argument("--clients", type=int, nargs="+", default=[5])
    ap.add_argument("--bulk", default="kahe", choices=("kahe", "ckks"))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_xmk_upload.json"))
    ap.add_argument(
        "--parameter-sets", nargs="+", default=[rlwe.DEFAULT_PARAMETER_SET.name, "xmk-n4096-q109-l5", "xmk-n4096-q108"]
    )
    ap.add_argument("--no-uncompressed", action="store_true", help="skip the uncompressed round (L' = L)")
    args = ap.parse_args(argv)
    rows = []
    for clients in args.clients:
        rows += [_round(args.params, clients, None, name, args.bulk) for name in args.parameter_sets]
        if not args.no_uncompressed:
            first = rlwe.get_parameter_set(args.parameter_sets[0])
            rows.append(_round(args.params, clients, first.limbs, first.name, args.bulk))
    for row in rows:
        print(
            f"M={row['clients']} {row['bulk']} {row['parameter_set']} L'={row['limbs']}: ciphertext "
            f"{row['ciphertext_bytes']} B + capsule {row['capsule_bytes']} B + share "
            f"{row['share_bytes']} B = {row['upload_per_float32']:.3f}x float32 "
            f"(every reply: {row['all_replies_per_float32']:.3f}x), max err of the mean "
            f"{row['max_error_of_mean']:.2e} (bound {row['error_bound_of_mean']:.2e}), {row['round_seconds']:.1f} s"
        )
    default = rlwe.DEFAULT_PARAMETER_SET
    predicted = compact.compact_limbs(
        default,
        num_clients=args.clients[0],
        scale_bits=rlwe.max_scale_bits(default, num_clients=args.clients[0], max_abs_value=2.0**16),
        max_abs_value=2.0**16,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"default_parameter_set": default.name, "predicted_limbs": predicted, "rows": rows}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
