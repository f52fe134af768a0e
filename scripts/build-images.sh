#!/usr/bin/env bash
# Builds static fleet-controller and fleet-node binaries and the FROM-scratch images
# `fleet-controller:dev` and `fleet-node:dev` (the engine has no registry: nothing is pulled).
# Usage: scripts/build-images.sh [tag]        (default tag: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-dev}"
target=x86_64-unknown-linux-gnu
profile="${FLEET_IMAGE_PROFILE:-release}"
# A separate target dir: the static flags would otherwise rebuild the normal one.
export CARGO_TARGET_DIR="${FLEET_STATIC_TARGET_DIR:-target/static}"
# No default features: the images carry neither the dev mode (devkit's IAM mints admin
# tokens) nor the test-only failpoints.
RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile "$profile" --target "$target" \
  -p fleet-controller -p fleet-node --bins --no-default-features
dir="$CARGO_TARGET_DIR/$target/$([ "$profile" = dev ] && echo debug || echo "$profile")"
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$dir/fleet-controller" "$dir/fleet-node" deploy/Dockerfile.controller deploy/Dockerfile.node "$ctx/"
mkdir "$ctx/data"
DOCKER_BUILDKIT=0 docker build -q -f "$ctx/Dockerfile.controller" -t "fleet-controller:$tag" "$ctx" >/dev/null
DOCKER_BUILDKIT=0 docker build -q -f "$ctx/Dockerfile.node" -t "fleet-node:$tag" "$ctx" >/dev/null
echo "built fleet-controller:$tag and fleet-node:$tag"
