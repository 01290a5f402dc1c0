#!/usr/bin/env bash
# Build local stand-ins for the images the compose file's local-kafka profile names
# (apache/kafka:4.1.1, apicurio/apicurio-registry-mem:2.4.2.Final) from what `make test` already
# resolved into .cache/ (the Kafka jars, the Apicurio build), tagged with those names, so the
# unchanged compose file runs where no registry can be reached. Cached: a second run is quick.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
eval "$(deploy/podman/setup.sh --base)"
HERE=deploy/podman/standins
CTX="${MAILTAP_PODMAN_DIR:-$ROOT/.state/podman}/standins"
KAFKA_LIBS="$(readlink -f .cache/kafka/libs)"
REGISTRY_APP="$(readlink -f .cache/registry/app)"
[ -d "$KAFKA_LIBS" ] || { echo "no Kafka jars in .cache/kafka/libs: run make venv (mailtap dev up resolves them)" >&2; exit 1; }
[ -f "$REGISTRY_APP/quarkus-run.jar" ] || { echo "no registry build in .cache/registry/app: run make registry" >&2; exit 1; }
rm -rf "$CTX" && mkdir -p "$CTX/kafka" "$CTX/registry"
# Hard links where the cache is on the same file system: no copy of ~100 MB of jars.
cp -rl "$KAFKA_LIBS" "$CTX/kafka/libs" 2>/dev/null || cp -r "$KAFKA_LIBS" "$CTX/kafka/libs"
cp -rl "$REGISTRY_APP" "$CTX/registry/app" 2>/dev/null || cp -r "$REGISTRY_APP" "$CTX/registry/app"
cp "$HERE/kafka-entrypoint.sh" "$CTX/kafka/"
JRE=localhost/mailtap-jre:bookworm
build() { podman build --format docker --network host --layers "$@" >&2; }
build -f "$HERE/jre.Containerfile" --build-arg BASE_IMAGE="$MAILTAP_BASE_IMAGE" -t "$JRE" "$CTX"
build -f "$HERE/kafka.Containerfile" --build-arg JRE_IMAGE="$JRE" -t docker.io/apache/kafka:4.1.1 "$CTX/kafka"
build -f "$HERE/registry.Containerfile" --build-arg JRE_IMAGE="$JRE" \
  -t docker.io/apicurio/apicurio-registry-mem:2.4.2.Final "$CTX/registry"
echo docker.io/apache/kafka:4.1.1 docker.io/apicurio/apicurio-registry-mem:2.4.2.Final
