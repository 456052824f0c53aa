#!/usr/bin/env bash
# Run a Prefect client (worker, deploy, CLI) authenticated to a server started by infra/server.sh:
# PREFECT_API_AUTH_STRING from the environment or from $ROBOLOOP_AUTH_FILE (default .roboloop/prefect-auth).
# Kubernetes jobs read it from the Secret named by the work pool's `auth_secret` variable instead.
set -euo pipefail
if [ -z "${PREFECT_API_AUTH_STRING:-}" ]; then
  AUTH_FILE="${ROBOLOOP_AUTH_FILE:-$(cd "$(dirname "$0")/.." && pwd)/.roboloop/prefect-auth}"
  if [ -s "$AUTH_FILE" ]; then
    PREFECT_API_AUTH_STRING="$(cat "$AUTH_FILE")"
    export PREFECT_API_AUTH_STRING
  fi
fi
exec "$@"
