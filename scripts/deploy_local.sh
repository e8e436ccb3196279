#!/usr/bin/env bash
# docs/flower.md, "2. Deployment", on one host: a SuperLink with TLS and SuperNode
# authentication, one SuperNode per client, one GOT run under dp-secagg, its log head printed
# to pin, the nodes' journals gathered and the run audited against the pinned head.
# The lines between the two "guide" markers are the guide's, verbatim (tests/runs/
# test_deploy_script.py checks it, and runs this script).
#
#   scripts/deploy_local.sh [WORK]     (default ./deployment; it must not exist yet)
#   environment: CLIENTS (3), PORT (39191), RUN (the run's options, without --clients)
#
# Needs secureffm with its flower extra on PATH, and curl. Every process it starts is ended
# when it exits.
set -euo pipefail
set -m  # each background process in its own process group, so that cleanup ends its children
STARTED=()
cleanup() {
    for pid in "${STARTED[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT
WORK=$(realpath -m "${1:-deployment}")
if [ -e "$WORK" ]; then
    echo "deploy_local.sh: $WORK exists; give a new folder" >&2
    exit 2
fi

# --- guide begins ---
CLIENTS=${CLIENTS:-3} PORT=${PORT:-39191}
RUN=${RUN:-"--method got --protocol dp-secagg --partition iid --rounds 200"}
mkdir -p "$WORK" && cd "$WORK"

# 1. On a trusted machine: each party's keys in a folder of its own (keys/server/,
#    keys/client-i/ with that node's Flower authentication key), and the SuperLink's TLS
#    certificate with the CA that every SuperNode and flwr trust.
secureffm flower-keys keys --clients "$CLIENTS"
secureffm flower-certs certs --host localhost --host 127.0.0.1

# 2. The server's operator writes the Flower App (the ServerApp gets keys/server/ only) and
#    pins the log head outside the run folder; each hospital writes its own policy with the
#    same run options.
secureffm flower-app app --keys "$WORK/keys/server" --clients "$CLIENTS" $RUN \
    --out "$WORK/runs/got-deployed" --pin-to "$WORK/pins/got-deployed.json"
for i in $(seq 1 "$CLIENTS"); do
  mkdir -p "node-$i"
  secureffm flower-policy "node-$i/policy.toml" --clients "$CLIENTS" $RUN
done

# 3. A fresh FLWR_HOME whose only connection is this SuperLink's (with its CA): flwr run
#    refuses any other name, so it never starts a local simulation of its own.
export FLWR_HOME=$WORK/flwr-home FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "deployment"

[superlink.deployment]
address = "127.0.0.1:$PORT"
root-certificates = "$WORK/certs/ca.pem"
EOF

# 4. The SuperLink, with TLS and SuperNode authentication; wait until it answers.
flower-superlink --ssl-ca-certfile certs/ca.pem --ssl-certfile certs/superlink.pem \
    --ssl-keyfile certs/superlink.key --enable-supernode-auth \
    --disable-runtime-dependency-installation --host 127.0.0.1 --port "$PORT" \
    > superlink.log 2>&1 &
STARTED+=($!)
curl --silent --fail --retry 120 --retry-delay 1 --retry-all-errors \
    --cacert certs/ca.pem "https://127.0.0.1:$PORT/health" > /dev/null

# 5. Register each node's public authentication key, then start the SuperNodes: each gets
#    only its own keys folder, policy and journal. `secureffm flower-supernode --idle-poll
#    0.1` is Flower's SuperNode pulling every 0.1 s when idle instead of every 3 s; Flower's
#    own `flower-supernode` runs with the same arguments after those.
for i in $(seq 1 "$CLIENTS"); do
  flwr supernode register "keys/client-$i/supernode-auth.pub" deployment
done
for i in $(seq 1 "$CLIENTS"); do
  secureffm flower-supernode --idle-poll 0.1 \
      --superlink "127.0.0.1:$PORT" --root-certificates certs/ca.pem \
      --auth-supernode-private-key "keys/client-$i/supernode-auth.key" \
      --port $((PORT + i)) \
      --node-config "client-id='client-$i' keys='$WORK/keys/client-$i' journal='$WORK/node-$i/journal.jsonl' policy='$WORK/node-$i/policy.toml'" \
      > "node-$i.log" 2>&1 &
  STARTED+=($!)
done

# 6. Submit the run and follow its log to the end; its last lines give the log head.
flwr run app deployment --stream | tee run.log
HEAD=$(sed -n 's/.*log head: \([0-9a-f]\{64\}\).*/\1/p' run.log | tail -n 1)
test -n "$HEAD" || { echo "the run printed no log head: see run.log, superlink.log" >&2; exit 1; }
echo "pin this log head, kept apart from the run folder: $HEAD"

# 7. Each hospital hands over its journal; one command puts them where the audit reads them.
secureffm flower-gather runs/got-deployed node-*/journal.jsonl

# 8. Audit the log, the clients' journals and the pinned head.
secureffm audit --verify runs/got-deployed --expect-head "$HEAD"
# --- guide ends ---
