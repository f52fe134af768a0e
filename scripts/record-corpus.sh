#!/usr/bin/env bash
# Records a release's corpus (docs/operations.md#versions-and-upgrades): what that release
# leaves behind for the next ones to read. Run it once per release, with that release's own
# binaries, and check the result in under operator/tests/corpus/<version>/:
#
#   scripts/record-corpus.sh BIN_DIR [OUT_DIR]
#
# BIN_DIR holds the release's fleet-controller (built with the default features, so that
# `fleet-controller dev` exists) and fleet-node. OUT_DIR defaults to
# operator/tests/corpus/<version>. The commit recorded is this checkout's HEAD; for binaries of
# another commit (an earlier release's, scripts/build-release.sh) set FLEET_CORPUS_COMMIT. Needs Docker, busybox-static (the agent image is built FROM
# scratch around it), python3 and sqlite3.
#
# What it does: `fleet-controller dev` with its example agents; the release's fleet-node on
# this machine's Docker, joined through a recording proxy (scripts/corpus-proxy.py); the three
# agent containers up; a template change of `reviewer` rolled out; then it keeps:
#   store.sqlite     the controller's store as the release leaves it (VACUUM INTO: compact)
#   cp-agents.json   the CP's agent items the store was made from (the devkit's list)
#   reports/         the node's observed reports, as sent (distinct ones, at most 8)
#   desired/         the controller's desired states, as served (one per generation)
#   node/            the node's node.yaml, desired.json, token, node-id and keys: the corpus
#                    tests speak as this node (a throwaway dev fleet's secrets)
#   containers.json  each agent container's name, image and labels (`fleet.spec` among them)
#   release.json     the version, the commit it was built from (FLEET_CORPUS_COMMIT, else the
#                    checkout's HEAD), when it was recorded and the binaries' --version
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(cd "${1:?usage: scripts/record-corpus.sh BIN_DIR [OUT_DIR]}" && pwd)
version=$("$bin/fleet-controller" --version | awk '{print $2}')
out=${2:-operator/tests/corpus/$version}
for tool in docker python3 sqlite3 curl; do
  command -v "$tool" >/dev/null || { echo "record-corpus: $tool is needed" >&2; exit 1; }
done
[ -x /bin/busybox ] || { echo "record-corpus: apt-get install busybox-static" >&2; exit 1; }

work=$(mktemp -d /tmp/fleet-corpus.XXXXXX)
node=corpus-node
image=fleet-corpus-agent:1
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
api=$(port) metrics=$(port) devkit=$(port) proxy=$(port)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  docker rm -f $(docker ps -aq --filter "label=fleet.node=$node") >/dev/null 2>&1 || true
  docker volume rm $(docker volume ls -q --filter "name=^$node-") >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
docker rm -f $(docker ps -aq --filter "label=fleet.node=$node") >/dev/null 2>&1 || true

echo "== the agent image $image (FROM scratch, busybox)"
mkdir -p "$work/image"
cp /bin/busybox "$work/image/busybox"
printf '%s\n' 'trap "exit 0" TERM' 'echo "agent $CONTROL_PLANE_AGENT_KEY replica $FLEET_REPLICA started"' \
  'while true; do /bin/busybox sleep 3600 & wait $!; done' >"$work/image/agent.sh"
printf 'FROM scratch\nCOPY busybox /bin/busybox\nCOPY agent.sh /agent.sh\nENTRYPOINT ["/bin/busybox", "sh", "/agent.sh"]\n' \
  >"$work/image/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t "$image" "$work/image" >/dev/null

echo "== fleet-controller dev ($version) on 127.0.0.1:$api"
"$bin/fleet-controller" dev --dir "$work/dev" --listen "127.0.0.1:$api" --metrics-listen "127.0.0.1:$metrics" \
  --devkit-listen "127.0.0.1:$devkit" --image "$image" --node-name "$node" >"$work/dev.out" 2>"$work/dev.log" &
pids+=($!)
for _ in $(seq 300); do grep -q '^Join key' "$work/dev.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^Join key' "$work/dev.out" || { cat "$work/dev.log"; exit 1; }

python3 scripts/corpus-proxy.py "$proxy" "http://127.0.0.1:$api" "$work/messages" 2>"$work/proxy.log" &
pids+=($!)
mkdir -p "$work/secrets" && chmod 0700 "$work/secrets"
cat >"$work/node.yaml" <<EOF
controllerUrl: http://127.0.0.1:$proxy
name: $node
containerPrefix: $node
labels: [zone=a]
capacity: {slots: 4}
executors:
  claude-code: {image: "$image", dataPath: /data, user: "$(id -u):$(id -g)"}
stateDir: $work/dev/node-state
secretsDir: $work/secrets
joinKeyFile: $work/dev/join-key
observeSeconds: 5
checkBeforeStop: true
EOF
echo "== fleet-node ($("$bin/fleet-node" --version | awk '{print $2}')) through the recording proxy"
"$bin/fleet-node" --config "$work/node.yaml" 2>"$work/node.log" &
pids+=($!)

running() { docker ps -q --filter "label=fleet.node=$node" --filter status=running | wc -l; }
phase() { curl -s "http://127.0.0.1:$devkit/devkit/statuses/$1" | python3 -c 'import json,sys; v=json.load(sys.stdin); v=v[-1] if isinstance(v,list) and v else v; print((v or {}).get("phase",""))' 2>/dev/null || true; }
wait_for() { for _ in $(seq 600); do eval "$1" && return 0; sleep 0.2; done; echo "timed out: $1" >&2; tail -30 "$work/node.log" "$work/dev.log" >&2; exit 1; }
wait_for '[ "$(running)" -ge 3 ] && [ "$(phase coder)" = running ] && [ "$(phase reviewer)" = running ]'
echo "== a template change of reviewer, rolled out"
curl -sf -X POST "http://127.0.0.1:$devkit/devkit/agents/reviewer/template" -H 'content-type: application/json' \
  -d '{"resources": {"memoryMb": 256}}' >/dev/null
wait_for '[ "$(docker ps -q --filter label=fleet.agent=reviewer --filter label=fleet.node='"$node"' --filter status=running | xargs -r docker inspect --format "{{.HostConfig.Memory}}" 2>/dev/null | grep -c 268435456)" -eq 2 ]'
sleep 12   # two more report periods, with the rollout complete

echo "== collecting into $out"
rm -rf "$out"
mkdir -p "$out/reports" "$out/desired" "$out/node"
docker ps -aq --filter "label=fleet.node=$node" | xargs docker inspect |
  python3 -c 'import json,sys; print(json.dumps(sorted(({"name": c["Name"].lstrip("/"), "image": c["Config"]["Image"], "labels": c["Config"]["Labels"]} for c in json.load(sys.stdin)), key=lambda c: c["name"]), indent=1))' \
    >"$out/containers.json"
curl -sf "http://127.0.0.1:$devkit/devkit/agents" >"$out/cp-agents.json"
kill "${pids[2]}"   # the node; its agent containers keep running until the cleanup
kill -INT "${pids[0]}"
wait "${pids[0]}" 2>/dev/null || true
sqlite3 "$work/dev/fleet.sqlite" "VACUUM INTO '$out/store.sqlite'"
cp "$work/node.yaml" "$work/dev/node-state/"{token,node-id,node.key,node.pub,desired.json} "$out/node/"
python3 - "$work/messages" "$out" <<'EOF'
import glob, hashlib, json, os, sys
src, out = sys.argv[1:]
seen, kept = set(), 0
for path in sorted(glob.glob(os.path.join(src, "report-*.json"))):
    body = json.load(open(path))
    key = json.dumps({k: v for k, v in body.items() if k not in ("seq", "bootId")}, sort_keys=True)
    if key in seen or kept == 8:
        continue
    seen.add(key)
    kept += 1
    open(os.path.join(out, "reports", f"{kept:02d}.json"), "w").write(json.dumps(body, indent=1) + "\n")
gens = {}
for path in sorted(glob.glob(os.path.join(src, "desired-*.json"))):
    body = json.load(open(path))
    gens.setdefault(body["generation"], body)
for g, body in sorted(gens.items()):
    open(os.path.join(out, "desired", f"generation-{g:03d}.json"), "w").write(json.dumps(body, indent=1) + "\n")
print(f"{kept} reports, {len(gens)} desired states")
EOF
commit=$(git rev-parse HEAD)
printf '{"version": "%s", "commit": "%s", "recorded": "%s", "binaries": "%s, %s"}\n' \
  "$version" "${FLEET_CORPUS_COMMIT:-$commit}" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  "$("$bin/fleet-controller" --version)" "$("$bin/fleet-node" --version)" >"$out/release.json"
du -sh "$out"
