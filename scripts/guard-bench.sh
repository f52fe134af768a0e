#!/usr/bin/env bash
# What a container's life costs through `fleet-node docker-guard` (docs/performance.md#the-docker-guards-cost):
# N times, through the guard's Unix socket as fleet-node makes them, a data volume, a container
# binding its PAT and a secret, its start, its stop and its removal. Run it for two builds of
# fleet-node side by side to compare them; it needs the test image fleet-test-agent:sleep
# (the e2e tests build it) and runs as root, like the guard of the compose file.
#
#   scripts/guard-bench.sh target/release/fleet-node 20
set -euo pipefail
BIN=$(realpath "${1:?usage: guard-bench.sh FLEET_NODE_BINARY [N]}")
N=${2:-20}
IMAGE=${GUARD_BENCH_IMAGE:-fleet-test-agent:sleep}
dir=$(mktemp -d)
prefix=gbench$$
cleanup() {
  [ -n "${guard:-}" ] && kill "$guard" 2>/dev/null || true
  docker ps -aq --filter "name=^${prefix}-" | xargs -r docker rm -f >/dev/null 2>&1 || true
  docker volume ls -q --filter "name=^${prefix}-" | xargs -r docker volume rm >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
mkdir -p "$dir/state/agents/bench" "$dir/secrets"
printf pat-of-bench >"$dir/state/agents/bench/agent-pat"
printf token >"$dir/secrets/gh"
# A guard that copies what containers bind has its own directory (older ones know no guardDir).
guard_dir=""
"$BIN" docker-guard --help | grep -q -- --node-user && guard_dir="guardDir: $dir/guard"
cat >"$dir/node.yaml" <<EOF
controllerUrl: http://127.0.0.1:1
name: ${prefix}-node
capacity: {slots: 4}
executors:
  k: {image: "$IMAGE", user: "65534:65534"}
stateDir: $dir/state
secretsDir: $dir/secrets
containerPrefix: $prefix
$guard_dir
EOF
"$BIN" --config "$dir/node.yaml" docker-guard --listen "unix://$dir/guard.sock" 2>"$dir/guard.log" &
guard=$!
for _ in $(seq 100); do [ -S "$dir/guard.sock" ] && break; sleep 0.05; done
call() { curl -sf -o /dev/null --unix-socket "$dir/guard.sock" -X "$1" -H 'content-type: application/json' ${3:+--data-binary "$3"} "http://docker/v1.41$2"; }
for i in $(seq "$N"); do
  name=$prefix-bench-$i
  labels="{\"fleet.managed\":\"1\",\"fleet.node\":\"${prefix}-node\",\"fleet.kind\":\"k\",\"fleet.agent\":\"bench\"}"
  call POST /volumes/create "{\"Name\":\"$name-data\",\"Labels\":{\"fleet.managed\":\"1\",\"fleet.node\":\"${prefix}-node\"}}"
  call POST "/containers/create?name=$name" "{\"Image\":\"$IMAGE\",\"User\":\"65534:65534\",\"Labels\":$labels,
    \"HostConfig\":{\"Init\":true,\"RestartPolicy\":{\"Name\":\"no\"},\"CapDrop\":[\"ALL\"],
    \"SecurityOpt\":[\"no-new-privileges\"],\"PidsLimit\":1024,\"LogConfig\":{\"Type\":\"json-file\"},
    \"Mounts\":[{\"Type\":\"bind\",\"Source\":\"$dir/state/agents/bench/agent-pat\",\"Target\":\"/run/secrets/agent-pat\",\"ReadOnly\":true},
                {\"Type\":\"bind\",\"Source\":\"$dir/secrets/gh\",\"Target\":\"/run/secrets/gh\",\"ReadOnly\":true},
                {\"Type\":\"volume\",\"Source\":\"$name-data\",\"Target\":\"/data\",\"ReadOnly\":false}]}}" ||
    { echo "create refused:"; cat "$dir/guard.log"; exit 1; }
  call POST "/containers/$name/start"
  call POST "/containers/$name/stop?t=0"
  call DELETE "/containers/$name?force=true&v=false&link=false"
  docker volume rm "$name-data" >/dev/null
done
