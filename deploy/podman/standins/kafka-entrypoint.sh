#!/bin/sh
# KAFKA_FOO_BAR=v -> foo.bar=v (the official image's convention), format the log dir once, run.
set -eu
conf=/var/lib/kafka/server.properties
: > "$conf"
env | grep '^KAFKA_' | grep -v -E '^KAFKA_(HEAP_OPTS|OPTS|CLUSTER_ID)=' | while IFS='=' read -r name value; do
  key=$(echo "${name#KAFKA_}" | tr 'A-Z_' 'a-z.')
  echo "$key=$value" >> "$conf"
done
grep -q '^log.dirs=' "$conf" || echo "log.dirs=/var/lib/kafka/data" >> "$conf"
data=$(sed -n 's/^log.dirs=//p' "$conf")
cp="/opt/kafka/libs/*"
if [ ! -f "$data/meta.properties" ]; then
  id="${KAFKA_CLUSTER_ID:-$(cat /proc/sys/kernel/random/uuid | tr -d '-' | cut -c1-22)}"
  java -Xmx256m -cp "$cp" kafka.tools.StorageTool format --cluster-id "$id" --config "$conf" \
    $(grep -q '^controller.quorum.voters=' "$conf" || echo --standalone)
fi
exec java ${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m} -Djava.awt.headless=true -cp "$cp" kafka.Kafka "$conf"
