#!/usr/bin/env bash
# NCCL from NVIDIA's repository, pinned to the manifest version built for the installed CUDA.
set -euo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"

if ships_with_base nccl; then
  log "nccl: provided by the Azure HPC base image"
  exit 0
fi
pin="$(manifest .nccl.apt_pin)"
apt_pin nccl "$pin" "libnccl2 libnccl-dev"
apt_install libnccl2 libnccl-dev
hold libnccl2 libnccl-dev
[ "$(dpkg-query -W -f '${Version}' libnccl2)" = "$pin" ] || die "libnccl2 is not $pin"
log "nccl $pin installed"
