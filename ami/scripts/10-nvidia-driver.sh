#!/usr/bin/env bash
# NVIDIA data-center driver from NVIDIA's CUDA apt repository, pinned and held: the open kernel module, or on
# Tencent Cloud the proprietary one of the same version (tencent_base.kernel_module: V100 is Volta).
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if ships_with_base nvidia_driver; then
  log "nvidia driver: provided by the Azure HPC base image ($(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || echo unknown))"
  exit 0
fi

version="$(manifest .nvidia_driver.version)"
branch="$(manifest .nvidia_driver.branch)"
[ "$(manifest .nvidia_driver.kernel_module)" = open ] || die "only the open kernel module is supported"
flavor="-open"
if [ "$GPUFLEET_CLOUD" = tencent ] && [ "$(manifest .tencent_base.kernel_module)" = proprietary ]; then
  flavor=""
fi

# NVIDIA's CUDA repository (driver, fabric manager, CUDA, NCCL, DCGM, container toolkit come from it).
if ! dpkg-query -W -f '${Status}' cuda-keyring 2>/dev/null | grep -q 'ok installed'; then
  fetch_component cuda.keyring /tmp/cuda-keyring.deb
  dpkg -i /tmp/cuda-keyring.deb
  rm -f /tmp/cuda-keyring.deb
fi
apt_pin nvidia-driver "$(manifest .nvidia_driver.apt_pin)" "*-$branch *-$branch-open"
apt-get update -q

# Blacklist nouveau before the NVIDIA module is built and loaded.
printf 'blacklist nouveau\noptions nouveau modeset=0\n' >/etc/modprobe.d/gpufleet-nouveau.conf

apt_install "nvidia-driver-$branch$flavor" "nvidia-utils-$branch" "libnvidia-compute-$branch"
mapfile -t driver_pkgs < <(dpkg-query -W -f '${Package}\n' "*-$branch" "*-$branch-open" 2>/dev/null)
hold "${driver_pkgs[@]}"

installed="$(dpkg-query -W -f '${Version}' "nvidia-driver-$branch$flavor")"
[[ "$installed" == "$version"-* ]] || die "nvidia-driver-$branch$flavor is $installed, the manifest pins $version"

systemctl enable nvidia-persistenced.service
update-initramfs -u
log "nvidia driver $installed (${flavor:+open }${flavor:-proprietary }kernel module) installed and held"
