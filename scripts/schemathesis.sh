#!/usr/bin/env bash
# API fuzzing with schemathesis against a live controller (`fleet-controller dev`: the
# controller with the in-memory CP and IAM): every operation of openapi/fleet.json, a bounded
# number of examples each, with a valid admin token for the admin operations and a valid node
# token (from a real join) for the node operations. Fails on any server error or any response
# that does not conform to the contract.
#   scripts/schemathesis.sh [max-examples-per-operation]   (default 40)
#   FLEET_CONTROLLER_BIN=target/debug/fleet-controller   a controller already built (with the
#   default `dev` feature) instead of `cargo build -p fleet-controller` (CI: the test build's)
set -euo pipefail
cd "$(dirname "$0")/.."
n="${1:-40}"
command -v st >/dev/null || python3 -m pip install -q --disable-pip-version-check "schemathesis==4.32.5"
bin="${FLEET_CONTROLLER_BIN:-}"
if [ -z "$bin" ]; then
  cargo build -q -p fleet-controller
  bin=./target/debug/fleet-controller
fi
tmp=$(mktemp -d)
api=127.0.0.1:18040
"$bin" dev --dir "$tmp" --listen $api --metrics-listen 127.0.0.1:18042 \
  --devkit-listen 127.0.0.1:18041 >"$tmp/out" 2>"$tmp/log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 1 100); do grep -q "Join key" "$tmp/out" 2>/dev/null && break; sleep 0.2; done
grep -q "Join key" "$tmp/out" || { echo "the dev controller did not start:"; cat "$tmp/log"; exit 1; }
admin=$(sed -n 's/.*export FLEET_TOKEN=//p' "$tmp/out")
key=$(sed -n 's/^Join key (one use, 1 h): //p' "$tmp/out")
pub=$(head -c 32 /dev/urandom | base64)
node=$(curl -sf -X POST "http://$api/api/v1/nodes:join" -H 'content-type: application/json' \
  -d "{\"joinKey\":\"$key\",\"name\":\"schemathesis\",\"publicKey\":\"$pub\",\"labels\":[],\"executorKinds\":[\"claude-code\"],\"capacity\":{\"slots\":2},\"secrets\":[],\"version\":\"st\"}" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodeToken"])')
checks=not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance,negative_data_rejection
common=(openapi/fleet.json --url "http://$api" --max-examples "$n" --checks "$checks" --request-timeout 70
        --seed 1 --suppress-health-check all --warnings off)
status=0
echo "=== admin and health operations (admin token)"
st run "${common[@]}" --exclude-tag node -H "Authorization: Bearer $admin" || status=1
echo "=== node operations (node token)"
st run "${common[@]}" --include-tag node -H "Authorization: Bearer $node" || status=1
if grep -q "panicked" "$tmp/log"; then echo "the controller panicked:"; grep -A5 panicked "$tmp/log"; status=1; fi
exit $status
