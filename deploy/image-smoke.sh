#!/usr/bin/env bash
# Builds nothing: runs the image built by `make image` against the local broker
# and checks what only a real container shows: it becomes ready as PID 1 under
# a numeric user, and SIGTERM (`stop`) ends it promptly with exit code 0.
# Usage: deploy/image-smoke.sh ENGINE IMAGE   (ENGINE: podman or docker)
set -euo pipefail
engine=${1:-podman}
image=${2:-dispatcher:0.1.0}
name=dispatcher-smoke-$$
port=${SMOKE_PORT:-19090}

cleanup() { "$engine" rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT

config=$(cd "$(dirname "$0")/.." && pwd)/config/dispatcher.yaml
"$engine" run -d --name "$name" --network host \
  -v "$config:/etc/dispatcher/dispatcher.yaml:ro" \
  -e DISPATCHER_CONFIG=/etc/dispatcher/dispatcher.yaml \
  -e RABBITMQ_URL="${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/%2F}" \
  -e DISPATCHER_LISTEN="127.0.0.1:$port" \
  "$image" >/dev/null

ready=""
for _ in $(seq 120); do
  if curl -fsS "http://127.0.0.1:$port/readyz" >/dev/null 2>&1; then ready=yes; break; fi
  sleep 0.5
done
if [ -z "$ready" ]; then
  echo "image-smoke: not ready within 60 s"; "$engine" logs "$name" | tail -20; exit 1
fi
echo "image-smoke: ready; user: $("$engine" exec "$name" id -u)"

started=$(date +%s.%N)
"$engine" stop -t 30 "$name" >/dev/null
elapsed=$(echo "$(date +%s.%N) - $started" | bc)
code=$("$engine" inspect --format '{{.State.ExitCode}}' "$name")
echo "image-smoke: stopped in ${elapsed}s with exit code $code"
"$engine" logs "$name" 2>&1 | grep -q '"shutdown complete"' || { echo "no shutdown line"; exit 1; }
[ "$code" = 0 ] || { echo "image-smoke: exit code $code, expected 0"; exit 1; }
awk "BEGIN { exit !($elapsed < 10) }" || { echo "image-smoke: SIGTERM took ${elapsed}s"; exit 1; }
echo "image-smoke: OK"
