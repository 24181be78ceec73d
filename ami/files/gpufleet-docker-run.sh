#!/usr/bin/env bash
# docker run for a training container: all GPUs, every EFA/InfiniBand device, host network and IPC, unlimited locked
# memory and the node's NCCL settings; hardened as the runtime's own containers are (trainer.node.runner.docker_argv):
# as the caller's uid:gid (nobody, 65534:65534, when the caller is root), every capability dropped (but IPC_LOCK where
# InfiniBand other than EFA wants it: Azure's HPC sizes), no new privileges. These are defaults for a user's own
# sbatch script, not a boundary (arguments given here come after them, and the docker group can run anything).
# On host network the metadata service does not answer the container's (non-root) user: the job's own credentials (the
# task's AWS_CONTAINER_CREDENTIALS_FULL_URI and AWS_CONTAINER_AUTHORIZATION_TOKEN, from gpufleet-task-prolog) are
# passed on by name, so the token shows in no argv. Usage: gpufleet-docker-run [docker run args] IMAGE [CMD]
set -euo pipefail

uid="$(id -u)"
gid="$(id -g)"
[ "$uid" -ne 0 ] || { uid=65534 gid=65534; }
args=(--gpus all --network host --ipc host --ulimit memlock=-1:-1 --ulimit stack=67108864:67108864
  --env-file /etc/gpufleet/container.env --user "$uid:$gid" --cap-drop ALL --security-opt no-new-privileges)
devices=0
for dev in /dev/infiniband/*; do
  [ -c "$dev" ] && args+=(--device "$dev") && devices=$((devices + 1))
done
efa=0
for driver in /sys/class/infiniband/*/device/driver; do
  [ "$(basename "$(readlink -f "$driver")")" = efa ] && efa=1
done
if [ "$devices" -gt 0 ] && [ "$efa" = 0 ]; then
  args+=(--cap-add IPC_LOCK)
fi
[ -d /mnt/scratch ] && args+=(--volume /mnt/scratch:/mnt/scratch)
if [ -n "${AWS_CONTAINER_AUTHORIZATION_TOKEN:-}" ]; then
  args+=(--env AWS_CONTAINER_CREDENTIALS_FULL_URI --env AWS_CONTAINER_AUTHORIZATION_TOKEN)
fi
exec docker run "${args[@]}" "$@"
