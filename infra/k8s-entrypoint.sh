#!/usr/bin/env bash
# Entry point of every pod of the gpu pool's indexed training Job (infra/k8s-gpu-pool.json; JOB_COMPLETION_INDEX
# 0..N-1, set by the Job controller). Pod 0 runs the command the worker gave it (the Prefect flow run); its train
# stage starts torchrun as node 0 of ROBOLOOP_NNODES and writes its config and dataset to ROBOLOOP_RUN_STORE (S3).
# Pods 1..N-1 wait there for them (`roboloop cluster join`) and join the rendezvous at
# $ROBOLOOP_RUN_ID-0.roboloop-ranks:29500 (the Job's name, from the downward API; the headless service's name).
# The pods share no volume. `python infra/k8s.py render` / `roboloop cluster render k8s` print the manifests.
set -euo pipefail
INDEX="${JOB_COMPLETION_INDEX:-0}"
if [ "$INDEX" = "0" ]; then
  exec "$@"
fi
exec roboloop cluster join --node-rank "$INDEX"
