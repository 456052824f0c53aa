#!/usr/bin/env bash
# Prefect server (SQLite under .roboloop/prefect). For a shared server use Postgres:
#   PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://user:pass@host:5432/prefect
# and PREFECT_HOST=0.0.0.0 behind TLS. Basic authentication is always on: the `user:password` string comes
# from $PREFECT_SERVER_API_AUTH_STRING or from a file only roboloop's user can read ($ROBOLOOP_AUTH_FILE,
# default .roboloop/prefect-auth, created on the first start), never from a flag, a flow parameter or a log line.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PREFECT_PORT:-4200}"
HOST="${PREFECT_HOST:-127.0.0.1}"
export PREFECT_HOME="${PREFECT_HOME:-$PWD/.roboloop/prefect}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
# the UI calls the API on the host the browser reached it by (a fixed URL breaks remote browsers and other ports)
export PREFECT_UI_API_URL="${PREFECT_UI_API_URL:-/api}"
# deployment-concurrency leases on disk ($PREFECT_HOME/concurrency_leases), not in the server's memory: a restarted
# server still knows the runs that hold them (in memory they were lost: "410 Gone" at the next renewal). One server
# per PREFECT_HOME; several replicas need a shared store (prefect-redis's lease storage)
export PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE="${PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE:-prefect.server.concurrency.lease_storage.filesystem}"
mkdir -p "$PREFECT_HOME"
if [ -z "${PREFECT_SERVER_API_AUTH_STRING:-}" ]; then
  AUTH_FILE="${ROBOLOOP_AUTH_FILE:-$PWD/.roboloop/prefect-auth}"
  if [ ! -s "$AUTH_FILE" ]; then
    (umask 077 && mkdir -p "$(dirname "$AUTH_FILE")" && \
      .venv/bin/python -c 'import secrets; print("roboloop:" + secrets.token_urlsafe(24), end="")' > "$AUTH_FILE")
    echo "created $AUTH_FILE: the user:password the UI asks for (workers and clients read it: infra/with-auth.sh)"
  fi
  PREFECT_SERVER_API_AUTH_STRING="$(cat "$AUTH_FILE")"
  export PREFECT_SERVER_API_AUTH_STRING
fi
echo "Prefect UI/API: http://$HOST:$PORT  (export PREFECT_API_URL=http://$HOST:$PORT/api; basic auth on)"
exec .venv/bin/prefect server start --host "$HOST" --port "$PORT"
