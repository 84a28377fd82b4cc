# Sourced by run-local.sh and run-deployment.sh (needs ROOT and the venv's python on PATH).
# ensure_identities N: one signing key per node (node-0 .. node-{N-1}), the roster and one node policy
# file per node (node-<i>.policy.toml, flwr_fedeval.clients.policy), made once per node count in
# .fedeval-ids/N (the FHE AUC and SecSV phases refuse to run without them); made aside,
# then renamed, so concurrent runs keep one set. Sets IDS.
# FEDEVAL_IDS_ROOT (default $ROOT/.fedeval-ids) puts them elsewhere: the test legs use a throwaway
# folder, since each node's privacy ledger lives beside its key and refuses a second evaluation of the
# same global model in a later run.
# The demo's policy: the documented defaults, except fedeval-share-auc = true so that the FINAL line
# of `make run` keeps a number, and fedeval-fhe-min-protocol = semi-honest, the operator's consent to
# the demo's default FHE protocol while sharing (unset, a sharing node takes part in the malicious
# protocol only); FEDEVAL_POLICY (space-separated KEY=VALUE) replaces both.
FEDEVAL_POLICY=${FEDEVAL_POLICY-"fedeval-share-auc=true fedeval-fhe-min-protocol=semi-honest"}
ensure_identities() {
  local ids_root=${FEDEVAL_IDS_ROOT:-$ROOT/.fedeval-ids}
  IDS="$ids_root/$1"
  local policy_args=() kv
  for kv in $FEDEVAL_POLICY; do policy_args+=(--policy "$kv"); done
  if [ ! -f "$IDS/roster.json" ]; then
    mkdir -p -m 700 "$ids_root"
    local tmp_ids
    tmp_ids=$(mktemp -d "$ids_root/.new.XXXXXX")
    python -m flwr_fedeval.keys create --out "$tmp_ids/ids" --nodes "$1" "${policy_args[@]}" >/dev/null
    mv -T "$tmp_ids/ids" "$IDS" 2>/dev/null || true
    rm -rf "$tmp_ids"
  fi
  # a set made before node policies existed: add the policy files (never overwrites one)
  python -m flwr_fedeval.keys policy --out "$IDS" --nodes "$1" "${policy_args[@]}" >/dev/null
}
