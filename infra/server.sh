#!/usr/bin/env bash
# Local Prefect server on 127.0.0.1 (SQLite under .roboloop/prefect). For a shared server use
# Postgres:  PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://user:pass@host:5432/prefect
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${PREFECT_PORT:-4200}"
export PREFECT_HOME="${PREFECT_HOME:-$PWD/.roboloop/prefect}"
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
mkdir -p "$PREFECT_HOME"
echo "Prefect UI/API: http://127.0.0.1:$PORT  (export PREFECT_API_URL=http://127.0.0.1:$PORT/api)"
exec .venv/bin/prefect server start --host 127.0.0.1 --port "$PORT"
