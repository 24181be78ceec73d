#!/usr/bin/env bash
# On a GPU node of a cloud whose network filters no DNS (Tencent Cloud), every DNS packet (port 53, UDP and TCP) of
# every user but root and the DNS guard's own goes to the guard on 127.0.0.1 (trainer.node.dnsguard,
# gpufleet-dns-guard.service), whatever address it was sent to: the guard forwards only the cloud's service names
# to the VPC's resolvers and answers every other name NXDOMAIN, so a job cannot carry data out in DNS queries.
# Jobs run as their teams' users, never root; systemd-resolved's own queries (its user is not exempt) pass the
# guard too. Containers run with --network host as the caller's uid: their packets are redirected the same way.
# The rules live in a chain of the nat table, GPUFLEET-DNS, which OUTPUT jumps to for port 53; a run rewrites the
# chain whole and adds each jump once, so a second run changes nothing. IPv4 only: the Tencent VPCs the stack makes
# have no IPv6.
# Run at boot by gpufleet-dns-rules.service, before slurmd and docker.
# Usage: gpufleet-dns-guard-rules [--guard-user USER] [--port PORT]
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

usage="usage: [--guard-user USER] [--port PORT]"
guard_user=gpufleet-dns-guard
port=5353
while [ "$#" -gt 0 ]; do
  case "$1" in
    --guard-user | --port)
      [ "$#" -ge 2 ] || { echo "gpufleet-dns-guard-rules: $1 needs a value ($usage)" >&2; exit 2; }
      case "$1" in
        --guard-user) guard_user="$2" ;;
        --port) port="$2" ;;
      esac
      shift 2
      ;;
    *)
      echo "gpufleet-dns-guard-rules: unexpected $1 ($usage)" >&2
      exit 2
      ;;
  esac
done
case "$port" in
  '' | *[!0-9]*) echo "gpufleet-dns-guard-rules: --port $port: expected a port number" >&2; exit 2 ;;
esac

chain=GPUFLEET-DNS
iptables -w -t nat -N "$chain" 2>/dev/null || true
iptables -w -t nat -F "$chain"
iptables -w -t nat -A "$chain" -m owner --uid-owner 0 -j RETURN
iptables -w -t nat -A "$chain" -m owner --uid-owner "$guard_user" -j RETURN
for proto in udp tcp; do
  iptables -w -t nat -A "$chain" -p "$proto" -j REDIRECT --to-ports "$port"
done
for proto in udp tcp; do
  iptables -w -t nat -C OUTPUT -p "$proto" --dport 53 -j "$chain" 2>/dev/null ||
    iptables -w -t nat -I OUTPUT 1 -p "$proto" --dport 53 -j "$chain"
done
echo "gpufleet-dns-guard-rules: DNS of every user but root and $guard_user goes to 127.0.0.1:$port"
