#!/usr/bin/env bash
# Create the process work pools `cpu` and `gpu` (idempotent). On Kubernetes create the GPU pool
# from the base job template instead:
#   prefect work-pool create gpu --type kubernetes --base-job-template infra/k8s-gpu-pool.json
set -euo pipefail
cd "$(dirname "$0")/.."
for pool in cpu gpu; do
  .venv/bin/prefect work-pool inspect "$pool" >/dev/null 2>&1 || .venv/bin/prefect work-pool create "$pool" --type process
done
