#!/usr/bin/env bash
# `make run`: the whole local stack on loopback, from Procfile.dev under honcho.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
export RECKON_VAR="${RECKON_VAR:-$PWD/var}"
export RECKON_REDIS_PORT="${RECKON_REDIS_PORT:-6390}"
export RECKON_PROVIDER_PORT="${RECKON_PROVIDER_PORT:-8188}"
export RECKON_REDIS_URL="${RECKON_REDIS_URL:-redis://127.0.0.1:$RECKON_REDIS_PORT/0}"
export RECKON_PROVIDER_URL="${RECKON_PROVIDER_URL:-http://127.0.0.1:$RECKON_PROVIDER_PORT}"
export RECKON_BLOB_DIR="${RECKON_BLOB_DIR:-$RECKON_VAR/blobs}"
export PORT="${PORT:-8000}"
# A loopback development stack: webhooks may go to a receiver on this machine (docs/webhooks.md).
export RECKON_WEBHOOK_ALLOW_PRIVATE="${RECKON_WEBHOOK_ALLOW_PRIVATE:-1}"
mkdir -p "$RECKON_VAR/redis" "$RECKON_BLOB_DIR"
# A development operator token for /ui, made once and kept in var/ (never committed: .gitignore),
# unless the caller sets RECKON_OPERATOR_TOKEN.
TOKEN_FILE="$RECKON_VAR/operator-token"
if [ -z "${RECKON_OPERATOR_TOKEN:-}" ]; then
  if [ ! -s "$TOKEN_FILE" ]; then
    (umask 077 && python -c 'import secrets; print(secrets.token_urlsafe(32))' > "$TOKEN_FILE")
  fi
  RECKON_OPERATOR_TOKEN="$(cat "$TOKEN_FILE")"
  export RECKON_OPERATOR_TOKEN
fi

cat <<MSG
reckon API: http://127.0.0.1:$PORT   (spec: /openapi.json, metrics: /metrics)
event streams: http://127.0.0.1:$((PORT + 700))/v1/events/stream   (the streams process: docs/api.md)
status page: http://127.0.0.1:$PORT/ui?token=$RECKON_OPERATOR_TOKEN
  (the operator token; kept in $TOKEN_FILE unless RECKON_OPERATOR_TOKEN is set)

In another shell, create a tenant and a key, then submit a job:
  .venv/bin/reckon tenant create demo --allowance 1000
  KEY=\$(.venv/bin/reckon key create demo)
  curl -s -X POST http://127.0.0.1:$PORT/v1/jobs \\
    -H "Authorization: Bearer \$KEY" -H "Idempotency-Key: demo-1" -H "Content-Type: application/json" \\
    -d '{"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}, "outputs": 2}'
  curl -s http://127.0.0.1:$PORT/v1/jobs/<id> -H "Authorization: Bearer \$KEY"

MSG
# honcho gives the first process (web) PORT itself and the others PORT+100, +200, ...
exec honcho -f Procfile.dev start --port "$PORT"
