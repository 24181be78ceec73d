#!/usr/bin/env bash
# NVIDIA Fabric Manager (same version as the driver), needed by NVSwitch systems (p4d, p5, ND A100/H100).
# The image serves every instance type, so the service only runs where an NVSwitch bridge is present.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if ships_with_base fabric_manager; then
  log "fabric manager: provided by the Azure HPC base image"
else
  branch="$(manifest .nvidia_driver.branch)"
  version="$(manifest .fabric_manager.version)"
  [ "$version" = "$(manifest .nvidia_driver.version)" ] || die "fabric manager $version differs from the driver"
  apt_pin fabric-manager "$(manifest .fabric_manager.apt_pin)" "nvidia-fabricmanager-$branch libnvidia-nscq-$branch"
  apt_install "nvidia-fabricmanager-$branch" "libnvidia-nscq-$branch"
  hold "nvidia-fabricmanager-$branch" "libnvidia-nscq-$branch"
  installed="$(dpkg-query -W -f '${Version}' "nvidia-fabricmanager-$branch")"
  [[ "$installed" == "$version"-* ]] || die "nvidia-fabricmanager-$branch is $installed, the manifest pins $version"
fi

# NVSwitch devices are PCI class 0680 from vendor 10de; elsewhere the service is skipped, not failed.
install -d /etc/systemd/system/nvidia-fabricmanager.service.d
cat >/etc/systemd/system/nvidia-fabricmanager.service.d/gpufleet.conf <<'UNIT'
[Service]
ExecCondition=/bin/sh -c 'lspci -n -d 10de::0680 | grep -q .'
UNIT
systemctl daemon-reload
systemctl enable nvidia-fabricmanager.service
log "fabric manager enabled (runs on NVSwitch systems only)"
