#!/usr/bin/env bash
# Slurm's TaskProlog on a GPU node (slurm.conf TaskProlog, installed as /usr/local/sbin/gpufleet-task-prolog):
# slurmstepd runs it as the job's user before each task, the batch script's included, and sets in the task what it
# prints as `export NAME=value`. It hands every task the node's NCCL/EFA settings (/etc/gpufleet/nccl.env, written
# at bake time by 60-nccl-env.sh), whatever submitted the job: the bridge, or a user's own sbatch script. The
# task's LD_LIBRARY_PATH is kept after the node's library directories.
set -euo pipefail

settings="${1:-/etc/gpufleet/nccl.env}"  # Slurm passes no argument; tests pass a file
[ -r "$settings" ] || exit 0
while IFS= read -r line || [ -n "$line" ]; do
  case "$line" in
    '' | '#'*) continue ;;
  esac
  name="${line%%=*}"
  value="${line#*=}"
  case "$name" in
    *[!A-Za-z0-9_]* | '' | [0-9]*) continue ;;
  esac
  if [ "$name" = LD_LIBRARY_PATH ] && [ -n "${LD_LIBRARY_PATH:-}" ]; then
    value="$value:$LD_LIBRARY_PATH"
  fi
  printf 'export %s=%s\n' "$name" "$value"
done <"$settings"
