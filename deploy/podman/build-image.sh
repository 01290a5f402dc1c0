#!/usr/bin/env bash
# Build the mailtap image with podman (make image): version from pyproject.toml, the base image
# from deploy/podman/setup.sh --base when python:3.11-slim-bookworm cannot be pulled, and the
# host's extra CA certificates for pip (TLS-inspecting proxies). Layers are cached: a second run
# with unchanged inputs takes seconds.
#   deploy/podman/build-image.sh [extra podman build args...]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
eval "$(deploy/podman/setup.sh --base)"
VERSION="$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
IMAGE="${MAILTAP_IMAGE:-localhost/mailtap:$VERSION}"
ca=""
for crt in /usr/local/share/ca-certificates/*.crt; do
  [ -f "$crt" ] && ca+="$(cat "$crt")"$'\n'
done
podman build --format docker --network host --layers \
  -f deploy/Dockerfile \
  --build-arg BASE_IMAGE="$MAILTAP_BASE_IMAGE" \
  --build-arg VERSION="$VERSION" \
  --build-arg EXTRA_CA_CERTS="$ca" \
  -t "$IMAGE" "$@" . >&2
podman image inspect --format '{{.Size}}' "$IMAGE" \
  | awk -v img="$IMAGE" '{printf "%s: %.0f MB\n", img, $1/1e6}' >&2
echo "$IMAGE"
