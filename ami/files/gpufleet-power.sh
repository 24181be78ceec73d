#!/usr/bin/env bash
# Slurm's power saving programs on the controller: installed as gpufleet-resume, gpufleet-suspend and
# gpufleet-resume-fail (slurm.conf's ResumeProgram, SuspendProgram, ResumeFailProgram). slurmctld runs them as the
# slurm user, without PATH, with the hostlist of the nodes as the one argument; each hands it to the node provider
# (`gpufleet-trainer nodes ACTION HOSTLIST`) and logs to /var/log/slurm/power.log.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

action="$(basename "$0")"
action="${action#gpufleet-}"
case "$action" in
  resume | suspend | resume-fail) ;;
  *)
    echo "gpufleet-power: run as gpufleet-resume, gpufleet-suspend or gpufleet-resume-fail, not $(basename "$0")" >&2
    exit 2
    ;;
esac
[ "$#" -eq 1 ] || {
  echo "gpufleet-$action: expected one argument, the hostlist of the nodes" >&2
  exit 2
}
exec >>/var/log/slurm/power.log 2>&1
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $action $1"
status=0
/usr/local/bin/gpufleet-trainer nodes "$action" "$1" || status=$?
echo "$(date -u +%Y-%m-%dT%H:%M:%SZ) $action $1: exit status $status"
exit "$status"
