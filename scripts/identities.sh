# Sourced by run-local.sh and run-deployment.sh (needs ROOT and the venv's python on PATH).
# ensure_identities N: one signing key per node (node-0 .. node-{N-1}) and the roster, made once
# per node count in .fedeval-ids/N (issue 12: the FHE AUC and SecSV phases refuse to run
# without them); made aside, then renamed, so concurrent runs keep one set. Sets IDS.
ensure_identities() {
  IDS="$ROOT/.fedeval-ids/$1"
  if [ ! -f "$IDS/roster.json" ]; then
    mkdir -p -m 700 "$ROOT/.fedeval-ids"
    local tmp_ids
    tmp_ids=$(mktemp -d "$ROOT/.fedeval-ids/.new.XXXXXX")
    python -m flwr_fedeval.keys create --out "$tmp_ids/ids" --nodes "$1" >/dev/null
    mv -T "$tmp_ids/ids" "$IDS" 2>/dev/null || true
    rm -rf "$tmp_ids"
  fi
}
