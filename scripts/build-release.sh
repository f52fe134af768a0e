#!/usr/bin/env bash
# Builds a release's fleet-controller and fleet-node (debug, default features: `dev` exists)
# from its commit, for the tests that run an earlier release beside this one
# (docs/operations.md#versions-and-upgrades): FLEET_PREV_BIN=DIR for e2e/tests/upgrade.rs and
# operator/tests/upgrade.rs, and scripts/record-corpus.sh DIR.
#
#   scripts/build-release.sh [COMMIT] DIR
#
# COMMIT defaults to the commit of the newest corpus under operator/tests/corpus/ older than the
# workspace's own version (its release.json). The tree is checked out into a temporary worktree
# and built in target/release-<short commit> (kept, so a second run only links).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 1 ]; then
  own=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
  prev=$(ls operator/tests/corpus | grep -vx "$own" | sort -V | tail -1)
  [ -n "$prev" ] || { echo "build-release: no corpus older than $own" >&2; exit 1; }
  commit=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['commit'])" "operator/tests/corpus/$prev/release.json")
  out=$1
else
  commit=$1
  out=$2
fi
# A shallow clone (CI) may lack the commit: fetch it.
git cat-file -e "$commit^{commit}" 2>/dev/null || git fetch --quiet origin "$commit" || git fetch --quiet --unshallow
short=$(git rev-parse --short "$commit")
tree=$(mktemp -d /tmp/fleet-release-"$short".XXXXXX)
trap 'git worktree remove --force "$tree" >/dev/null 2>&1 || rm -rf "$tree"' EXIT
git worktree add --detach --quiet "$tree" "$commit"
target="$PWD/target/release-$short"
(cd "$tree" && CARGO_TARGET_DIR="$target" cargo build --quiet -p fleet-controller -p fleet-node)
mkdir -p "$out"
cp "$target/debug/fleet-controller" "$target/debug/fleet-node" "$out/"
echo "built $("$out/fleet-controller" --version) and $("$out/fleet-node" --version) from $short into $out"
