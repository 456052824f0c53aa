#!/usr/bin/env bash
# Entry point of every pod of a multi-node training Job (indexed: JOB_COMPLETION_INDEX 0..N-1).
# Pod 0 runs the Prefect flow run it was started for; its train task launches torchrun with
# --nnodes N --node-rank 0 and writes the TrainConfig to the shared output folder. Pods 1..N-1
# wait for that file and join the same c10d rendezvous at <job>-0.<job>-ranks:29500.
set -euo pipefail
INDEX="${JOB_COMPLETION_INDEX:-0}"
if [ "$INDEX" = "0" ]; then
  exec "$@"
fi
CONFIG="${ROBOLOOP_SHARED_OUTPUT:?set ROBOLOOP_SHARED_OUTPUT to the training output_dir on shared storage}/train_config.json"
for _ in $(seq 600); do [ -f "$CONFIG" ] && break; sleep 2; done
exec roboloop train --config "$CONFIG" --nnodes "${ROBOLOOP_NNODES}" --node-rank "$INDEX" \
  --nproc-per-node "${ROBOLOOP_NPROC_PER_NODE:-8}" --rdzv-endpoint "${ROBOLOOP_RDZV_ENDPOINT}" \
  --max-restarts "${ROBOLOOP_MAX_RESTARTS:-3}"
