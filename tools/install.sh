#!/usr/bin/env bash
# make tools: install the programs the tests and the demo run, skipping every one already present.
#   Debian packages (apt-get, as root): packer (validate only; bakes need HashiCorp's >= 1.10), shellcheck,
#   cloud-init, jq, curl, systemd (systemd-analyze), docker.io, Slurm 22.05 (slurmctld, slurmd, slurm-client),
#   munge, slurmdbd and mariadb-server (Slurm accounting), iptables and iproute2 (the image's metadata filter, run
#   in a network namespace of its own), npm, python3-venv where /usr/bin/python3 lacks ensurepip (make venv uses it);
#   Azurite from npm into node_modules/.
# Each is looked for by the program the tests run: dockerd, not the docker CLI some machines ship without it.
# apt-get waits (up to 10 minutes) for another apt-get or dpkg to finish. While it installs, a policy-rc.d keeps
# the packages from starting their daemons (the tests start their own), unless the machine already has one.
# Nothing missing: prints nothing, exits 0. Cannot install: one line on stderr, exit 2.
# Uses bash builtins only until it installs, so it runs (and says why it cannot) on a bare PATH too.
set -euo pipefail
cd "${BASH_SOURCE[0]%/*}/.."

# program that shows the package is present : Debian package that installs it
DEBIAN=(packer:packer shellcheck:shellcheck cloud-init:cloud-init jq:jq curl:curl
        systemd-analyze:systemd dockerd:docker.io slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client
        munged:munge slurmdbd:slurmdbd mariadbd:mariadb-server iptables:iptables ip:iproute2 visudo:sudo npm:npm)
AZURITE=node_modules/.bin/azurite
LOG="${TMPDIR:-/tmp}/gpufleet-tools.log"
POLICY_RC=/usr/sbin/policy-rc.d   # asked by invoke-rc.d and deb-systemd-invoke before a start; 101: do not
LOCK_WAIT=600                     # seconds to wait for another apt-get or dpkg

fail() {
  echo "make tools: $*" >&2
  exit 2
}

# apt-get "$@", its output appended to $LOG. A lock held by another apt-get or dpkg is waited for:
# DPkg::Lock::Timeout covers dpkg's lock only, not the lists lock of apt-get update.
apt_get() {
  local deadline=$((SECONDS + LOCK_WAIT)) out status
  while :; do
    status=0
    out=$(LC_ALL=C DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=$LOCK_WAIT "$@" 2>&1) || status=$?
    printf '%s' "${out:+$out$'\n'}" >>"$LOG"
    [ "$status" -ne 0 ] || return 0
    [[ $out == *"Could not get lock"* ]] && [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 1
  done
}

packages=()
for entry in "${DEBIAN[@]}"; do
  command -v "${entry%%:*}" >/dev/null || packages+=("${entry#*:}")
done
# make venv makes .venv from the system's Python where there is one (the box's team users must run it); its venv
# module needs ensurepip, which Debian ships apart.
if [ -x /usr/bin/python3 ] && ! /usr/bin/python3 -c 'import ensurepip' 2>/dev/null; then
  packages+=(python3-venv)
fi

if [ ${#packages[@]} -gt 0 ]; then
  [ "$EUID" -eq 0 ] || fail "cannot install ${packages[*]}: not root (run it as root, or install these Debian packages)"
  command -v apt-get >/dev/null || fail "cannot install ${packages[*]}: no apt-get (install these Debian packages)"
  echo "make tools: installing ${packages[*]} (log: $LOG)"
  : >"$LOG"
  # Created only where none exists (set -C), so only ours is removed afterwards, on every way out.
  if (set -C; printf '#!/bin/sh\n# tools/install.sh: no daemon starts while it installs\nexit 101\n' >"$POLICY_RC") \
      2>/dev/null; then
    trap 'rm -f "$POLICY_RC"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    chmod 755 "$POLICY_RC" || fail "cannot make $POLICY_RC executable"
  fi
  { apt_get update -qq && apt_get install -y -qq --no-install-recommends "${packages[@]}"; } \
    || fail "apt-get could not install ${packages[*]} (see $LOG)"
fi

if [ ! -x "$AZURITE" ]; then
  echo "make tools: installing Azurite into node_modules (log: $LOG)"
  npm install --no-audit --no-fund >"$LOG" 2>&1 || fail "npm could not install Azurite (see $LOG)"
  [ -x "$AZURITE" ] || fail "npm install did not provide $AZURITE (see $LOG)"
fi
