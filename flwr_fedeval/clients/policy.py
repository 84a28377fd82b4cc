"""The data owner's policy: what leaves this node (issue 22 item 2; DESIGN.md §7).

Whoever submits a run sets its run config, so a node never lets the run config
decide what it reveals. The node's operator decides, with node config keys
(``flower-supernode --node-config "fedeval-share-auc=false ..."``):

=================================  =======  ====================================================
node config key                    default  meaning
=================================  =======  ====================================================
``fedeval-share-auc``              false    report the AUC this node decrypted (FHE AUC) to the
                                            server; off, only the clients learn it, as in
                                            Baykara et al. (2025)
``fedeval-dp-epsilon``             1.0      the largest ε this node spends on one DP evaluation
                                            (``inf``: no noise, i.e. no privacy)
``fedeval-dp-budget``              0.0      the node's total ε over its life, across runs (0:
                                            ``fedeval-dp-epsilon``, one DP evaluation); kept in the
                                            node's privacy ledger (``fedeval-ledger``)
``fedeval-min-clients``            2        the floor on the parties of any evaluation or key set
                                            this node joins
``fedeval-evaluations-per-model``  1        how many evaluations of one global model (the same
                                            SHA-256 of its arrays) this node answers, across runs
                                            (the privacy ledger); a second one, over another
                                            subset, gives a difference
``fedeval-dp-seed``                0        > 0 seeds the DP noise (reproducible runs) and
                                            **gives up the privacy** of the noise; 0: a CSPRNG
``fedeval-secsv-trust-principal``  false    take part in SecSV, which protects the test set against
                                            an honest-but-curious principal server P only
=================================  =======  ====================================================

Where the policy comes from, later entries overriding earlier ones:

1. the defaults above (:data:`POLICY_DEFAULTS`);
2. a TOML file next to the node's identity key, ``<name>.policy.toml`` (simulation:
   ``<fedeval-identity-dir>/node-<partition-id>.policy.toml``, written by ``python -m
   flwr_fedeval.keys create`` with the defaults; deployment: next to
   ``fedeval-identity-key``). In simulation the node config holds only
   ``partition-id``/``num-partitions``, so the file is the policy there;
3. node config ``fedeval-*`` keys.

The run config may only **tighten** the policy, with keys of the same names
(:mod:`flwr_fedeval.config_keys`): ``fedeval-share-auc = false`` withholds the AUC, a
smaller ``fedeval-dp-epsilon``/``fedeval-dp-budget`` or a larger ``fedeval-min-clients``
apply; a looser value (a larger ε or budget) is refused with one line naming the node key
(:class:`~flwr_fedeval.protocol.NotConfigured`: a configuration refusal, which stops the
run). A server-set seed does nothing: the run config key ``fedeval-dp-seed`` is not read.

Evaluations per model: every handler that evaluates a global model (FHE AUC steps 3–4,
DPAUC, FedAUC round 1, the plaintext AUC) calls :func:`record_evaluation` with the
model's digest (:func:`model_digest`) before anything computed from the test data leaves
the node; the count lives in the node's privacy ledger (:mod:`flwr_fedeval.clients.ledger`,
node config ``fedeval-ledger``, default beside the identity key), so it holds across runs: a
server that starts a new run finds the count where the last run left it. A node without a
ledger refuses every evaluation (``NOT_CONFIGURED``, naming ``fedeval-ledger``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, Context, Message

from flwr_fedeval import config_keys
from flwr_fedeval.identity import IdentityError
from flwr_fedeval.protocol import NotConfigured, Refused

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser (tomli, a dependency of flwr)
    import tomli as tomllib

__all__ = [
    "POLICY_DEFAULTS",
    "NodePolicy",
    "dp_limits",
    "model_digest",
    "node_policy",
    "policy_file",
    "record_evaluation",
    "share_auc",
    "write_policy_file",
]

SHARE_AUC = "fedeval-share-auc"
DP_EPSILON = "fedeval-dp-epsilon"
DP_BUDGET = "fedeval-dp-budget"
MIN_CLIENTS = "fedeval-min-clients"
EVALUATIONS = "fedeval-evaluations-per-model"
DP_SEED = "fedeval-dp-seed"
SECSV_TRUST_PRINCIPAL = "fedeval-secsv-trust-principal"

#: The node policy's keys and defaults (the module docstring's table).
POLICY_DEFAULTS: dict[str, Any] = {
    SHARE_AUC: False,
    DP_EPSILON: 1.0,
    DP_BUDGET: 0.0,
    MIN_CLIENTS: 2,
    EVALUATIONS: 1,
    DP_SEED: 0,
    SECSV_TRUST_PRINCIPAL: False,
}
#: Suffix of the policy file next to a node's identity key (``node-3.key`` → ``node-3.policy.toml``).
POLICY_SUFFIX = ".policy.toml"

_KEY_CONFIG, _DIR_CONFIG = "fedeval-identity-key", config_keys.IDENTITY_DIR
_FILE_CACHE: dict[tuple, dict[str, Any]] = {}


@dataclasses.dataclass(frozen=True)
class NodePolicy:
    """The node's policy, checked (see the module docstring for the keys).

    Attributes
    ----------
    share_auc : bool
    dp_epsilon : float
        > 0 (``inf`` allowed).
    dp_budget : float
        ≥ 0; 0 means ``dp_epsilon``.
    min_clients : int
        ≥ 2.
    evaluations_per_model : int
        ≥ 1.
    dp_seed : int
        ≥ 0 (0: CSPRNG).
    secsv_trust_principal : bool
        Whether this node accepts an honest-but-curious SecSV principal server P
        (:func:`flwr_fedeval.clients.shapley_handlers.trusts_principal`).
    source : str
        Where the values come from (defaults, the file, node config), for error messages.
    """

    share_auc: bool = POLICY_DEFAULTS[SHARE_AUC]
    dp_epsilon: float = POLICY_DEFAULTS[DP_EPSILON]
    dp_budget: float = POLICY_DEFAULTS[DP_BUDGET]
    min_clients: int = POLICY_DEFAULTS[MIN_CLIENTS]
    evaluations_per_model: int = POLICY_DEFAULTS[EVALUATIONS]
    dp_seed: int = POLICY_DEFAULTS[DP_SEED]
    secsv_trust_principal: bool = POLICY_DEFAULTS[SECSV_TRUST_PRINCIPAL]
    source: str = "defaults"

    @property
    def dp_total(self) -> float:
        """The node's total ε (``dp_budget``, or ``dp_epsilon`` when it is 0)."""
        return self.dp_budget if self.dp_budget > 0 else self.dp_epsilon

    @classmethod
    def from_values(cls, values: dict[str, Any], source: str) -> NodePolicy:
        """Check ``values`` (keys of :data:`POLICY_DEFAULTS`; others are ignored).

        Raises
        ------
        flwr_fedeval.protocol.NotConfigured
            A value of the wrong type or out of range (naming the key and ``source``).
        """
        v = {**POLICY_DEFAULTS, **{k: values[k] for k in POLICY_DEFAULTS if k in values}}

        def bad(key: str, want: str) -> Refused:
            return NotConfigured(f"node policy '{key}' ({source}) must be {want}, got {v[key]!r}",
                                 keys=(f"node config {key}",))

        for key in (SHARE_AUC, SECSV_TRUST_PRINCIPAL):
            if isinstance(v[key], str) and v[key].lower() in ("true", "false"):  # --node-config "k='true'"
                v[key] = v[key].lower() == "true"
            if not isinstance(v[key], bool):
                raise bad(key, "true or false")
        for key in (DP_EPSILON, DP_BUDGET):
            if isinstance(v[key], bool) or not isinstance(v[key], (int, float)) or math.isnan(v[key]):
                raise bad(key, "a number")
        if not v[DP_EPSILON] > 0:
            raise bad(DP_EPSILON, "> 0 (inf: no noise)")
        if not v[DP_BUDGET] >= 0:
            raise bad(DP_BUDGET, ">= 0 (0: one evaluation at fedeval-dp-epsilon)")
        for key, low in ((MIN_CLIENTS, 2), (EVALUATIONS, 1), (DP_SEED, 0)):
            if isinstance(v[key], bool) or not isinstance(v[key], (int, float)) or v[key] != int(v[key]) \
                    or v[key] < low:
                raise bad(key, f"an integer >= {low}")
        return cls(bool(v[SHARE_AUC]), float(v[DP_EPSILON]), float(v[DP_BUDGET]), int(v[MIN_CLIENTS]),
                   int(v[EVALUATIONS]), int(v[DP_SEED]), bool(v[SECSV_TRUST_PRINCIPAL]), source)


def policy_file(context: Context) -> Path | None:
    """The policy file next to this node's identity key (it may not exist), or ``None``
    (no identity configured)."""
    node, run = dict(context.node_config), dict(context.run_config)
    if node.get(_KEY_CONFIG):
        key = Path(str(node[_KEY_CONFIG])).expanduser()
        return key.with_name(key.name.split(".")[0] + POLICY_SUFFIX)
    directory = str(run.get(_DIR_CONFIG, "") or "")
    if directory and "partition-id" in node:
        return Path(directory).expanduser() / f"node-{int(node['partition-id'])}{POLICY_SUFFIX}"
    return None


def _read_file(path: Path) -> dict[str, Any]:
    st = path.stat()
    if st.st_mode & 0o022:
        raise NotConfigured(f"node policy file {path} is writable by group or others (mode "
                            f"{st.st_mode & 0o777:04o}): anyone on this machine could loosen it; run: chmod 644 {path}",
                            keys=(f"file mode of {path}",))
    stamp = (str(path), st.st_mtime_ns, st.st_size)
    if stamp not in _FILE_CACHE:
        try:
            values = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise NotConfigured(f"node policy file {path}: not TOML ({exc})", keys=(f"file {path}",)) from None
        unknown = sorted(set(values) - set(POLICY_DEFAULTS))
        if unknown:
            raise NotConfigured(f"node policy file {path}: unknown key(s) {unknown}; known: {sorted(POLICY_DEFAULTS)}",
                                keys=(f"file {path}",))
        _FILE_CACHE.clear()
        _FILE_CACHE[stamp] = values
    return dict(_FILE_CACHE[stamp])


def node_policy(context: Context) -> NodePolicy:
    """This node's policy: defaults, then its policy file, then node config ``fedeval-*`` keys.

    Raises
    ------
    flwr_fedeval.protocol.Refused
        A value of the wrong type or out of range, or a policy file that is not TOML.
    """
    values: dict[str, Any] = {}
    sources = ["defaults"]
    path = policy_file(context)
    if path is not None and path.is_file():
        values.update(_read_file(path))
        sources.append(str(path))
    node = {k: v for k, v in dict(context.node_config).items() if k in POLICY_DEFAULTS}
    if node:
        values.update(node)
        sources.append("node config")
    return NodePolicy.from_values(values, " < ".join(sources))


def write_policy_file(path: str | Path, values: dict[str, Any] | None = None) -> Path:
    """Write a policy file with :data:`POLICY_DEFAULTS` updated by ``values`` (mode 0644;
    refuses to overwrite).

    Raises
    ------
    IdentityError
        The file exists, or ``values`` has a key that is not a policy key.
    """
    path = Path(path)
    values = dict(values or {})
    unknown = sorted(set(values) - set(POLICY_DEFAULTS))
    if unknown:
        raise IdentityError(f"not node policy keys: {unknown}")
    if path.exists():
        raise IdentityError(f"refusing to overwrite {path}")
    merged = {**POLICY_DEFAULTS, **values}
    NodePolicy.from_values(merged, str(path))  # a Refused here is a bad value
    lines = ["# What this node lets leave it (flwr_fedeval.clients.policy). Node config fedeval-* keys override.",
             "# The run config may only tighten these values."]
    for key, value in merged.items():
        text = str(value).lower() if isinstance(value, bool) else ("inf" if value == math.inf else repr(value))
        lines.append(f"{key} = {text}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    path.chmod(0o644)
    return path


# --- what a run config may ask --------------------------------------------------------------
def share_auc(context: Context) -> bool:
    """Whether this node reports the AUC it decrypted: node policy ``fedeval-share-auc`` and
    (tightening only) run config ``fedeval-share-auc`` (default true).

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        Run config ``fedeval-share-auc`` is not a bool, or a bad policy value.
    """
    policy = node_policy(context)
    asked = dict(context.run_config).get(config_keys.SHARE_AUC, True)
    if not isinstance(asked, bool):
        raise NotConfigured(f"run config '{config_keys.SHARE_AUC}' must be true or false, got {asked!r}",
                            keys=(f"run config {config_keys.SHARE_AUC}",))
    return policy.share_auc and asked


def dp_limits(context: Context) -> tuple[float, float, int]:
    """``(ε per evaluation, total ε, seed)`` this node allows in this run.

    The node's ``fedeval-dp-epsilon`` and total (``fedeval-dp-budget``, 0 = one evaluation),
    tightened by run config ``fedeval-dp-epsilon`` / ``fedeval-dp-budget`` when they are smaller;
    the seed is node config ``fedeval-dp-seed`` only (0: CSPRNG).

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        Run config ``fedeval-dp-epsilon`` or ``fedeval-dp-budget`` looser than the node's (naming
        both keys), or not a number.
    """
    policy = node_policy(context)
    run = dict(context.run_config)

    def asked(key: str, value: Any, low: float) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low or math.isnan(value):
            raise NotConfigured(f"run config '{key}' must be a number >= {low:g}, got {value!r}",
                                keys=(f"run config {key}",))
        return float(value)

    epsilon, total = policy.dp_epsilon, policy.dp_total
    run_epsilon = asked(config_keys.DP_EPSILON, run.get(config_keys.DP_EPSILON), 0.0)
    run_budget = asked(config_keys.DP_BUDGET, run.get(config_keys.DP_BUDGET), 0.0)
    if run_epsilon is not None:
        if run_epsilon == 0 or run_epsilon > epsilon:
            raise NotConfigured(f"run config '{config_keys.DP_EPSILON}' = {run_epsilon:g} is looser than node "
                                f"config '{DP_EPSILON}' = {epsilon:g} ({policy.source}): refused",
                                keys=(f"run config {config_keys.DP_EPSILON}", f"node config {DP_EPSILON}"))
        epsilon = run_epsilon
    run_total = run_budget if run_budget else run_epsilon  # the run's total: its budget, 0 = one evaluation
    if run_total is not None:
        if run_total > total:
            raise NotConfigured(f"run config '{config_keys.DP_BUDGET}' = {run_budget or 0:g} (total ε "
                                f"{run_total:g}) is looser than node config '{DP_BUDGET}' = {policy.dp_budget:g} "
                                f"(total ε {total:g}; {policy.source}): refused",
                                keys=(f"run config {config_keys.DP_BUDGET}", f"node config {DP_BUDGET}"))
        total = run_total
    return epsilon, total, policy.dp_seed


def check_epsilon(context: Context, epsilon: float) -> None:
    """Refuse a request for ``epsilon`` above this node's ε per evaluation (:func:`dp_limits`).

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        Naming ``fedeval-dp-epsilon`` (node config, or the run config that tightened it).
    """
    limit = dp_limits(context)[0]
    if epsilon > limit:
        raise NotConfigured(f"the request asks ε = {epsilon:g} per evaluation; node config '{DP_EPSILON}' "
                            f"(tightened by run config '{config_keys.DP_EPSILON}') allows {limit:g}: refused",
                            keys=(f"node config {DP_EPSILON}", f"run config {config_keys.DP_EPSILON}"))


def min_clients(context: Context) -> int:
    """The floor on the parties of an evaluation or key set this node joins: the largest of its
    policy's ``fedeval-min-clients`` (node config or policy file),
    :func:`~flwr_fedeval.clients.identity.key_set_floor` and run config ``fedeval-min-clients``
    (which can only raise it); never below 2."""
    from flwr_fedeval.clients.identity import key_set_floor

    policy = node_policy(context)
    run_floor = dict(context.run_config).get(config_keys.MIN_CLIENTS, 2)
    run_floor = run_floor if isinstance(run_floor, int) and not isinstance(run_floor, bool) else 2
    return max(policy.min_clients, key_set_floor(context), run_floor)


# --- evaluations per model --------------------------------------------------------------------
def model_digest(arrays: ArrayRecord) -> bytes:
    """SHA-256 over the model's arrays (names, dtypes, shapes and bytes, in record order)."""
    h = hashlib.sha256(b"flwr-fedeval/model/v1")
    for name, array in arrays.items():
        a = array.numpy()
        h.update(len(name).to_bytes(4, "big") + name.encode())
        h.update(str(a.dtype).encode() + b"|" + repr(tuple(a.shape)).encode() + b"|")
        data = a.tobytes()
        h.update(len(data).to_bytes(8, "big") + data)
    return h.digest()


def _protocol_records() -> frozenset[str]:
    from flwr_fedeval.protocol import auc, dp_auc, fhe_auc

    return frozenset(v for m in (auc, dp_auc, fhe_auc) for k, v in vars(m).items()
                     if k.endswith("_KEY") and isinstance(v, str))


def message_model_digest(msg: Message) -> bytes | None:
    """The digest of the global model a request carries: :func:`model_digest` of its ArrayRecord
    that is not one of our protocol records (Flower's ``arrays``, or the phase's
    ``arrayrecord_key``); several such records are hashed together, whatever their record keys.
    ``None`` if there is none (a request that carries no model evaluates none)."""
    ours = _protocol_records()
    digests = sorted(model_digest(record) for key, record in msg.content.items()
                     if isinstance(record, ArrayRecord) and key not in ours)
    if not digests:
        return None
    return digests[0] if len(digests) == 1 else hashlib.sha256(b"".join(digests)).digest()


def record_evaluation(context: Context, digest: bytes | None, what: str) -> int:
    """Count one more evaluation of the model ``digest`` in the node's privacy ledger (across runs);
    the number answered before this one (``digest`` ``None``: no model, nothing counted, 0).

    Written before anything computed from the test data leaves the node (the ledger commits before
    it returns).

    Raises
    ------
    flwr_fedeval.protocol.Refused
        This node already answered ``fedeval-evaluations-per-model`` evaluations of this model, in
        this run or an earlier one (names the key; nothing is recorded), or the ledger is full.
    flwr_fedeval.clients.ledger.LedgerNotConfigured
        The node has no privacy ledger (names ``fedeval-ledger``).
    """
    from flwr_fedeval.clients.ledger import ledger_refusals, node_ledger
    from flwr_fedeval.ledger import AlreadyGiven

    if digest is None:
        return 0
    allowed = node_policy(context).evaluations_per_model
    ledger = node_ledger(context)
    with ledger_refusals(what):
        try:
            return ledger.record_evaluation(bytes(digest), what, allowed)
        except AlreadyGiven:
            done = ledger.evaluations(bytes(digest))
    raise Refused(f"{what}: this node already answered {done} evaluation(s) of this global model (SHA-256 "
                  f"{bytes(digest).hex()[:16]}; node privacy ledger, across runs); node config '{EVALUATIONS}' = "
                  f"{allowed}: refused")
