#!/usr/bin/env bash
# Base packages and, on AWS and Tencent Cloud, the latest updates (the build reboots afterwards; 01-kernel-hold.sh
# pins that kernel). The Azure HPC image keeps its kernel: its drivers and OFED are built for it.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

apt-get update -q
if [ "$GPUFLEET_CLOUD" != azure ]; then
  apt-get -y -q -o Dpkg::Options::=--force-confold dist-upgrade
fi
# iptables: gpufleet-imds-root-only (the metadata service answers only root on nodes). sudo: jobs
# start their containers through the root launcher gpufleet-container by its sudoers rule (50-trainer.sh).
apt_install jq curl ca-certificates gnupg build-essential dkms pciutils mdadm nvme-cli xfsprogs python3-venv iptables \
  sudo

[ "$(manifest .ubuntu.codename)" = "$(. /etc/os-release && echo "$VERSION_CODENAME")" ] ||
  die "base image is not Ubuntu $(manifest .ubuntu.release)"
