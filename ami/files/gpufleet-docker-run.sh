#!/usr/bin/env bash
# A training container for a user's own sbatch script: gpufleet-docker-run IMAGE [CMD...]. It runs as the caller's
# uid:gid (nobody, 65534:65534, when the caller is root) with every capability dropped (but IPC_LOCK where InfiniBand
# other than EFA wants it: Azure's HPC sizes) and no new privileges, and gets the job's GPUs, every EFA/InfiniBand
# device, host network and IPC, unlimited locked memory, the node's NCCL settings and a scratch directory of its own
# at /mnt/scratch (removed afterwards); the job's own credentials (the task's AWS_CONTAINER_CREDENTIALS_FULL_URI and
# AWS_CONTAINER_AUTHORIZATION_TOKEN, from gpufleet-task-prolog) are passed on by name, so the token shows in no argv.
# SIGTERM (Slurm's stop) stops the container within the cloud's grace. Docker options are not the caller's to choose:
# the caller is not in the docker group, and the container is started by the root launcher gpufleet-container
# (through sudo), which runs only that hardened `docker run` (python -m trainer container job: trainer.node.container).
set -euo pipefail

python=/opt/gpufleet/venv/bin/python # the manifest's .trainer.venv (tests/ami check that they agree)
usage="usage: gpufleet-docker-run IMAGE [CMD...]"

if [ "$#" -eq 0 ]; then
  echo "gpufleet-docker-run: no image; $usage" >&2
  exit 2
fi
if [[ "$1" == -* ]]; then
  echo "gpufleet-docker-run: docker options are not accepted ($1); $usage" >&2
  exit 2
fi
# -I: the image's trainer, never a trainer/ folder in the caller's working directory or on its PYTHONPATH.
exec "$python" -I -m trainer container job "$@"
