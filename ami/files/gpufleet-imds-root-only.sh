#!/usr/bin/env bash
# The instance metadata service answers only root on a GPU node of any cloud (what ParallelCluster's secured IMDS
# does), so no
# job holds the node's cloud identity: a job gets credentials of its own from gpufleet-credentials.service on loopback
# (trainer.node.jobcreds). The OUTPUT chain ACCEPTs TCP packets to the service's port 80 whose owner is root (or a
# user named with --allow: the notice watcher's slurm user, which no job runs as) and REJECTs every other's.
# Containers run with --network host: their packets pass this host's OUTPUT chain with their own (non-root) uid, so
# they are refused too. A process that can start a container as root (the docker group) would get past it: jobs are
# not in the docker group and start containers only through gpufleet-container, which runs them as the caller's uid
# (trainer.node.container), so the owner match applies to them too.
# Run at boot by gpufleet-imds.service (before slurmd and docker; AWS and Tencent nodes). Idempotent: the rules are
# checked with -C first; a second run adds nothing, and a partial set is replaced by the whole one, in order.
# Usage: gpufleet-imds-root-only [--allow USER]... [--cloud aws|azure|tencent | --cloud-of NODE_JSON] [IPV4 [IPV6]]
# The cloud's service (--cloud-of: the cloud a node.json names): aws (the default) 169.254.169.254 and fd00:ec2::254,
# the IPv6 rules only where ip6tables works; azure 169.254.169.254 (IMDS, its identity endpoint and Scheduled
# Events); tencent 169.254.0.23 (metadata.tencentyun.com); neither of the two has an IPv6 address. Addresses given
# win. Azure's WireServer (168.63.129.16) is the guest agent's to guard (its OS.EnableFirewall, on by default).
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

usage="usage: [--allow USER]... [--cloud aws|azure|tencent | --cloud-of NODE_JSON] [IPV4 [IPV6]]"
allowed=(0)
cloud=aws
while [ "$#" -gt 0 ]; do
  case "$1" in
    --allow | --cloud | --cloud-of)
      [ "$#" -ge 2 ] || { echo "gpufleet-imds-root-only: $1 needs a value ($usage)" >&2; exit 2; }
      case "$1" in
        --allow) allowed+=("$2") ;;
        --cloud) cloud="$2" ;;
        --cloud-of) cloud="$(jq -r '.cloud // "none"' -- "$2" 2>/dev/null)" || cloud="unreadable $2" ;;
      esac
      shift 2
      ;;
    -*)
      echo "gpufleet-imds-root-only: unknown option $1 ($usage)" >&2
      exit 2
      ;;
    *) break ;;
  esac
done
case "$cloud" in
  aws) ipv4="${1:-169.254.169.254}" ipv6="${2:-fd00:ec2::254}" ;;
  azure) ipv4="${1:-169.254.169.254}" ipv6="${2:-}" ;;
  tencent) ipv4="${1:-169.254.0.23}" ipv6="${2:-}" ;;
  *) echo "gpufleet-imds-root-only: cloud $cloud: expected aws, azure or tencent" >&2; exit 2 ;;
esac

# rule TOOL ADDRESS USER OPERATION...: TOOL's OPERATION (-C OUTPUT, -D OUTPUT or -I OUTPUT 1) on the rule that ACCEPTs
# USER's packets to ADDRESS's port 80, or, USER empty, on the rule that REJECTs everyone's.
rule() {
  local tool="$1" address="$2" user="$3"
  shift 3
  if [ -n "$user" ]; then
    "$tool" -w "$@" -d "$address" -p tcp --dport 80 -m owner --uid-owner "$user" -j ACCEPT
  else
    "$tool" -w "$@" -d "$address" -p tcp --dport 80 -j REJECT --reject-with tcp-reset
  fi
}

# root_only TOOL ADDRESS: TOOL's OUTPUT chain lets only the allowed users reach ADDRESS's port 80.
root_only() {
  local tool="$1" address="$2" user present=yes i
  local users=("${allowed[@]}" "")  # "": the REJECT, after every ACCEPT
  for user in "${users[@]}"; do
    rule "$tool" "$address" "$user" -C OUTPUT 2>/dev/null || present=no
  done
  if [ "$present" = yes ]; then
    echo "gpufleet-imds-root-only: $tool: $address already answers only ${allowed[*]}"
    return 0
  fi
  for user in "${users[@]}"; do  # a partial set (an interrupted run) goes, so the order below holds
    while rule "$tool" "$address" "$user" -D OUTPUT 2>/dev/null; do :; done
  done
  for ((i = ${#users[@]} - 1; i >= 0; i--)); do  # each at the top, the REJECT first: the ACCEPTs end above it
    rule "$tool" "$address" "${users[i]}" -I OUTPUT 1
  done
  echo "gpufleet-imds-root-only: $tool: $address answers only ${allowed[*]}"
}

root_only iptables "$ipv4"
if [ -z "$ipv6" ]; then
  echo "gpufleet-imds-root-only: the $cloud metadata service has no IPv6 address"
elif ip6tables -w -S OUTPUT >/dev/null 2>&1; then
  root_only ip6tables "$ipv6"
else
  echo "gpufleet-imds-root-only: ip6tables does not work here (no IPv6): $ipv6 left as it is"
fi
