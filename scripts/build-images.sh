#!/usr/bin/env bash
# Builds fleet-controller and fleet-node without their default features and the FROM-scratch
# images `fleet-controller:<tag>` and `fleet-node:<tag>` (the engine has no registry: nothing is
# pulled). No default features: the images carry neither the dev mode (devkit's IAM mints admin
# tokens) nor the test-only failpoints.
# Usage: scripts/build-images.sh [tag]        (default tag: dev)
#   FLEET_IMAGE_PROFILE   cargo profile, default release (the e2e tests use dev)
#   FLEET_IMAGE_LINK      static (default: the images as shipped) or dynamic (CI's e2e images)
# static:  +crt-static binaries, built in their own target dir (target/static, or
#          FLEET_STATIC_TARGET_DIR): the static flags would otherwise rebuild the normal one.
#          Each image holds its binary and nothing else.
# dynamic: built in the workspace's own target dir, so every dependency is the test build's
#          (nothing compiles twice but fleet-api, fleet-controller and fleet-node); each image
#          is the same Dockerfile with one more layer first: the loader and the shared
#          libraries that `ldd` names, at the paths the binary looks for them. It leaves these
#          builds in target/<profile>/ as fleet-controller and fleet-node: the next cargo
#          build or test of the workspace puts the default-feature ones back.
set -euo pipefail
cd "$(dirname "$0")/.."
tag="${1:-dev}"
profile="${FLEET_IMAGE_PROFILE:-release}"
link="${FLEET_IMAGE_LINK:-static}"
out=$([ "$profile" = dev ] && echo debug || echo "$profile")
case "$link" in
  static)
    target=x86_64-unknown-linux-gnu
    export CARGO_TARGET_DIR="${FLEET_STATIC_TARGET_DIR:-target/static}"
    RUSTFLAGS="-C target-feature=+crt-static" cargo build --profile "$profile" --target "$target" \
      -p fleet-controller -p fleet-node --bins --no-default-features
    dir="$CARGO_TARGET_DIR/$target/$out"
    ;;
  dynamic)
    # --examples (the controller's three small ones) puts the dev-dependencies into the feature
    # resolution, as in the test build: without them tokio, rand, uuid and the crates above
    # them (hyper, reqwest, sqlx, kube, bollard, ...) resolve with other features and compile
    # a second time.
    cargo build --profile "$profile" -p fleet-controller -p fleet-node --bins --examples --no-default-features
    dir="${CARGO_TARGET_DIR:-target}/$out"
    ;;
  *)
    echo "FLEET_IMAGE_LINK is static or dynamic, not '$link'" >&2
    exit 2
    ;;
esac
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
cp "$dir/fleet-controller" "$dir/fleet-node" deploy/Dockerfile.controller deploy/Dockerfile.node "$ctx/"
mkdir "$ctx/data"
if [ "$link" = dynamic ]; then
  mkdir "$ctx/rootfs"
  # `ldd` lines: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" and the loader
  # "/lib64/ld-linux-x86-64.so.2 (0x...)"; copied dereferenced, to the same paths.
  libs=$(for b in fleet-controller fleet-node; do ldd "$ctx/$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
  [ -n "$libs" ] || { echo "ldd named no libraries for the dynamic binaries" >&2; exit 1; }
  for lib in $libs; do cp -L --parents "$lib" "$ctx/rootfs/"; done
  for f in Dockerfile.controller Dockerfile.node; do
    grep -qx 'FROM scratch' "$ctx/$f" || { echo "deploy/$f does not start FROM scratch" >&2; exit 1; }
    sed -i '/^FROM scratch$/a COPY rootfs/ /' "$ctx/$f"
  done
fi
DOCKER_BUILDKIT=0 docker build -q -f "$ctx/Dockerfile.controller" -t "fleet-controller:$tag" "$ctx" >/dev/null
DOCKER_BUILDKIT=0 docker build -q -f "$ctx/Dockerfile.node" -t "fleet-node:$tag" "$ctx" >/dev/null
echo "built fleet-controller:$tag and fleet-node:$tag ($link, $profile)"
