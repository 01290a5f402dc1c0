#!/usr/bin/env bash
# Make podman usable on a Debian machine without a Docker engine or an image registry, then
# print the environment the other scripts and the deploy tests use (eval "$(setup.sh)").
#
#   deploy/podman/setup.sh [--base]     --base also builds the base image (cached)
#
# What it does, each step skipped when already done:
#  - apt-get install podman runc mmdebstrap (Debian's crun fails here: setrlimit / hybrid cgroups);
#  - a private containers.conf under $MAILTAP_PODMAN_DIR (never /etc): runtime runc and ulimits
#    within this shell's hard limits (a container asking for more fails to start);
#  - with --base: the base image mailtap-base:bookworm-<recipe hash> from the Debian mirror (mmdebstrap +
#    podman import), standing in for python:3.11-slim-bookworm where no registry can be reached.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${MAILTAP_PODMAN_DIR:-$ROOT/.state/podman}"
MIRROR="${MAILTAP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# The tag carries a hash of the recipe below, so changing the recipe builds a new base once.
RECIPE="bookworm minbase python3,python3-venv,ca-certificates merged-usr-hook no-docs no-gconv no-lib2to3 r2"
BASE_TAG="${MAILTAP_BASE_IMAGE:-localhost/mailtap-base:bookworm-$(echo "$RECIPE" | sha256sum | cut -c1-8)}"
mkdir -p "$DIR"

log() { echo "podman-setup: $*" >&2; }

if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v mmdebstrap >/dev/null; then
  [ "$(id -u)" = 0 ] || { log "podman, runc and mmdebstrap are missing; run as root or install them"; exit 1; }
  log "installing podman runc mmdebstrap (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >&2 \
    || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc mmdebstrap >&2; }
fi

nofile="$(ulimit -Hn)"; [ "$nofile" = unlimited ] && nofile=1048576
nproc="$(ulimit -Hu)"; { [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768
cat > "$DIR/containers.conf.new" <<CONF
# Written by deploy/podman/setup.sh; do not edit (rewritten on each run).
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
CONF
mv "$DIR/containers.conf.new" "$DIR/containers.conf"
export CONTAINERS_CONF="$DIR/containers.conf"

if [ "${1:-}" = --base ] && ! podman image exists "$BASE_TAG"; then
  # Debian's python3 (3.11) on minbase; python3-venv for the build stage's venv. The host's
  # extra CA certificates (a TLS-inspecting proxy) are not baked in: the Dockerfile takes
  # them as a build secret where pip needs them.
  log "building the base image $BASE_TAG from $MIRROR (about a minute)"
  rootfs="$DIR/base-rootfs.tar"
  # The merged-usr hook instead of the usrmerge package, which pulls in perl (50 MB).
  # Left out (13 MB): glibc's iconv modules (gconv; Python has its own codecs, nothing here
  # calls iconv) and two stdlib packages no component imports (lib2to3, pydoc_data: help()'s
  # topics), removed after the packages' own post-install steps ran.
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/lib/x86_64-linux-gnu/gconv/*' \
    --customize-hook='rm -rf "$1"/usr/lib/python3.11/lib2to3 "$1"/usr/lib/python3.11/pydoc_data' \
    bookworm "$rootfs" "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" >&2
  podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' "$rootfs" "$BASE_TAG" >&2
  rm -f "$rootfs"
fi

echo "export CONTAINERS_CONF=$CONTAINERS_CONF"
echo "export MAILTAP_BASE_IMAGE=$BASE_TAG"
