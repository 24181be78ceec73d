#!/usr/bin/env bash
# NVIDIA DCGM (GPU diagnostics with dcgmi; GPU metrics), pinned, with its host engine enabled.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if ships_with_base dcgm; then
  log "dcgm: provided by the Azure HPC base image"
else
  package="$(manifest .dcgm.package)"
  apt_pin dcgm "$(manifest .dcgm.apt_pin)" "$package"
  apt_install "$package"
  hold "$package"
fi
systemctl enable nvidia-dcgm.service
log "dcgm $(dcgmi --version | awk '/[Vv]ersion/ {print $NF; exit}') enabled"
