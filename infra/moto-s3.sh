#!/usr/bin/env bash
# A local S3 for development: moto's server on 127.0.0.1 (in memory), plus a bucket.
#   infra/moto-s3.sh [PORT] [BUCKET]; then export the printed variables.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${1:-5555}"; BUCKET="${2:-roboloop}"
.venv/bin/python -m moto.server -H 127.0.0.1 -p "$PORT" >/dev/null 2>&1 &
PID=$!
for _ in $(seq 50); do (echo > /dev/tcp/127.0.0.1/"$PORT") 2>/dev/null && break; sleep 0.2; done
AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing .venv/bin/python - "$PORT" "$BUCKET" <<'PY'
import sys, boto3
boto3.client("s3", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}", region_name="us-east-1").create_bucket(Bucket=sys.argv[2])
PY
cat <<ENV
# moto S3 running (pid $PID). Use it with:
export ROBOLOOP_S3_ENDPOINT_URL=http://127.0.0.1:$PORT AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1
export ROBOLOOP_REGISTRY=s3://$BUCKET/registry
ENV
wait "$PID"
