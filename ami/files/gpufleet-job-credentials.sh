#!/usr/bin/env bash
# Slurm's Prolog and Epilog on a GPU node (slurm.conf Prolog and Epilog): installed as /usr/local/sbin/gpufleet-prolog
# and /usr/local/sbin/gpufleet-epilog, the name saying which. slurmd runs them as root, without PATH, with
# SLURM_JOB_ID (and SLURM_JOB_UID, SLURM_JOB_GID) set: the Prolog before a job's first task on the node, the Epilog
# when the job ends there. On a node of any cloud they grant and revoke the job's own credentials (`gpufleet-trainer
# credentials prolog|epilog`: the token file /run/gpufleet/credentials/tokens/SLURM_JOB_ID, the job's, 0400, which
# gpufleet-task-prolog hands each task; the Epilog removes it and its grant, so the token is dead). They always exit
# 0: a failing Prolog or Epilog would drain the node. A job whose Prolog failed runs without credentials of its own
# (never with the node's: the metadata service answers only root); the failure goes to syslog (gpufleet-prolog,
# gpufleet-epilog). A node.json that names no cloud: nothing to do.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

action="${0##*/}"
action="${action#gpufleet-}"
case "$action" in
  prolog) lost="; the job has no credentials of its own" ;;
  epilog) lost="" ;;
  *) echo "gpufleet-job-credentials: run it as gpufleet-prolog or gpufleet-epilog, not $0" >&2; exit 0 ;;
esac
cloud="$(jq -r '.cloud // empty' /etc/gpufleet/node.json 2>/dev/null)" || cloud=""
case "$cloud" in
  aws | azure | tencent) ;;
  *) exit 0 ;;
esac
status=0
out="$(/usr/local/bin/gpufleet-trainer credentials "$action" 2>&1)" || status=$?
if [ "$status" -ne 0 ]; then
  {
    echo "Slurm job ${SLURM_JOB_ID:-?}: credentials $action failed (exit status $status)$lost"
    [ -z "$out" ] || printf '%s\n' "$out"
  } | logger -t "gpufleet-$action" -p daemon.err || true
fi
exit 0
