#!/usr/bin/env bash
# docker run for a training container: all GPUs, every EFA/InfiniBand device, host network and IPC,
# unlimited locked memory and the node's NCCL settings. Usage: gpufleet-docker-run [docker run args] IMAGE [CMD]
set -euo pipefail

args=(--gpus all --network host --ipc host --ulimit memlock=-1:-1 --ulimit stack=67108864:67108864
  --env-file /etc/gpufleet/container.env)
for dev in /dev/infiniband/*; do
  [ -c "$dev" ] && args+=(--device "$dev")
done
[ -d /mnt/scratch ] && args+=(--volume /mnt/scratch:/mnt/scratch)
exec docker run "${args[@]}" "$@"
