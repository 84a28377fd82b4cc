"""The data owner's policy: what leaves this node and on which terms (DESIGN.md §7).

Whoever submits a run sets its run config, so a node never lets the run config
decide what it reveals or which floors protect it. The node's operator decides, in
the node's policy file or with node config keys (``flower-supernode --node-config
"fedeval-share-auc=false ..."``). Every key is declared once, in :data:`POLICY_KEYS`
(type, default, which direction is *tighter*, whether the run config may tighten it);
the table below, ``docs/how-to/node-policy.md`` and the file written by ``python -m
flwr_fedeval.keys create`` follow from it (a test checks the docs against it).

==================================  ==========  ======================================
Where the policy comes from, later entries overriding earlier ones:

1. the defaults above;
2. a TOML file next to the node's identity key, ``<name>.policy.toml`` (simulation:
   ``<fedeval-identity-dir>/node-<partition-id>.policy.toml``, written by ``python -m
   flwr_fedeval.keys create``; deployment: next to ``fedeval-identity-key``). In simulation
   the node config holds only ``partition-id``/``num-partitions``, so the file is the policy;
3. node config keys of the same names.

Node config keys that *locate* the node's files (:data:`NODE_CONFIG_ONLY`: the identity key,
the roster, the privacy ledger, the SecSV role) are not policy: the file refuses them, naming
node config.

The run config may only **tighten** the keys it may set (:mod:`flwr_fedeval.config_keys`):
``fedeval-share-auc = false`` withholds the AUC; a smaller ``fedeval-dp-epsilon``/
``fedeval-dp-budget`` applies and a larger one is refused with one line naming the node key
(:class:`~flwr_fedeval.protocol.NotConfigured`); the floors ``fedeval-min-clients`` and
``fedeval-xmk-mask-degree`` are the tighter of the node's and the run's (a looser run value
changes nothing). The xMK-CKKS client, the FHE, DP and plaintext AUC handlers and SecSV all
read the floors through :func:`key_set_floor` / :func:`mask_degree_floor`.

The least FHE protocol (:func:`check_fhe_protocol`): a node refuses an FHE AUC session of a
weaker protocol at step 2 (key holder) and steps 3–4 (every client); the key holder signs the
protocol into the participant list (:class:`~flwr_fedeval.protocol.fhe_auc.ParticipantList`),
so a server cannot run steps 3–6 under another protocol than the one the key holder accepted.

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
from flwr_fedeval.rlwe.masking import DEFAULT_MASK_DEGREE

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser (tomli, a dependency of flwr)
    import tomli as tomllib  # type: ignore[no-redef,unused-ignore]

__all__ = [
    "FHE_PROTOCOLS",
    "NODE_CONFIG_ONLY",
    "POLICY_DEFAULTS",
    "POLICY_KEYS",
    "NodePolicy",
    "PolicyKey",
    "check_fhe_protocol",
    "dp_limits",
    "markdown_table",
    "key_set_floor",
    "mask_degree_floor",
    "model_digest",
    "node_policy",
    "policy_file",
    "record_evaluation",
    "share_auc",
    "write_policy_file",
]

SHARE_AUC = "fedeval-share-auc"
FHE_MIN_PROTOCOL = "fedeval-fhe-min-protocol"
DP_EPSILON = "fedeval-dp-epsilon"
DP_BUDGET = "fedeval-dp-budget"
MIN_CLIENTS = "fedeval-min-clients"
XMK_MASK_DEGREE = "fedeval-xmk-mask-degree"
EVALUATIONS = "fedeval-evaluations-per-model"
DP_SEED = "fedeval-dp-seed"
SECSV_TRUST_PRINCIPAL = "fedeval-secsv-trust-principal"

#: The FHE AUC protocols, weakest first (Baykara et al. 2025, §IV-C semi-honest, §IV-D malicious;
#: the same names as :data:`flwr_fedeval.protocol.fhe_auc.PROTOCOLS`, checked by a test).
FHE_PROTOCOLS = ("semi-honest", "malicious")


@dataclasses.dataclass(frozen=True)
class PolicyKey:
    """One node-policy key.

    Attributes
    ----------
    name : str
        The key (policy file and node config; the run config key of the same name, if read).
    type : type
        ``bool``, ``int``, ``float`` or ``str``.
    default : Any
        The value when neither the file nor node config sets it (``None``: see ``meaning``).
    tighter : str
        Which values protect the node more: ``"false"``, ``"smaller"``, ``"larger"``,
        ``"larger, 0 tightest"`` (0 = the complete mask graph) or ``"stronger"`` (later in
        ``choices``).
    meaning : str
        One line for the docs and the policy file.
    run_config : bool
        Whether a run config key of this name is read (to tighten only).
    low : float or None
        Smallest allowed value (numbers).
    choices : tuple of str
        Allowed values (strings), weakest first.
    """

    name: str
    type: type
    default: Any
    tighter: str
    meaning: str
    run_config: bool = False
    low: float | None = None
    choices: tuple[str, ...] = ()


#: Every node-policy key, once (docs, policy files and checks follow from it).
POLICY_KEYS: tuple[PolicyKey, ...] = (
    PolicyKey(SHARE_AUC, bool, False, "false",
              "report the AUC this node decrypted (FHE AUC) to the server; off, only the clients learn it "
              "(Baykara et al. 2025)", run_config=True),
    PolicyKey(FHE_MIN_PROTOCOL, str, None, "stronger",
              "the least FHE AUC protocol this node takes part in; unset: malicious when fedeval-share-auc is "
              "true, else semi-honest", choices=FHE_PROTOCOLS),
    PolicyKey(DP_EPSILON, float, 1.0, "smaller",
              "the largest ε of one DP evaluation this node answers (inf: no noise, i.e. no privacy)",
              run_config=True, low=0.0),
    PolicyKey(DP_BUDGET, float, 0.0, "smaller",
              "the node's total ε over its life, across runs, kept in its privacy ledger (0: fedeval-dp-epsilon, "
              "one DP evaluation)", run_config=True, low=0.0),
    PolicyKey(MIN_CLIENTS, int, 2, "larger",
              "the floor on the parties of every key set, participant list and contributor set this node joins",
              run_config=True, low=2),
    PolicyKey(XMK_MASK_DEGREE, int, DEFAULT_MASK_DEGREE, "larger, 0 tightest",
              "the floor on the xMK-CKKS mask-graph degree: an update stays masked while fewer than this many "
              "of its neighbours collude with the server (0: the complete graph)", run_config=True, low=0),
    PolicyKey(EVALUATIONS, int, 1, "smaller",
              "how many evaluations of one global model (SHA-256 of its arrays) this node answers, across runs "
              "(its privacy ledger); a second one over another subset gives a difference", low=1),
    PolicyKey(DP_SEED, int, 0, "node only",
              "> 0 seeds the DP noise (reproducible runs) and gives up the privacy of the noise; 0: a CSPRNG",
              low=0),
    PolicyKey(SECSV_TRUST_PRINCIPAL, bool, False, "false",
              "take part in SecSV, which protects the test set against an honest-but-curious principal "
              "server P only"),
)
_BY_NAME = {k.name: k for k in POLICY_KEYS}
#: The node policy's keys and defaults (:data:`POLICY_KEYS`).
POLICY_DEFAULTS: dict[str, Any] = {k.name: k.default for k in POLICY_KEYS}
#: Node config keys the library reads that locate the node's files or role: node config only.
NODE_CONFIG_ONLY: dict[str, str] = {
    "fedeval-identity-key": "path to this node's private key (the policy file lies next to it)",
    config_keys.ROSTER: "path to the federation's roster",
    config_keys.LEDGER: "path to this node's privacy ledger (default: beside its identity key)",
    "fedeval-role": "this node's SecSV role (client or aux)",
}
#: Suffix of the policy file next to a node's identity key (``node-3.key`` → ``node-3.policy.toml``).
POLICY_SUFFIX = ".policy.toml"

_KEY_CONFIG, _DIR_CONFIG = "fedeval-identity-key", config_keys.IDENTITY_DIR
_FILE_CACHE: dict[tuple[Any, ...], dict[str, Any]] = {}


def _check_value(key: PolicyKey, value: Any, source: str) -> Any:
    """``value`` of ``key`` converted to its type, or a :class:`NotConfigured` naming the key."""
    def bad(want: str) -> NotConfigured:
        if source == "run config":
            return NotConfigured(f"run config '{key.name}' must be {want}, got {value!r}",
                                 keys=(f"run config {key.name}",))
        return NotConfigured(f"node policy '{key.name}' ({source}) must be {want}, got {value!r}",
                             keys=(f"node config {key.name}",))

    if key.type is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):  # --node-config "k='true'"
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise bad("true or false")
        return value
    if key.type is str:
        if not isinstance(value, str) or value not in key.choices:
            raise bad(f"one of {list(key.choices)}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise bad("a number")
    if key.type is int and (not math.isfinite(value) or value != int(value)):
        raise bad(f"an integer >= {key.low:g}")
    if key.low is not None and not value >= key.low:
        raise bad(f">= {key.low:g}")
    return int(value) if key.type is int else float(value)


def tighter_of(key: PolicyKey, a: Any, b: Any) -> Any:
    """The tighter of two checked values of ``key`` (see :attr:`PolicyKey.tighter`)."""
    if key.tighter == "false":
        return a and b
    if key.tighter == "smaller":
        return min(a, b)
    if key.tighter == "larger":
        return max(a, b)
    if key.tighter == "larger, 0 tightest":
        return 0 if 0 in (a, b) else max(a, b)
    if key.tighter == "stronger":
        return max(a, b, key=key.choices.index)
    raise ValueError(f"'{key.name}' has no tighter direction the run config could use ({key.tighter})")


@dataclasses.dataclass(frozen=True)
class NodePolicy:
    """The node's policy, checked (see :data:`POLICY_KEYS` for the keys).

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
    xmk_mask_degree : int
        ≥ 0, the floor on the xMK-CKKS mask-graph degree (0: the complete graph).
    fhe_min_protocol : str or None
        One of :data:`FHE_PROTOCOLS`, or ``None`` (unset: see :attr:`least_fhe_protocol`).
    """

    share_auc: bool = POLICY_DEFAULTS[SHARE_AUC]
    dp_epsilon: float = POLICY_DEFAULTS[DP_EPSILON]
    dp_budget: float = POLICY_DEFAULTS[DP_BUDGET]
    min_clients: int = POLICY_DEFAULTS[MIN_CLIENTS]
    evaluations_per_model: int = POLICY_DEFAULTS[EVALUATIONS]
    dp_seed: int = POLICY_DEFAULTS[DP_SEED]
    secsv_trust_principal: bool = POLICY_DEFAULTS[SECSV_TRUST_PRINCIPAL]
    source: str = "defaults"
    xmk_mask_degree: int = POLICY_DEFAULTS[XMK_MASK_DEGREE]
    fhe_min_protocol: str | None = POLICY_DEFAULTS[FHE_MIN_PROTOCOL]

    @property
    def dp_total(self) -> float:
        """The node's total ε (``dp_budget``, or ``dp_epsilon`` when it is 0)."""
        return self.dp_budget if self.dp_budget > 0 else self.dp_epsilon

    @property
    def least_fhe_protocol(self) -> str:
        """``fhe_min_protocol``; unset: ``"malicious"`` when the node shares its AUC (a semi-honest
        server could otherwise aggregate one client's counts alone and have it report its own AUC),
        else ``"semi-honest"``."""
        if self.fhe_min_protocol is not None:
            return self.fhe_min_protocol
        return "malicious" if self.share_auc else "semi-honest"

    @classmethod
    def from_values(cls, values: dict[str, Any], source: str) -> NodePolicy:
        """Check ``values`` (keys of :data:`POLICY_KEYS`; others are ignored).

        Raises
        ------
        flwr_fedeval.protocol.NotConfigured
            A value of the wrong type or out of range (naming the key and ``source``).
        """
        v = {k.name: (k.default if values.get(k.name) is None else _check_value(k, values[k.name], source))
             for k in POLICY_KEYS}
        if not v[DP_EPSILON] > 0:
            raise NotConfigured(f"'{DP_EPSILON}' ({source}) must be > 0 (inf: no noise), got {v[DP_EPSILON]!r}",
                                keys=(f"node config {DP_EPSILON}",))
        return cls(share_auc=v[SHARE_AUC], dp_epsilon=v[DP_EPSILON], dp_budget=v[DP_BUDGET],
                   min_clients=v[MIN_CLIENTS], evaluations_per_model=v[EVALUATIONS], dp_seed=v[DP_SEED],
                   secsv_trust_principal=v[SECSV_TRUST_PRINCIPAL], source=source,
                   xmk_mask_degree=v[XMK_MASK_DEGREE], fhe_min_protocol=v[FHE_MIN_PROTOCOL])


def markdown_table() -> str:
    """The Markdown table of :data:`POLICY_KEYS` (key, default, tighter, run config, meaning), as
    ``docs/how-to/node-policy.md`` holds it between ``<!-- policy-keys -->`` markers (a test keeps
    the page equal to it)."""
    def default(k: PolicyKey) -> str:
        return "(unset)" if k.default is None else _toml(k.default).strip('"')

    rows = ["| key | default | tighter | run config | meaning |", "|---|---|---|---|---|"]
    for k in POLICY_KEYS:
        run = "may tighten" if k.run_config else "not read"
        rows.append(f"| `{k.name}` | {default(k)} | {k.tighter} | {run} | {k.meaning} |")
    return "\n".join(rows)


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
        located = sorted(set(values) & set(NODE_CONFIG_ONLY))
        if located:
            raise NotConfigured(f"node policy file {path}: {located} locate this node's files or role; set them in "
                                "node config (flower-supernode --node-config), not in the policy file",
                                keys=tuple(f"node config {k}" for k in located))
        unknown = sorted(set(values) - set(POLICY_DEFAULTS))
        if unknown:
            raise NotConfigured(f"node policy file {path}: unknown key(s) {unknown}; known: {sorted(POLICY_DEFAULTS)}",
                                keys=(f"file {path}",))
        _FILE_CACHE.clear()
        _FILE_CACHE[stamp] = values
    return dict(_FILE_CACHE[stamp])


def node_policy(context: Context) -> NodePolicy:
    """This node's policy: defaults, then its policy file, then node config keys of :data:`POLICY_KEYS`.

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        A value of the wrong type or out of range, or a policy file that is not TOML, has an
        unknown key or is writable by group or others.
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


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return "inf" if value == math.inf else repr(value)


def write_policy_file(path: str | Path, values: dict[str, Any] | None = None) -> Path:
    """Write a policy file with :data:`POLICY_DEFAULTS` updated by ``values``, one commented key
    per line of :data:`POLICY_KEYS` (an unset key is written commented out; mode 0644; refuses to
    overwrite).

    Raises
    ------
    IdentityError
        The file exists, or ``values`` has a key that is not a policy key.
    flwr_fedeval.protocol.NotConfigured
        A value of the wrong type or out of range.
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
    lines = ["# What this node lets leave it and on which terms (flwr_fedeval.clients.policy).",
             "# Node config keys of the same names override these; the run config may only tighten them."]
    for key in POLICY_KEYS:
        lines.append(f"# {key.meaning}")
        value = merged[key.name]
        if value is None:
            lines.append(f"# {key.name} = {_toml(key.choices[-1] if key.choices else '')}")
        else:
            lines.append(f"{key.name} = {_toml(value)}")
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


def _tightened(name: str, value: Any, asked: Any) -> Any:
    """The node policy's ``value`` of ``name``, tightened by the run config's ``asked`` (``None``:
    not set); a looser run value changes nothing."""
    key = _BY_NAME[name]
    if asked is None or not key.run_config:
        return value
    return tighter_of(key, value, _check_value(key, asked, "run config"))


def key_set_floor(context: Context) -> int:
    """The floor on the parties of a key set, participant list or contributor set this node joins.

    The node policy's ``fedeval-min-clients`` (policy file or node config; default 2), raised by
    run config ``fedeval-min-clients`` when that is larger; never below 2. The run config alone
    never lowers it: the data owner sets the floor.

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        A policy or run config value that is not an integer ≥ 2 (naming the key).
    """
    return int(_tightened(MIN_CLIENTS, node_policy(context).min_clients, dict(context.run_config).get(MIN_CLIENTS)))


#: The older name of :func:`key_set_floor` (the FHE, DP and plaintext handlers call it so).
min_clients = key_set_floor


def mask_degree_floor(context: Context) -> int:
    """This node's floor on the degree of the xMK-CKKS mask graph (0: the complete graph).

    The node policy's ``fedeval-xmk-mask-degree`` (policy file or node config; default
    :data:`flwr_fedeval.rlwe.masking.DEFAULT_MASK_DEGREE`), tightened by run config
    ``fedeval-xmk-mask-degree`` (a larger degree, or 0); a smaller run value changes nothing. With
    degree k, stripping an honest client's mask needs all of its k neighbours to collude with the
    server (Bell et al., CCS 2020); checked by :func:`flwr_fedeval.rlwe.masking.check_mask_degree`.

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        A policy or run config value that is not an integer ≥ 0 (naming the key).
    """
    return int(_tightened(XMK_MASK_DEGREE, node_policy(context).xmk_mask_degree,
                          dict(context.run_config).get(XMK_MASK_DEGREE)))


def check_fhe_protocol(context: Context, protocol: str, what: str) -> None:
    """Refuse an FHE AUC session of a protocol weaker than this node's least one
    (:attr:`NodePolicy.least_fhe_protocol`).

    Raises
    ------
    flwr_fedeval.protocol.NotConfigured
        ``protocol`` is not one of :data:`FHE_PROTOCOLS`, or is weaker than the node's policy
        (naming ``fedeval-fhe-min-protocol`` and, when it decided, ``fedeval-share-auc``).
    """
    policy = node_policy(context)
    least = policy.least_fhe_protocol
    if protocol not in FHE_PROTOCOLS:
        raise NotConfigured(f"{what}: unknown FHE AUC protocol {protocol!r}", keys=(f"node config {FHE_MIN_PROTOCOL}",))
    if FHE_PROTOCOLS.index(protocol) < FHE_PROTOCOLS.index(least):
        why = (f"'{FHE_MIN_PROTOCOL}' = {least!r}" if policy.fhe_min_protocol is not None else
               f"'{FHE_MIN_PROTOCOL}' unset and '{SHARE_AUC}' = true: a node that shares its AUC takes part in "
               f"the malicious protocol only, unless its operator sets '{FHE_MIN_PROTOCOL}' = \"semi-honest\"")
        raise NotConfigured(f"{what}: this session runs the {protocol} protocol; node policy {why} "
                            f"({policy.source}): refused",
                            keys=(f"node config {FHE_MIN_PROTOCOL}",) +
                            ((f"node config {SHARE_AUC}",) if policy.fhe_min_protocol is None else ()))


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
